"""The worker's edges, in process on real PostgreSQL: results that cannot be written, deferrals
in both directions, address changes under the rate limit, reaped slots, per-client in-app
windows and the start-up check of the claim timeout. (The same promises under real processes,
signals and skewed clocks: tests/faults/.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from delivery.models import DeliveryAttempt, Outcome, SimulatedProviderMessage
from delivery.repositories import DeliveryRepository, Finish
from notifications.models import Notification, Status
from ratelimits.repositories import RateLimitRepository
from tests.integration.test_preferences_delivery import create, hooked, preferences  # noqa: F401
from tests.integration.test_ratelimits import (
    limited_worker,
    rate_key,
    step_until_idle,
    window_count,
)
from tests.support.clock import DbClock
from tests.support.factories import ClientFactory, NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)

repo = DeliveryRepository()
WINDOW_S = 60.0


@pytest.fixture
def clock():
    # A second ahead, so rows the factories stamp with the test's own clock are due.
    return DbClock(timezone.now() + timedelta(seconds=1))


def test_a_result_the_batch_cannot_write_is_written_alone_and_an_unwritable_one_dead_letters():
    """One bad result (here a status the table refuses) used to fail the whole batched finish,
    again before every claim, stalling the worker. Now the others are written, and the bad one
    ends its row as DEAD_LETTERED with the reason."""
    rows = NotificationFactory.create_batch(3, client=ClientFactory())
    claims = repo.notification_claim_due(worker="w", limit=3, claim_timeout_s=30)
    good = [Finish(c.id, c.claim_token, Status.SENT, Outcome.SENT, message_id="m") for c in claims]
    bad = Finish(claims[1].id, claims[1].claim_token, "BOGUS", Outcome.SENT, message_id="m")
    finished = repo.notification_finish([good[0], bad, good[2]])

    assert sorted((f.id, f.status) for f in finished) == sorted(
        [(claims[0].id, "SENT"), (claims[1].id, "DEAD_LETTERED"), (claims[2].id, "SENT")]
    )
    broken = Notification.objects.get(id=claims[1].id)
    assert broken.status == Status.DEAD_LETTERED and broken.claim_token is None
    assert "could not be recorded (IntegrityError)" in broken.last_error
    attempt = DeliveryAttempt.objects.get(claim_token=claims[1].claim_token)
    assert attempt.outcome == Outcome.ABANDONED and attempt.finished_at is not None
    assert len(rows) == Notification.objects.exclude(status=Status.PROCESSING).count()


def test_a_provider_answer_with_nul_and_a_huge_id_is_recorded():
    NotificationFactory(client=ClientFactory())
    [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
    answer = "id\x00" + "x" * 100_000
    finish = Finish(claim.id, claim.claim_token, Status.SENT, Outcome.SENT, message_id=answer)
    [finished] = repo.notification_finish([finish])
    assert finished.status == Status.SENT
    stored = DeliveryAttempt.objects.get(claim_token=claim.claim_token).provider_message_id
    assert stored == "id\ufffd" + "x" * 100_000


def test_a_freed_place_lets_the_next_held_row_forward(clock, workers):
    """Limit 2 per minute, six waiting: two go now, two are held to +60 s, two to +120 s. One
    of the +60 s rows is cancelled, so at +60 s a slot is left over: the first +120 s row
    goes then instead of a minute later (on main it was held to +120 s)."""
    client = ClientFactory()
    rows = [NotificationFactory(client=client, recipient="ada@example.com") for _ in range(6)]
    worker = limited_worker(clock, limit=2, concurrency=1)
    workers(worker)
    step_until_idle(worker)
    assert Notification.objects.filter(status=Status.SENT).count() == 2
    held = list(Notification.objects.filter(status=Status.PENDING).order_by("due_at", "created_at"))
    assert [n.due_at - clock.now for n in held][::2] == [
        timedelta(seconds=WINDOW_S),
        timedelta(seconds=2 * WINDOW_S),
    ]
    Notification.objects.filter(id=held[0].id).update(status=Status.CANCELLED)

    clock.advance(WINDOW_S)
    step_until_idle(worker)
    sent = set(Notification.objects.filter(status=Status.SENT).values_list("id", flat=True))
    assert held[1].id in sent and held[2].id in sent  # the +120 s row went at +60 s
    assert len(sent) == 4
    assert window_count("ada@example.com") <= 2 + 2
    assert len(rows) == 6


def test_an_address_changed_while_queued_is_deferred_by_the_new_addresss_limit(
    hooked,  # noqa: F811
    clock,
    workers,
):
    """The send-time re-check swaps in the user's new address, whose window is full: the row
    is deferred (PENDING, attempt returned) and sent when the slot frees. On main the deferral
    looked for the row under the new address, found none, and the claim was dropped to expire,
    losing an attempt each time until DEAD_LETTERED unsent."""
    preferences(hooked, channels=["email"])
    notification = create(hooked)
    preferences(hooked, channels=["email"], addresses={"email": "ada@new.example.com"})
    other = NotificationFactory(recipient="ada@new.example.com", status=Status.SENT)
    from ratelimits.models import RecipientDelivery

    RecipientDelivery.objects.create(
        key=rate_key("ada@new.example.com", client_id=notification.client_id),
        at=clock.now,
        notification=other,
        claim_token=other.id,
    )
    worker = limited_worker(clock, limit=1, concurrency=1)
    workers(worker)
    step_until_idle(worker)
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
    assert notification.due_at == clock.now + timedelta(seconds=WINDOW_S)
    assert not SimulatedProviderMessage.objects.exists()

    clock.advance(WINDOW_S)
    step_until_idle(worker)
    notification.refresh_from_db()
    assert (notification.status, notification.recipient) == (Status.SENT, "ada@new.example.com")


def test_the_reaper_frees_the_abandoned_claims_slot_so_one_delivery_counts_once(clock):
    NotificationFactory(recipient="ada@example.com")
    [claim] = repo.notification_claim_due(worker="dead", limit=1, claim_timeout_s=5)
    from ratelimits.services import RateLimit, recipient_admit

    recipient_admit(claim, rate_limit=RateLimit(10, WINDOW_S), repository=RateLimitRepository())
    assert window_count("ada@example.com") == 1
    clock.advance(6)  # the worker died after admission; its claim expires
    assert [r.id for r in repo.notification_reclaim_expired()] == [claim.id]
    assert window_count("ada@example.com") == 0  # the re-send is admitted, and counted, anew


def test_in_app_windows_are_per_client_so_one_client_never_spends_anothers(clock, workers):
    a, b = ClientFactory(), ClientFactory()
    for _ in range(3):
        NotificationFactory(client=a, channel="in_app", recipient="u7")
    NotificationFactory(client=b, channel="in_app", recipient="u7")
    worker = limited_worker(clock, limit=2)
    workers(worker)
    step_until_idle(worker)
    sent = Notification.objects.filter(status=Status.SENT)
    assert sent.filter(client=a).count() == 2  # a's third waits for a's window
    assert sent.filter(client=b).count() == 1  # b's user u7 was not touched by a's
    assert window_count("u7", channel="in_app", client_id=a.id) == 2
    assert window_count("u7", channel="in_app", client_id=b.id) == 1


def test_run_worker_refuses_a_claim_timeout_shorter_than_twice_the_provider_timeout(settings):
    settings.NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS = 15
    settings.NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS = 10
    with pytest.raises(CommandError, match="must be at least twice"):
        call_command("run_worker", "--until-empty")


def test_run_worker_freezes_its_start_up_objects_before_its_loop_starts(monkeypatch):
    """docs/decisions/0023-start-up-objects-frozen.md: a full collection that walked them held
    the whole worker (its loop, its wake-up listener, its send threads) for 70-100 ms."""
    import gc

    from delivery.worker import Worker

    events: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: events.append("frozen"))
    run = Worker.run
    monkeypatch.setattr(
        Worker, "run", lambda self, **kwargs: (events.append("loop"), run(self, **kwargs))
    )
    sent = NotificationFactory()
    call_command("run_worker", "--until-empty")
    sent.refresh_from_db()
    assert sent.status == Status.SENT
    assert events == ["frozen", "loop"]


def test_an_error_after_the_provider_answered_still_records_the_answer(workers):
    """The fallback look-up raises after the provider rejected the message: the answer is
    recorded anyway (FAILED, as if no fallback were left) instead of dropped to wait out the
    claim timeout and cost another attempt."""
    from delivery.providers.base import PermanentFailure
    from tests.support.delivery_helpers import worker_build

    class BrokenRouter:
        def routes_at_send(self, claims):
            raise AssertionError("not a preference-mode notification")

        def route_next(self, claim):
            raise RuntimeError("preferences unreadable")

    class Rejecting:
        name = "rejecting"

        def send(self, message):
            return PermanentFailure("no such mailbox")

    notification = NotificationFactory(fallback_channels=["sms"])
    worker = worker_build(providers={"email": Rejecting()}, concurrency=1, router=BrokenRouter())
    workers(worker)
    assert worker.run_once().claimed == 1
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    notification.refresh_from_db()
    assert (notification.status, notification.last_error) == (Status.FAILED, "no such mailbox")
    assert DeliveryAttempt.objects.get().outcome == Outcome.PERMANENT_FAILURE


def test_a_cancelled_held_row_is_held_no_longer(clock, workers):
    """Limit 1, three waiting: one goes, the deferral holds the other two back. Cancelling them
    (the API's cancel) must take them out of the held rows: a cancelled row that kept its
    `rate_deferred_from` stayed in notification_rate_held, and every later admission of the
    recipient found it, counted the window and looked through the held rows for nothing."""
    from notifications.repositories import NotificationRepository

    client = ClientFactory()
    for _ in range(3):
        NotificationFactory(client=client, recipient="ada@example.com")
    worker = limited_worker(clock, limit=1, concurrency=1)
    workers(worker)
    step_until_idle(worker)
    held = list(Notification.objects.filter(status=Status.PENDING))
    assert len(held) == 2 and all(n.rate_deferred_from is not None for n in held)

    repository = NotificationRepository()
    for row in held:
        cancelled = repository.cancel_pending(
            notification_id=row.id, client_id=client.id, now=clock.now
        )
        assert cancelled is not None and cancelled.status == Status.CANCELLED

    assert not Notification.objects.filter(rate_deferred_from__isnull=False).exists()
