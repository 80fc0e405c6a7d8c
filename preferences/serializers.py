"""The preferences and inbox API's shapes. Addresses are checked like a create's recipients."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from notifyqueue.serializers import CURSOR_MAX_LENGTH, RejectUnknownFieldsMixin, TextField
from notifyqueue.vocabulary import RECIPIENT_MAX_LENGTH, Channel, recipient_problem
from preferences.inbox import INBOX_PAGE_SIZE_DEFAULT, INBOX_PAGE_SIZE_MAX
from preferences.models import TIMEZONE_MAX_LENGTH
from preferences.repositories import QuietWindow
from preferences.services import PreferencesInput
from templates.models import EVENT_MAX_LENGTH


def _unique(values: list[str], name: str) -> list[str]:
    if len(set(values)) != len(values):
        raise serializers.ValidationError(f"Each {name} at most once.")
    return values


# A user has at most this many quiet-hours windows (a night, a meal, a meeting or two).
QUIET_HOURS_MAX_WINDOWS = 5
# "HH:MM" on a 24-hour clock, 00:00 to 23:59.
_WALL_TIME = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]")


def _wall_time(value: str) -> str:
    if not _WALL_TIME.fullmatch(value):
        raise serializers.ValidationError('A local time "HH:MM", 00:00 to 23:59.')
    return value


class QuietWindowBody(serializers.Serializer):
    # Not trimmed: a time is exactly "HH:MM", with no space or line separator around it.
    start = TextField(
        max_length=5,
        trim_whitespace=False,
        validators=[_wall_time],
        help_text='Local time "HH:MM".',
    )
    end = TextField(
        max_length=5,
        trim_whitespace=False,
        validators=[_wall_time],
        help_text='Local time "HH:MM"; earlier than start: the window crosses midnight.',
    )
    channels = serializers.ListField(
        child=serializers.ChoiceField(choices=Channel.values),
        required=False,
        min_length=1,
        max_length=len(Channel.values),
        help_text="The channels it holds; left out: every channel.",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        # A window is a field of the body, so the body's unknown-field check does not see in it.
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)

    def validate_channels(self, value: list[str]) -> list[str]:
        return _unique(value, "channel")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["start"] == attrs["end"]:
            raise serializers.ValidationError({"end": ["Must differ from start."]})
        return attrs


class PreferencesBody(RejectUnknownFieldsMixin, serializers.Serializer):
    channels = serializers.ListField(
        child=serializers.ChoiceField(choices=Channel.values),
        max_length=len(Channel.values),
        help_text="In order of preference; later channels are the fallbacks.",
    )
    addresses = serializers.DictField(
        child=TextField(max_length=RECIPIENT_MAX_LENGTH),
        required=False,
        help_text="Address per channel, checked like a create's recipient. in_app needs none: "
        "its address is the user id.",
    )
    muted_events = serializers.ListField(
        child=TextField(max_length=EVENT_MAX_LENGTH),
        required=False,
        max_length=1000,
        help_text=f"At most 1000 event names of at most {EVENT_MAX_LENGTH} characters.",
    )
    disabled_channels = serializers.ListField(
        child=serializers.ChoiceField(choices=Channel.values),
        required=False,
        max_length=len(Channel.values),
    )

    timezone = TextField(
        max_length=TIMEZONE_MAX_LENGTH,
        trim_whitespace=False,
        required=False,
        default="UTC",
        help_text="The user's IANA time zone (as PostgreSQL's time zone database knows it), "
        "in which quiet hours are read. Default UTC.",
    )
    quiet_hours = serializers.ListField(
        child=QuietWindowBody(),
        required=False,
        max_length=QUIET_HOURS_MAX_WINDOWS,
        help_text=f"At most {QUIET_HOURS_MAX_WINDOWS} windows of local wall-clock time in "
        "which a notification for this user waits (CRITICAL ones do not); a window may cross "
        "midnight.",
    )

    def validate_channels(self, value: list[str]) -> list[str]:
        return _unique(value, "channel")

    def validate_muted_events(self, value: list[str]) -> list[str]:
        return _unique(value, "event")

    def validate_disabled_channels(self, value: list[str]) -> list[str]:
        return _unique(value, "channel")

    def validate_addresses(self, value: dict[str, str]) -> dict[str, str]:
        errors: dict[str, list[str]] = {}
        for channel, address in value.items():
            if channel not in Channel.values:
                errors[channel] = [f"Not a channel: one of {', '.join(Channel.values)}."]
            elif problem := recipient_problem(channel, address):
                errors[channel] = [problem]
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def to_input(self) -> PreferencesInput:
        data = self.validated_data
        return PreferencesInput(
            channels=data["channels"],
            addresses=data.get("addresses", {}),
            muted_events=data.get("muted_events", []),
            disabled_channels=data.get("disabled_channels", []),
            timezone=data["timezone"],
            quiet_hours=[
                QuietWindow(
                    start=window["start"],
                    end=window["end"],
                    channels=tuple(window["channels"]) if "channels" in window else None,
                )
                for window in data.get("quiet_hours", [])
            ],
        )


class QuietWindowOutput(serializers.Serializer):
    start = serializers.CharField()
    end = serializers.CharField()
    channels = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="Absent: every channel."
    )

    def to_representation(self, instance: QuietWindow) -> dict[str, Any]:
        return instance.document()


class PreferencesOutput(serializers.Serializer):
    user_id = serializers.CharField()
    channels = serializers.ListField(child=serializers.CharField())
    addresses = serializers.DictField(child=serializers.CharField())
    muted_events = serializers.ListField(child=serializers.CharField())
    disabled_channels = serializers.ListField(child=serializers.CharField())
    timezone = serializers.CharField()
    quiet_hours = QuietWindowOutput(many=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class InboxQuery(RejectUnknownFieldsMixin, serializers.Serializer):
    unread = serializers.BooleanField(
        required=False, default=False, help_text="true: only messages not yet read."
    )
    cursor = serializers.CharField(
        required=False, max_length=CURSOR_MAX_LENGTH, help_text="From `next`."
    )
    page_size = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=INBOX_PAGE_SIZE_MAX,
        default=INBOX_PAGE_SIZE_DEFAULT,
    )


class InboxMessageOutput(serializers.Serializer):
    id = serializers.UUIDField()
    notification_id = serializers.UUIDField()
    subject = serializers.CharField()
    body = serializers.CharField()
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField()
    read = serializers.SerializerMethodField()
    read_at = serializers.DateTimeField(allow_null=True)

    def get_read(self, message: Any) -> bool:
        return message.read_at is not None


class InboxPageOutput(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    results = InboxMessageOutput(many=True)
