"""API clients: who owns notifications, and the hashed keys they authenticate with."""

import base64
import secrets
import uuid

from django.db import models
from rest_framework_api_key.models import AbstractAPIKey

from notifyqueue.webhook_url import webhook_url_validate


def webhook_secret_new() -> str:
    """A Standard Webhooks secret: `whsec_` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Client(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, unique=True)
    is_operator = models.BooleanField(
        default=False, help_text="Operators see every client's notifications and may retry them."
    )
    may_send_critical = models.BooleanField(
        default=False,
        help_text="May create CRITICAL notifications, which go before every other client's "
        "and are never rate-limited. Off for new clients.",
    )
    webhook_url = models.URLField(
        max_length=2000, blank=True, default="", validators=[webhook_url_validate]
    )
    webhook_secret = models.CharField(max_length=100, default=webhook_secret_new)
    # After a rotation the old secret keeps signing (alongside the new one) until it expires,
    # so receivers can switch without a gap.
    previous_webhook_secret = models.CharField(
        max_length=100, blank=True, default="", db_default=""
    )
    previous_webhook_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # A Client stands in for request.user; DRF's IsAuthenticated asks this.
    is_authenticated = True

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ClientAPIKey(AbstractAPIKey):
    """A key is stored as a prefix plus a hash; the full key is shown once, at creation."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="api_keys")

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API key"
        verbose_name_plural = "API keys"


class ClientRequestWindow(models.Model):
    """The API throttle's counter: one row per client, for its current fixed window.

    Shared by every API process (gunicorn workers, hosts) because it lives in PostgreSQL;
    one UPSERT per request (clients/sql/clients.sql) counts and reads it.
    """

    client = models.OneToOneField(
        Client, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    window_start = models.DateTimeField()
    requests = models.IntegerField()

    class Meta:
        db_table = "clients_request_window"

    def __str__(self) -> str:
        return f"{self.requests} request(s) since {self.window_start:%Y-%m-%d %H:%M:%S}"
