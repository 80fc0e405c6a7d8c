"""The templates API's shapes. Syntax and size rules live in templates/services.py."""

from __future__ import annotations

from rest_framework import serializers

from notifyqueue.serializers import RejectUnknownFieldsMixin, TextField
from notifyqueue.vocabulary import MAX_BODY_BYTES, Channel
from templates.models import SUBJECT_MAX_LENGTH
from templates.repositories import TemplateRecord
from templates.services import template_placeholders


class TemplateInput(RejectUnknownFieldsMixin, serializers.Serializer):
    subject = TextField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=SUBJECT_MAX_LENGTH,
        help_text=f"May hold {{placeholder}} slots. At most {SUBJECT_MAX_LENGTH} characters; "
        "one line for email.",
    )
    body = TextField(
        trim_whitespace=False,
        max_length=MAX_BODY_BYTES,
        help_text="May hold {placeholder} slots; {{ and }} are literal braces. At most "
        f"{MAX_BODY_BYTES} bytes of UTF-8.",
    )


class TemplateOutput(serializers.Serializer):
    event = serializers.CharField()
    channel = serializers.ChoiceField(choices=Channel.values)
    subject = serializers.CharField()
    body = serializers.CharField()
    placeholders = serializers.SerializerMethodField(
        help_text="The slots a create's payload must fill."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_placeholders(self, template: TemplateRecord) -> list[str]:
        return template_placeholders(template)
