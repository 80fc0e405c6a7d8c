"""The suppressions API's shapes. An address is checked like a create's recipient."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from notifyqueue.serializers import CURSOR_MAX_LENGTH, RejectUnknownFieldsMixin, TextField
from notifyqueue.vocabulary import RECIPIENT_MAX_LENGTH, Channel, recipient_problem
from suppressions.models import Reason

PAGE_SIZE_DEFAULT = 50
PAGE_SIZE_MAX = 500


class SuppressionBody(RejectUnknownFieldsMixin, serializers.Serializer):
    channel = serializers.ChoiceField(choices=Channel.values)
    address = TextField(
        max_length=RECIPIENT_MAX_LENGTH,
        help_text="As a create's recipient; stored in its counting form (email: case, NFKC, "
        "IDNA domain).",
    )
    client_id = serializers.UUIDField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Suppress for this client only; absent or null: for every client.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        problem = recipient_problem(attrs["channel"], attrs["address"])
        if problem:
            raise serializers.ValidationError({"address": [problem]})
        return attrs


class SuppressionQuery(RejectUnknownFieldsMixin, serializers.Serializer):
    channel = serializers.ChoiceField(choices=Channel.values, required=False)
    cursor = serializers.CharField(
        required=False, max_length=CURSOR_MAX_LENGTH, help_text="From `next`."
    )
    page_size = serializers.IntegerField(
        required=False, min_value=1, max_value=PAGE_SIZE_MAX, default=PAGE_SIZE_DEFAULT
    )


class SuppressionOutput(serializers.Serializer):
    id = serializers.UUIDField()
    channel = serializers.CharField()
    address = serializers.CharField(help_text="The address's counting form.")
    client_id = serializers.UUIDField(allow_null=True, help_text="null: every client.")
    reason = serializers.ChoiceField(choices=Reason.choices)
    source = serializers.CharField()
    created_at = serializers.DateTimeField()


class SuppressionPageOutput(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    results = SuppressionOutput(many=True)
