"""The API's shared shapes: every app's input refuses unknown fields, and every error has one
format (`notifyqueue/errors.py` writes it; `ErrorOutput` documents it)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

# An opaque page cursor, in characters.
CURSOR_MAX_LENGTH = 1024


class RejectUnknownFieldsMixin:
    """A misspelt field is an error, not silently ignored."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().validate(attrs)


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(help_text="Offending fields, each with its messages.")


class ErrorOutput(serializers.Serializer):
    error = ErrorDetail()
