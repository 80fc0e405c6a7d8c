"""The API's shared shapes: every app's input refuses unknown fields, and every error has one
format (`notifyqueue/errors.py` writes it; `ErrorOutput` documents it)."""

from __future__ import annotations

import math
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


class TextField(serializers.CharField):
    """DRF's CharField for request text. Like it, it takes a JSON number as its text (a
    numeric user id, 5 as "5"), but not NaN or Infinity (nor a literal such as 1e999 that
    overflows to it): they are not JSON numbers (RFC 8259), only Python's parser reads them,
    and "nan" is nobody's subject."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, float) and not math.isfinite(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(help_text="Offending fields, each with its messages.")


class ErrorOutput(serializers.Serializer):
    error = ErrorDetail()
