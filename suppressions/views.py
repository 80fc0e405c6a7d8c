"""HTTP for the suppression list: `GET/POST /api/v1/suppressions`,
`DELETE /api/v1/suppressions/{id}` (operators only)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from clients.permissions import IsOperator
from notifyqueue.serializers import ErrorOutput
from suppressions import services
from suppressions.models import Reason
from suppressions.serializers import (
    SuppressionBody,
    SuppressionOutput,
    SuppressionPageOutput,
    SuppressionQuery,
)

EXAMPLE_ENTRY = {
    "id": "0b7e8c52-94f1-4a4e-8b0e-5f1d2c3b4a59",
    "channel": "email",
    "address": "ada@example.com",
    "client_id": None,
    "reason": "hard_bounce",
    "source": "receipt msg-5521",
    "created_at": "2026-12-01T12:03:10.114Z",
}
FORBIDDEN = OpenApiResponse(ErrorOutput, description="Not an operator client.")


class SuppressionsView(APIView):
    permission_classes = [IsAuthenticated, IsOperator]

    @extend_schema(
        operation_id="suppressions_list",
        summary="The suppression list, newest first (operators)",
        description="Follow `next` for older entries.",
        parameters=[SuppressionQuery],
        responses={200: SuppressionPageOutput, 400: ErrorOutput, 403: FORBIDDEN},
        examples=[
            OpenApiExample(
                "A page",
                value={"next": None, "results": [EXAMPLE_ENTRY]},
                response_only=True,
                status_codes=[200],
            )
        ],
    )
    def get(self, request: Request) -> Response:
        query = SuppressionQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        page = services.suppressions_list(
            channel=query.validated_data.get("channel"),
            cursor=query.validated_data.get("cursor"),
            page_size=query.validated_data["page_size"],
        )
        url = request.build_absolute_uri()
        body = {
            "next": page.next_cursor and replace_query_param(url, "cursor", page.next_cursor),
            "results": page.entries,
        }
        return Response(SuppressionPageOutput(body).data)

    @extend_schema(
        operation_id="suppressions_add",
        summary="Suppress an address (operators)",
        description=(
            "Notifications to the address (in its counting form) on that channel end "
            "SUPPRESSED at send time, for the client named, or for every client. Adding an "
            "entry that exists answers it with 200."
        ),
        request=SuppressionBody,
        responses={
            201: OpenApiResponse(SuppressionOutput, description="Added."),
            200: OpenApiResponse(SuppressionOutput, description="Already there."),
            400: ErrorOutput,
            403: FORBIDDEN,
        },
        examples=[
            OpenApiExample(
                "For every client",
                value={"channel": "email", "address": "Ada@Example.com"},
                request_only=True,
            ),
            OpenApiExample(
                "Added",
                value={**EXAMPLE_ENTRY, "reason": "operator", "source": "operator ops"},
                response_only=True,
                status_codes=[201],
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        body = SuppressionBody(data=request.data)
        body.is_valid(raise_exception=True)
        entry, created = services.suppression_add(
            channel=body.validated_data["channel"],
            recipient=body.validated_data["address"],
            client_id=body.validated_data["client_id"],
            reason=Reason.OPERATOR,
            source=f"operator {request.user.name}",
        )
        return Response(
            SuppressionOutput(entry).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class SuppressionView(APIView):
    permission_classes = [IsAuthenticated, IsOperator]

    @extend_schema(
        operation_id="suppressions_remove",
        summary="Remove an entry (operators); the removal is logged",
        request=None,
        responses={
            200: OpenApiResponse(SuppressionOutput, description="Removed; what it was."),
            403: FORBIDDEN,
            404: OpenApiResponse(ErrorOutput, description="No such entry."),
        },
    )
    def delete(self, request: Request, suppression_id) -> Response:
        entry = services.suppression_remove(
            id=suppression_id, removed_by=f"operator {request.user.name}"
        )
        return Response(SuppressionOutput(entry).data)
