"""HTTP for a user's preferences and in-app inbox (both under /api/v1/users/{user_id}/).

The inbox lives here rather than in `delivery` because clients address it by user, like the
preferences; its table is this app's (preferences.models.InboxMessage), and the delivery
worker writes its rows.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from notifyqueue.errors import InvalidRequest, error_body
from notifyqueue.serializers import ErrorOutput
from notifyqueue.vocabulary import USER_ID_MAX_LENGTH
from preferences import inbox, services
from preferences.serializers import (
    InboxMessageOutput,
    InboxPageOutput,
    InboxQuery,
    PreferencesBody,
    PreferencesOutput,
)

USER_ID = OpenApiParameter(
    "user_id",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="Your id for the user (1-255 characters); the in_app channel's address.",
)
MESSAGE_ID = OpenApiParameter(
    "message_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="An inbox message."
)
UNAUTHENTICATED = OpenApiResponse(ErrorOutput, description="Missing or wrong API key.")
EXAMPLE_PREFERENCES = {
    "channels": ["push", "email", "in_app"],
    "addresses": {"push": "fcm-token-8f2a91c3", "email": "ada@example.com"},
    "muted_events": ["newsletter"],
    "disabled_channels": ["sms"],
    "timezone": "Europe/Berlin",
    "quiet_hours": [
        {"start": "22:00", "end": "07:30"},
        {"start": "12:00", "end": "13:00", "channels": ["push"]},
    ],
}
EXAMPLE_MESSAGE = {
    "id": "5b1f0a9e-3c2d-4e8f-9a7b-6c5d4e3f2a10",
    "notification_id": "3f6c2b0e-8d1a-4c57-9a51-0c4f1d7e2b90",
    "subject": "Order A-17 has shipped",
    "body": "Hi Ada, your order A-17 is on its way.",
    "metadata": {"order": "A-17"},
    "created_at": "2026-12-01T12:00:00.250Z",
    "read": False,
    "read_at": None,
}


def _user_id(raw: str) -> str:
    if not 1 <= len(raw) <= USER_ID_MAX_LENGTH:
        message = f"1 to {USER_ID_MAX_LENGTH} characters."
        raise InvalidRequest(f"user_id: {message}", fields={"user_id": [message]})
    return raw


class PreferencesView(APIView):
    @extend_schema(
        operation_id="preferences_get",
        summary="Read a user's preferences",
        parameters=[USER_ID],
        responses={
            200: PreferencesOutput,
            401: UNAUTHENTICATED,
            404: OpenApiResponse(ErrorOutput, description="No preferences for this user."),
        },
        examples=[
            OpenApiExample(
                "Found",
                value={
                    "user_id": "u-1",
                    **EXAMPLE_PREFERENCES,
                    "created_at": "2026-11-30T09:15:02.114Z",
                    "updated_at": "2026-11-30T09:15:02.114Z",
                },
                response_only=True,
                status_codes=[200],
            )
        ],
    )
    def get(self, request: Request, user_id: str) -> Response:
        found = services.preferences_get(client_id=request.user.id, user_id=_user_id(user_id))
        return Response(PreferencesOutput(found).data)

    @extend_schema(
        operation_id="preferences_put",
        summary="Replace a user's preferences",
        description=(
            "`channels` is the user's order: a create in preference mode goes out on the first "
            "channel that is not disabled, has an address and has a template for the event, "
            "and falls back to the next ones in this order. Changes also apply to "
            "notifications already waiting: each is re-checked just before it is sent.\n\n"
            "`quiet_hours` are windows of the user's local wall-clock time in `timezone` (an "
            "IANA name; default UTC): a notification for this user (preference mode) that "
            "falls due inside a window stays PENDING with `held_reason` `quiet_hours` and "
            "`held_until` the window's end, read in the user's zone on that day (a daylight-"
            "saving change included: a window ending at a time the clocks skip ends when they "
            "skip it). CRITICAL notifications, and those sent to a direct recipient, ignore "
            "quiet hours. A new time zone or new windows apply at once to what is held: a "
            "notification whose window was removed goes now."
        ),
        parameters=[USER_ID],
        request=PreferencesBody,
        responses={
            200: OpenApiResponse(PreferencesOutput, description="Replaced."),
            201: OpenApiResponse(PreferencesOutput, description="Created."),
            400: OpenApiResponse(ErrorOutput, description="Invalid; nothing was saved."),
            401: UNAUTHENTICATED,
        },
        examples=[
            OpenApiExample("Push, then email", value=EXAMPLE_PREFERENCES, request_only=True),
            OpenApiExample(
                "Bad address",
                value=error_body(
                    "invalid_request",
                    "addresses: email: Not a valid email address.",
                    {"addresses": {"email": ["Not a valid email address."]}},
                ),
                response_only=True,
                status_codes=[400],
            ),
            OpenApiExample(
                "A window that starts where it ends",
                value=error_body(
                    "invalid_request",
                    "quiet_hours: 0: end: Must differ from start.",
                    {"quiet_hours": {"0": {"end": ["Must differ from start."]}}},
                ),
                response_only=True,
                status_codes=[400],
            ),
            OpenApiExample(
                "Unknown time zone",
                value=error_body(
                    "invalid_request",
                    "timezone: Not a time zone PostgreSQL knows: an IANA name such as "
                    "Europe/Berlin.",
                    {
                        "timezone": [
                            "Not a time zone PostgreSQL knows: an IANA name such as Europe/Berlin."
                        ]
                    },
                ),
                response_only=True,
                status_codes=[400],
            ),
        ],
    )
    def put(self, request: Request, user_id: str) -> Response:
        body = PreferencesBody(data=request.data)
        body.is_valid(raise_exception=True)
        saved = services.preferences_put(
            client_id=request.user.id,
            user_id=_user_id(user_id),
            preferences=body.to_input(),
            now=timezone.now(),
        )
        return Response(
            PreferencesOutput(saved.preferences).data,
            status=status.HTTP_201_CREATED if saved.created else status.HTTP_200_OK,
        )


class InboxView(APIView):
    @extend_schema(
        operation_id="inbox_list",
        summary="A user's in-app messages, newest first",
        description="Follow `next` for older messages. `unread=true` lists unread ones only.",
        parameters=[USER_ID, InboxQuery],
        responses={200: InboxPageOutput, 400: ErrorOutput, 401: UNAUTHENTICATED},
        examples=[
            OpenApiExample(
                "A page",
                value={
                    "next": "http://127.0.0.1:8000/api/v1/users/u-1/inbox?cursor=eyJ0Ijoi...",
                    "results": [EXAMPLE_MESSAGE],
                },
                response_only=True,
                status_codes=[200],
            )
        ],
    )
    def get(self, request: Request, user_id: str) -> Response:
        query = InboxQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        page = inbox.inbox_list(
            client_id=request.user.id,
            user_id=_user_id(user_id),
            unread_only=query.validated_data["unread"],
            cursor=query.validated_data.get("cursor"),
            page_size=query.validated_data["page_size"],
        )
        url = request.build_absolute_uri()
        body = {
            "next": page.next_cursor and replace_query_param(url, "cursor", page.next_cursor),
            "results": page.messages,
        }
        return Response(InboxPageOutput(body).data)


class InboxReadView(APIView):
    @extend_schema(
        operation_id="inbox_message_read",
        summary="Mark an in-app message read",
        description="Idempotent: marking it again keeps the time it was first read.",
        parameters=[USER_ID, MESSAGE_ID],
        request=None,
        responses={
            200: InboxMessageOutput,
            401: UNAUTHENTICATED,
            404: OpenApiResponse(ErrorOutput, description="No such message for this user."),
        },
        examples=[
            OpenApiExample(
                "Read",
                value={**EXAMPLE_MESSAGE, "read": True, "read_at": "2026-12-01T12:05:00Z"},
                response_only=True,
                status_codes=[200],
            )
        ],
    )
    def post(self, request: Request, user_id: str, message_id: str) -> Response:
        read = inbox.inbox_message_read(
            client_id=request.user.id,
            user_id=_user_id(user_id),
            message_id=message_id,
            now=timezone.now(),
        )
        return Response(InboxMessageOutput(read).data)
