"""The API's shared shapes: every app's input refuses unknown fields, and every error has one
format (`notifyqueue/errors.py` writes it; `ErrorOutput` documents it).

A request field is declared once, on its serializer. Where a path must check requests faster
than DRF's machinery can (the thin create path), `PlainValidator` checks them with the same
field objects: each field class used there has a `plain_value`, written beside its
`to_internal_value`, that gives what DRF's validation of the field gives for a value it
accepts as it stands, and `NOT_PLAIN` for anything else, which the serializer then validates
and answers with its own messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from notifyqueue.vocabulary import LONE_SURROGATE

# An opaque page cursor, in characters.
CURSOR_MAX_LENGTH = 1024
# A field's `plain_value` for a value it does not accept as it stands.
NOT_PLAIN: Any = object()


class PlainValidator:
    """What `serializer_class`'s validation gives for data that is plainly valid, without
    DRF's machinery: a JSON object whose every member is a field of the serializer whose
    `plain_value` accepts it, with every required field present and no rule between fields
    (`rules`, the serializer's own) broken. None for anything else: the serializer decides.

    Built once from the serializer's bound fields, which hold each field's bounds, choices
    and validators; safe to share between threads (a `plain_value` keeps no state)."""

    def __init__(
        self,
        serializer_class: type[serializers.Serializer],
        *,
        rules: Callable[[dict[str, Any]], dict[str, list[str]]],
    ) -> None:
        fields = serializer_class().fields
        self.checks: dict[str, Callable[[Any], Any]] = {
            name: field.plain_value for name, field in fields.items()
        }
        self.required = tuple(name for name, field in fields.items() if field.required)
        self.rules = rules

    def validated(self, data: Any) -> dict[str, Any] | None:
        if type(data) is not dict:
            return None
        validated: dict[str, Any] = {}
        for name, value in data.items():
            check = self.checks.get(name)
            if check is None:
                return None
            checked = check(value)
            if checked is NOT_PLAIN:
                return None
            validated[name] = checked
        for name in self.required:
            if name not in validated:
                return None
        if self.rules(validated):
            return None
        return validated


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

    def __init__(self, **kwargs: Any) -> None:
        # The validators given here, besides CharField's own (length, NUL, surrogates).
        self.declared_validators = tuple(kwargs.get("validators") or ())
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, float) and not math.isfinite(data):
            self.fail("invalid")
        return super().to_internal_value(data)

    def plain_value(self, data: Any) -> Any:
        """`run_validation(data)` for text the field accepts (not a number it would turn into
        text); NOT_PLAIN otherwise."""
        if type(data) is not str:
            return NOT_PLAIN
        if self.trim_whitespace:
            data = data.strip()
        if data == "":
            return "" if self.allow_blank else NOT_PLAIN
        if self.max_length is not None and len(data) > self.max_length:
            return NOT_PLAIN
        if self.min_length is not None and len(data) < self.min_length:
            return NOT_PLAIN
        if "\x00" in data or (not data.isascii() and LONE_SURROGATE.search(data)):
            return NOT_PLAIN
        for validator in self.declared_validators:
            try:
                validator(data)
            except (serializers.ValidationError, DjangoValidationError):
                return NOT_PLAIN
        return data


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(help_text="Offending fields, each with its messages.")


class ErrorOutput(serializers.Serializer):
    error = ErrorDetail()
