"""HTTP for the delivery history: `GET /api/v1/notifications/{id}/attempts`."""

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from delivery.models import Outcome
from delivery.repositories import notification_attempts
from notifyqueue.errors import NotFound


class AttemptSerializer(serializers.Serializer):
    number = serializers.IntegerField(help_text="1 for the first attempt on this channel.")
    channel = serializers.CharField()
    worker = serializers.CharField(help_text="The worker that made the attempt.")
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.ChoiceField(
        choices=Outcome.choices,
        allow_null=True,
        help_text="null while the attempt is in flight. ABANDONED: the worker's claim expired; "
        "RELEASED: given back unstarted at shutdown; RATE_LIMITED: deferred, not tried; "
        "REROUTED / SUPPRESSED: not tried because the user's preferences changed (moved to a "
        "fallback channel / no allowed channel left).",
    )
    error = serializers.CharField(allow_null=True)
    provider_message_id = serializers.CharField(allow_null=True)


class NotificationAttemptsView(APIView):
    @extend_schema(
        operation_id="notification_attempts",
        summary="Every delivery attempt of a notification, oldest first",
        responses={200: AttemptSerializer(many=True)},
        examples=[
            OpenApiExample(
                "Sent on the second attempt",
                response_only=True,
                value=[
                    {
                        "number": 1,
                        "channel": "email",
                        "worker": "host-a:4121:9f2c1e",
                        "started_at": "2026-12-01T12:00:00.012Z",
                        "finished_at": "2026-12-01T12:00:00.250Z",
                        "outcome": "TEMPORARY_FAILURE",
                        "error": "provider answered 503: busy",
                        "provider_message_id": None,
                    },
                    {
                        "number": 2,
                        "channel": "email",
                        "worker": "host-b:733:04ab9d",
                        "started_at": "2026-12-01T12:00:01.020Z",
                        "finished_at": "2026-12-01T12:00:01.130Z",
                        "outcome": "SENT",
                        "error": None,
                        "provider_message_id": "msg-5521",
                    },
                ],
            )
        ],
    )
    def get(self, request, notification_id):
        client = request.user
        attempts = notification_attempts(
            notification_id=notification_id,
            client_id=None if client.is_operator else client.id,
        )
        if attempts is None:
            raise NotFound("No such notification.")
        return Response(AttemptSerializer(attempts, many=True).data)
