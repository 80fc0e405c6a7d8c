"""Templates in the admin: editable, checked by the same rules as the API."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils import timezone

from notifyqueue.errors import InvalidRequest
from templates.models import MessageTemplate
from templates.services import template_check


class MessageTemplateForm(forms.ModelForm):
    class Meta:
        model = MessageTemplate
        fields = ("client", "event", "channel", "subject", "body")

    def clean(self):
        data = super().clean()
        try:
            template_check(
                event=data.get("event", ""),
                channel=data.get("channel", ""),
                subject=data.get("subject", ""),
                body=data.get("body", ""),
            )
        except InvalidRequest as error:
            raise ValidationError(dict(error.fields)) from error
        return data


@admin.register(MessageTemplate)
class MessageTemplateAdmin(admin.ModelAdmin):
    form = MessageTemplateForm
    list_display = ("event", "channel", "client", "updated_at")
    list_filter = ("channel", "client")
    list_select_related = ("client",)
    search_fields = ("event",)
    ordering = ("client", "event", "channel")
    readonly_fields = ("created_at", "updated_at")

    def save_model(self, request, obj, form, change):
        obj.updated_at = timezone.now()
        if obj.created_at is None:
            obj.created_at = obj.updated_at
        super().save_model(request, obj, form, change)
