"""HTTP for delivery receipts: `POST /api/v1/providers/{channel}/events` (a provider, signed
with its channel's secret, no API key) and `GET /api/v1/notifications/{id}/receipts` (the
notification's owner)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, parsers, serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from delivery.providers.http import MESSAGE_ID_MAX_CHARS
from delivery.receipts import services
from delivery.receipts.models import Bounce, ReceiptType
from notifyqueue.errors import NotFound, error_body
from notifyqueue.parsers import PayloadTooLarge, json_document_check
from notifyqueue.serializers import ErrorOutput, RejectUnknownFieldsMixin

# A receipt is a few hundred bytes; anything much larger is refused before it is read whole.
RECEIPT_BODY_MAX_BYTES = 16 * 1024
TIMESTAMP_MAX_CHARS = 64


class SignedBodyParser(parsers.BaseParser):
    """Hands the view the body's bytes, at most RECEIPT_BODY_MAX_BYTES (413 past that): the
    signature covers them exactly as sent."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None) -> bytes:
        raw = stream.read(RECEIPT_BODY_MAX_BYTES + 1) if stream is not None else b""
        if len(raw) > RECEIPT_BODY_MAX_BYTES:
            raise PayloadTooLarge(limit=RECEIPT_BODY_MAX_BYTES)
        return raw


class ReceiptBody(RejectUnknownFieldsMixin, serializers.Serializer):
    message_id = serializers.CharField(
        max_length=MESSAGE_ID_MAX_CHARS,
        trim_whitespace=False,
        help_text="The id your API answered when it accepted the message.",
    )
    type = serializers.ChoiceField(choices=ReceiptType.choices)
    bounce = serializers.ChoiceField(
        choices=Bounce.choices,
        required=False,
        allow_null=True,
        default=None,
        help_text="With `bounced` only: `hard` (the address does not exist) or `soft`.",
    )
    timestamp = serializers.CharField(
        max_length=TIMESTAMP_MAX_CHARS, help_text="When the event happened (RFC 3339)."
    )

    def validate_message_id(self, value: str) -> str:
        if not value.isprintable():
            raise serializers.ValidationError("Printable characters only.")
        return value

    def validate_timestamp(self, value: str) -> datetime:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                raise ValueError("no offset")
            return moment.astimezone(UTC)
        except (ValueError, OverflowError) as exc:
            raise serializers.ValidationError("An RFC 3339 time with an offset.") from exc

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if attrs["bounce"] is not None and attrs["type"] != ReceiptType.BOUNCED:
            raise serializers.ValidationError({"bounce": ["Only with type bounced."]})
        return attrs


class ReceiptRecordedOutput(serializers.Serializer):
    result = serializers.ChoiceField(
        choices=["applied", "pending", "duplicate"],
        help_text="applied: matched to its message now; pending: kept until the message's "
        "send is recorded; duplicate: this receipt was recorded before, nothing changed.",
    )


CHANNEL = OpenApiParameter(
    "channel",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    enum=["email", "sms", "push"],
    description="The provider's channel; its secret signs the event.",
)


class ProviderEventsView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []
    parser_classes = [SignedBodyParser]

    @extend_schema(
        operation_id="provider_events",
        summary="A provider's delivery receipt (signed; no API key)",
        description=(
            "Signed per Standard Webhooks with `NOTIFYQUEUE_<CHANNEL>_PROVIDER_EVENTS_SECRET`: "
            "`webhook-signature` is `v1,<base64 HMAC-SHA256 of id.timestamp.body>`. A "
            "forged or stale (more than NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS from the "
            "server's clock) event is a 401, a replayed `webhook-id` a 409; neither changes "
            "anything. Without a secret for the channel this endpoint answers 404. Bodies "
            f"over {RECEIPT_BODY_MAX_BYTES} bytes are a 413."
        ),
        auth=[],
        parameters=[
            CHANNEL,
            OpenApiParameter("webhook-id", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("webhook-timestamp", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("webhook-signature", str, OpenApiParameter.HEADER, required=True),
        ],
        request=ReceiptBody,
        responses={
            200: ReceiptRecordedOutput,
            400: ErrorOutput,
            401: OpenApiResponse(ErrorOutput, description="Forged, unsigned or stale."),
            404: OpenApiResponse(ErrorOutput, description="No receipts for this channel."),
            409: OpenApiResponse(ErrorOutput, description="This event id was seen before."),
            413: ErrorOutput,
        },
        examples=[
            OpenApiExample(
                "A hard bounce",
                value={
                    "message_id": "msg-5521",
                    "type": "bounced",
                    "bounce": "hard",
                    "timestamp": "2026-12-01T12:03:10Z",
                },
                request_only=True,
            ),
            OpenApiExample(
                "Applied", value={"result": "applied"}, response_only=True, status_codes=[200]
            ),
            OpenApiExample(
                "Replayed",
                value=error_body("replayed_event", "This event id was accepted before."),
                response_only=True,
                status_codes=[409],
            ),
        ],
    )
    def post(self, request: Request, channel: str) -> Response:
        provider = settings.NOTIFYQUEUE_PROVIDERS.get(channel)
        secrets = provider.get("events_secrets") if provider else None
        if not secrets:
            raise NotFound("No receipts are taken on this channel.")
        body = request.data
        event_id = services.provider_event_verify(
            secrets=secrets,
            headers={
                name: request.headers.get(name, "")
                for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
            },
            body=body,
            now=datetime.now(UTC),
            tolerance_s=settings.NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS,
        )
        document = _json(body)
        receipt = ReceiptBody(data=document)
        receipt.is_valid(raise_exception=True)
        fields = receipt.validated_data
        recorded = services.receipt_record(
            channel=channel,
            event_id=event_id,
            message_id=fields["message_id"],
            type=fields["type"],
            bounce=fields["bounce"],
            occurred_at=fields["timestamp"],
        )
        return Response(ReceiptRecordedOutput(recorded).data)


def _json(body: bytes) -> Any:
    try:
        document = json.loads(body.decode("utf-8"))
    except RecursionError as exc:
        raise exceptions.ParseError("JSON nests too deeply.") from exc
    except ValueError as exc:
        raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
    json_document_check(document)
    if not isinstance(document, dict):
        raise exceptions.ParseError("The body must be a JSON object.")
    return document


class ReceiptOutput(serializers.Serializer):
    type = serializers.ChoiceField(choices=ReceiptType.choices)
    bounce = serializers.ChoiceField(choices=Bounce.choices, allow_null=True)
    message_id = serializers.CharField(help_text="The provider's message id.")
    channel = serializers.CharField()
    occurred_at = serializers.DateTimeField(help_text="The provider's time of the event.")
    received_at = serializers.DateTimeField()


class NotificationReceiptsView(APIView):
    @extend_schema(
        operation_id="notification_receipts",
        summary="A notification's delivery receipts, oldest first",
        description=(
            "What the provider reported after accepting the message: each type (and bounce "
            "kind) at most once. The notification's `receipt` is the latest type, except that "
            "a bounce or a complaint is never overwritten."
        ),
        responses={200: ReceiptOutput(many=True), 404: ErrorOutput},
        examples=[
            OpenApiExample(
                "Delivered, then a complaint",
                response_only=True,
                value=[
                    {
                        "type": "delivered",
                        "bounce": None,
                        "message_id": "msg-5521",
                        "channel": "email",
                        "occurred_at": "2026-12-01T12:00:02Z",
                        "received_at": "2026-12-01T12:00:03.120Z",
                    },
                    {
                        "type": "complained",
                        "bounce": None,
                        "message_id": "msg-5521",
                        "channel": "email",
                        "occurred_at": "2026-12-01T15:41:00Z",
                        "received_at": "2026-12-01T15:41:01.007Z",
                    },
                ],
            )
        ],
    )
    def get(self, request: Request, notification_id) -> Response:
        client = request.user
        client_id = None if client.is_operator else client.id
        receipts = services.notification_receipts(
            notification_id=notification_id, client_id=client_id
        )
        if receipts is None:
            raise NotFound("No such notification.")
        return Response(ReceiptOutput(receipts, many=True).data)
