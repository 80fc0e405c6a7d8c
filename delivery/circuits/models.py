"""One circuit breaker per provider (a channel's configured provider, e.g. `push:http`).

Its row is the state every worker and process shares. Invariants held by the database:
- state is CLOSED, OPEN or HALF_OPEN;
- an OPEN or HALF_OPEN circuit knows when it opened;
- a HALF_OPEN circuit names its one probe (token and expiry), and no other state has one.
"""

from django.db import models
from django.db.models import Q


class CircuitState(models.TextChoices):
    CLOSED = "CLOSED"  # calls flow through
    OPEN = "OPEN"  # failing: calls fail fast, the provider is not called
    HALF_OPEN = "HALF_OPEN"  # the cooldown has passed and one probe call is in flight


class CircuitBreaker(models.Model):
    name = models.CharField(max_length=100, primary_key=True)
    state = models.CharField(max_length=16, choices=CircuitState.choices)
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    probe_token = models.UUIDField(null=True, blank=True)
    probe_expires_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "circuit_breaker"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=CircuitState.values), name="circuit_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(state=CircuitState.CLOSED) | Q(opened_at__isnull=False),
                name="circuit_open_has_opened_at",
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        state=CircuitState.HALF_OPEN,
                        probe_token__isnull=False,
                        probe_expires_at__isnull=False,
                    )
                    | (
                        ~Q(state=CircuitState.HALF_OPEN)
                        & Q(probe_token__isnull=True, probe_expires_at__isnull=True)
                    )
                ),
                name="circuit_probe_iff_half_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.state}"
