"""The suppression list in the admin: operators see, add and remove entries. An add goes
through the same rule as the API's (the address in its counting form, at most one entry per
scope); a removal is logged by the service as well as in the admin's history."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from monitoring.paginators import EstimatedCountPaginator
from notifyqueue.vocabulary import RECIPIENT_MAX_LENGTH, Channel, recipient_problem
from suppressions import services
from suppressions.models import Reason, Suppression


class SuppressionAddForm(forms.ModelForm):
    address = forms.CharField(max_length=RECIPIENT_MAX_LENGTH)
    channel = forms.ChoiceField(choices=Channel.choices)

    class Meta:
        model = Suppression
        fields = ("channel", "address", "client")

    def clean(self):
        cleaned = super().clean()
        channel, address = cleaned.get("channel"), cleaned.get("address")
        if channel and address and (problem := recipient_problem(channel, address)):
            self.add_error("address", problem)
        return cleaned

    def _post_clean(self):
        # The entry is written by the service (save_model), not by the form's instance.
        pass


@admin.register(Suppression)
class SuppressionAdmin(admin.ModelAdmin):
    list_display = ("address_short", "channel", "client", "reason", "source", "created_at")
    list_filter = ("channel", "reason")
    list_select_related = ("client",)
    ordering = ("-created_at", "-id")
    sortable_by = ()
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = ("channel", "address", "client", "reason", "source", "created_at")

    @admin.display(description="address")
    def address_short(self, entry: Suppression) -> str:
        return entry.address if len(entry.address) <= 80 else entry.address[:79] + "…"

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = SuppressionAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request, obj=None):
        return ("channel", "address", "client") if obj is None else self.readonly_fields

    def save_model(self, request, obj, form, change) -> None:
        client = form.cleaned_data.get("client")
        entry, created = services.suppression_add(
            channel=form.cleaned_data["channel"],
            recipient=form.cleaned_data["address"],
            client_id=client.id if client else None,
            reason=Reason.OPERATOR,
            source=f"admin {request.user.get_username()}",
        )
        obj.pk = entry.id
        obj.address = entry.address
        if not created:
            self.message_user(request, "That address was already suppressed.", messages.INFO)

    def delete_model(self, request, obj) -> None:
        services.suppression_remove(id=obj.pk, removed_by=f"admin {request.user.get_username()}")

    def delete_queryset(self, request, queryset) -> None:
        for entry_id in queryset.values_list("id", flat=True)[:1000]:
            services.suppression_remove(
                id=entry_id, removed_by=f"admin {request.user.get_username()}"
            )
