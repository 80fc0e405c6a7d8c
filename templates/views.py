"""HTTP for message templates: `PUT/GET /api/v1/templates/{event}/{channel}`."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifyqueue.errors import error_body
from notifyqueue.serializers import ErrorOutput
from notifyqueue.vocabulary import Channel
from templates import services
from templates.serializers import TemplateInput, TemplateOutput

EVENT = OpenApiParameter(
    "event",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="The event name a create's `template` refers to: 1-255 of A-Z a-z 0-9 _ . : -",
)
CHANNEL = OpenApiParameter(
    "channel", OpenApiTypes.STR, OpenApiParameter.PATH, enum=Channel.values, description="Channel."
)
EXAMPLE_TEMPLATE = {
    "event": "order_shipped",
    "channel": "email",
    "subject": "Order {order} has shipped",
    "body": "Hi {name}, your order {order} is on its way. Track it at {url}.",
    "placeholders": ["name", "order", "url"],
    "created_at": "2026-11-30T09:15:02.114Z",
    "updated_at": "2026-11-30T09:15:02.114Z",
}


class TemplateView(APIView):
    @extend_schema(
        operation_id="template_put",
        summary="Create or replace a template",
        description=(
            "One template per (event, channel) for your client. `{name}` is a slot filled "
            "from a create's `payload`; `{{` and `}}` are literal braces; any other brace is "
            "refused. Rendering is plain substitution: nothing in a template is evaluated."
        ),
        parameters=[EVENT, CHANNEL],
        request=TemplateInput,
        responses={
            200: OpenApiResponse(TemplateOutput, description="Replaced."),
            201: OpenApiResponse(TemplateOutput, description="Created."),
            400: OpenApiResponse(ErrorOutput, description="Invalid; nothing was saved."),
            401: OpenApiResponse(ErrorOutput, description="Missing or wrong API key."),
        },
        examples=[
            OpenApiExample(
                "An email template",
                value={"subject": EXAMPLE_TEMPLATE["subject"], "body": EXAMPLE_TEMPLATE["body"]},
                request_only=True,
            ),
            OpenApiExample(
                "Saved", value=EXAMPLE_TEMPLATE, response_only=True, status_codes=[200, 201]
            ),
            OpenApiExample(
                "A stray brace",
                value=error_body(
                    "invalid_template",
                    "body: The '{' at character 4 is not a placeholder.",
                    {"body": ["The '{' at character 4 is not a placeholder."]},
                ),
                response_only=True,
                status_codes=[400],
            ),
        ],
    )
    def put(self, request: Request, event: str, channel: str) -> Response:
        payload = TemplateInput(data=request.data)
        payload.is_valid(raise_exception=True)
        saved = services.template_put(
            client_id=request.user.id,
            event=event,
            channel=channel,
            subject=payload.validated_data.get("subject", ""),
            body=payload.validated_data["body"],
            now=timezone.now(),
        )
        return Response(
            TemplateOutput(saved.template).data,
            status=status.HTTP_201_CREATED if saved.created else status.HTTP_200_OK,
        )

    @extend_schema(
        operation_id="template_get",
        summary="Read a template",
        parameters=[EVENT, CHANNEL],
        responses={
            200: TemplateOutput,
            401: OpenApiResponse(ErrorOutput, description="Missing or wrong API key."),
            404: OpenApiResponse(ErrorOutput, description="No such template for your client."),
        },
        examples=[
            OpenApiExample("Found", value=EXAMPLE_TEMPLATE, response_only=True, status_codes=[200])
        ],
    )
    def get(self, request: Request, event: str, channel: str) -> Response:
        found = services.template_get(client_id=request.user.id, event=event, channel=channel)
        return Response(TemplateOutput(found).data)
