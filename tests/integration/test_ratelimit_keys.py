"""What a rate-limit window counts, tried as a hostile client would: one client's flood to an
address never delays another client's mail to it, spellings of one address count as one
recipient, a recipient's spelling cannot reach another key, and the optional ceiling per
address holds across clients. Each test ends with the universal check."""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from delivery.models import DeliveryAttempt, Outcome, SimulatedProviderMessage
from notifications.models import FINAL_STATUSES, Notification, Priority, Status
from notifyqueue.addresses import recipient_key
from ratelimits.models import RecipientDelivery
from ratelimits.services import RateLimit
from tests.support.delivery_helpers import FakeClock, step_until_idle, worker_build
from tests.support.factories import ClientFactory, NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW_S = 3600.0
LIMIT = 10


@pytest.fixture
def clock():
    return FakeClock(timezone.now() + timedelta(seconds=1))


def limited_worker(*, limit: int = LIMIT, ceiling: int = 0):
    return worker_build(
        batch_size=100, rate_limit=RateLimit(limit=limit, window_s=WINDOW_S, ceiling=ceiling)
    )


def drain(worker, clock) -> None:
    """Runs the worker, moving the database's clock to each next due time, until nothing is
    left waiting."""
    for _ in range(100):
        step_until_idle(worker)
        waiting = Notification.objects.filter(status=Status.PENDING).order_by("due_at").first()
        if waiting is None:
            return
        assert waiting.due_at > clock.now, "a due row was left unclaimed"
        clock.now = waiting.due_at
    raise AssertionError("the backlog never drained")


def sent(**filters) -> int:
    return Notification.objects.filter(status=Status.SENT, **filters).count()


def universal_check(*, limit: int = LIMIT, ceiling: int = 0, sent_before: frozenset = frozenset()):
    """Every notification is final, and final once: each SENT one reached its provider exactly
    once and has one SENT attempt, nothing else reached a provider (`sent_before`: rows the
    test made SENT itself, counted in the windows only). No (client, recipient) window, the
    recipient in its counting form, ever held more than `limit` deliveries, nor (with the
    ceiling on) an address across clients more than `ceiling`."""
    rows = list(
        Notification.objects.values_list(
            "id", "client_id", "channel", "recipient", "status", "priority", "sent_at"
        )
    )
    assert {status for *_, status, _, _ in rows} <= set(FINAL_STATUSES), "not all final"
    sent_ids = {n_id for n_id, *_, status, _, _ in rows if status == Status.SENT} - sent_before
    attempts = DeliveryAttempt.objects.filter(outcome=Outcome.SENT)
    assert sorted(attempts.values_list("notification_id", flat=True)) == sorted(sent_ids)
    provider_sends = {
        m.idempotency_key: m.sends for m in SimulatedProviderMessage.objects.filter(sends__gt=0)
    }
    expected = {
        f"{n_id}:{channel}": 1
        for n_id, _, channel, *_, status, _, _ in rows
        if status == Status.SENT and channel != "in_app" and n_id not in sent_before
    }
    assert provider_sends == expected

    windows: dict[tuple, list] = defaultdict(list)
    addresses: dict[tuple, list] = defaultdict(list)
    for _, client_id, channel, recipient, status, priority, sent_at in rows:
        if status != Status.SENT or priority == Priority.CRITICAL:
            continue
        windows[(channel, client_id, recipient_key(channel, recipient))].append(sent_at)
        if channel != "in_app":
            addresses[(channel, recipient_key(channel, recipient))].append(sent_at)
    checks = [(windows, limit)] + ([(addresses, ceiling)] if ceiling else [])
    for groups, most in checks:
        for key, times in groups.items():
            times.sort()
            for first, over in zip(times, times[most:], strict=False):
                assert over - first >= timedelta(seconds=WINDOW_S), (key, first, over)


def test_one_clients_flood_to_an_address_never_delays_another_clients_mail_to_it(clock, workers):
    """Client A sends 40 emails to one address; client B then sends it a HIGH one-time code and
    a NORMAL mail. A's window is full after ten and A's other 30 wait a window or more; B's
    window is B's own, so both of B's go at once. Keyed by the address alone, B's code waited
    an hour and its mail four."""
    a, b = ClientFactory(), ClientFactory()
    for _ in range(40):
        NotificationFactory(client=a, recipient="ada@example.com")
    code = NotificationFactory(client=b, recipient="ada@example.com", priority=Priority.HIGH)
    mail = NotificationFactory(client=b, recipient="Ada@Example.com")
    worker = limited_worker()
    workers(worker)

    step_until_idle(worker)

    assert sent(client=a) == LIMIT
    for notification in (code, mail):
        notification.refresh_from_db()
        assert notification.status == Status.SENT
        assert notification.sent_at == clock.now
    drain(worker, clock)
    assert sent(client=a) == 40
    universal_check()


def address_spellings() -> list[str]:
    """30 spellings of one mailbox: case variants, Unicode compatibility forms (full-width
    letters, the `ﬀ` ligature), and the IDNA domain both as Unicode and as punycode."""
    cases = [
        "ffion@bücher.example",
        "FFION@BÜCHER.EXAMPLE",
        "Ffion@Bücher.Example",
        "ffion@xn--bcher-kva.example",
        "FFION@XN--BCHER-KVA.EXAMPLE",
        "\ufb00ion@bücher.example",  # the ff ligature
        "\uff26\uff26\uff29\uff2f\uff2e@bücher.example",  # full-width FFION
        "ffion\uff20bücher.example",  # full-width @
        "ffion@bu\u0308cher.example",  # u + combining diaeresis
        "ffion@bücher.example.",  # the root's dot
    ]
    variants = list(cases)
    for mask in range(1, 32):  # more case variants: each letter of the local part either case
        local = "".join(c.upper() if mask >> j & 1 else c for j, c in enumerate("ffion"))
        variants.append(f"{local}@{'BÜCHER.example' if mask % 2 else 'Bücher.EXAMPLE'}")
    return list(dict.fromkeys(variants))[:30]


def test_thirty_spellings_of_one_mailbox_from_one_client_count_as_one_recipient(clock, workers):
    """Limit 10 an hour: 30 spellings of one address (case, compatibility forms, IDNA domain
    and its punycode) from one client send ten, and hold the other twenty for later windows.
    Each spelling is stored and sent as given."""
    spellings = address_spellings()
    assert len(set(spellings)) == 30
    assert {recipient_key("email", s) for s in spellings} == {"ffion@xn--bcher-kva.example"}
    client = ClientFactory()
    for spelling in spellings:
        NotificationFactory(client=client, recipient=spelling)
    worker = limited_worker()
    workers(worker)

    step_until_idle(worker)

    assert sent() == LIMIT
    held = Notification.objects.filter(status=Status.PENDING)
    assert held.count() == 20
    assert all(n.due_at >= clock.now + timedelta(seconds=WINDOW_S) for n in held)
    assert set(Notification.objects.values_list("recipient", flat=True)) == set(spellings)
    sent_to = set(SimulatedProviderMessage.objects.values_list("recipient", flat=True))
    assert sent_to <= set(spellings) and len(sent_to) == LIMIT
    drain(worker, clock)
    assert sent() == 30
    universal_check()


@pytest.mark.parametrize("channel", ["sms", "push", "in_app"])
def test_every_channel_counts_per_client(clock, workers, channel):
    """SMS numbers and push tokens are keyed per client as email is: another client's twelve
    never hold this client's one back. In-app always was."""
    recipient = {"sms": "+15550000001", "push": "device-token-0001", "in_app": "u7"}[channel]
    a, b = ClientFactory(), ClientFactory()
    for _ in range(12):
        NotificationFactory(client=a, channel=channel, recipient=recipient)
    theirs = NotificationFactory(client=b, channel=channel, recipient=recipient)
    worker = limited_worker()
    workers(worker)

    step_until_idle(worker)

    assert sent(client=a) == LIMIT
    theirs.refresh_from_db()
    assert theirs.status == Status.SENT
    drain(worker, clock)
    universal_check()


def test_a_push_token_spelled_as_an_in_app_key_spends_no_one_elses_window(clock, workers):
    """An in-app window was keyed `in_app:<client>:<user>` and a push window by the token
    alone: client M's push token spelled `in_app:<V>:u7` spent client V's user u7's in-app
    window. The key now names the channel and the client before the recipient, in a form a
    recipient cannot write: M's twelve pushes fill M's window for that token only."""
    victim, mallory = ClientFactory(), ClientFactory()
    forged = f"in_app:{victim.id}:u7"
    for _ in range(12):
        NotificationFactory(client=mallory, channel="push", recipient=forged)
    worker = limited_worker()
    workers(worker)
    step_until_idle(worker)
    assert sent(client=mallory) == LIMIT

    inbox = [NotificationFactory(client=victim, channel="in_app", recipient="u7") for _ in range(3)]
    for row in inbox:
        Notification.objects.filter(id=row.id).update(send_at=clock.now, due_at=clock.now)
    step_until_idle(worker)

    assert sent(client=victim) == 3
    drain(worker, clock)
    universal_check()


def test_the_ceiling_caps_an_address_across_clients_when_on(clock, workers):
    """NOTIFYQUEUE_RECIPIENT_RATE_LIMIT 15: three clients with eight each for one address
    (spelled three ways) are each under their own limit of ten, but only fifteen go in the
    window; the other nine wait for the address's slots, and every client still gets some."""
    clients = [ClientFactory() for _ in range(3)]
    for client, spelling in zip(
        clients, ["ada@example.com", "ADA@example.com", "ada@EXAMPLE.com"], strict=True
    ):
        for _ in range(8):
            NotificationFactory(client=client, recipient=spelling)
    worker = limited_worker(ceiling=15)
    workers(worker)

    step_until_idle(worker)

    assert sent() == 15
    assert all(sent(client=c) > 0 for c in clients)
    held = Notification.objects.filter(status=Status.PENDING)
    assert held.count() == 9
    assert all(n.due_at >= clock.now + timedelta(seconds=WINDOW_S) for n in held)
    address = RecipientDelivery.objects.exclude(address_key=None)
    assert address.count() == 15
    drain(worker, clock)
    assert sent() == 24
    universal_check(ceiling=15)


def test_the_ceiling_when_off_counts_nothing_and_writes_no_address_key(clock, workers):
    """Off (the default, 0): the same three clients send all 24 at once, ten per client at
    most, and no delivery carries an address key, so the ceiling's partial index gets no
    entry."""
    clients = [ClientFactory() for _ in range(3)]
    for client in clients:
        for _ in range(8):
            NotificationFactory(client=client, recipient="ada@example.com")
    worker = limited_worker()
    workers(worker)

    step_until_idle(worker)

    assert sent() == 24
    assert RecipientDelivery.objects.count() == 24
    assert not RecipientDelivery.objects.exclude(address_key=None).exists()
    universal_check()


def test_the_ceiling_does_not_count_a_claims_rows_that_their_own_limit_refused(clock):
    """One claim for one address: client A's four rows, A's window holding nine already (one
    slot left), and client B's three, spelled in upper case. Ceiling 5, the address's window
    empty (A's nine went before the ceiling was on). A's first row goes and A's other three
    are refused by A's own limit, so they take none of the ceiling's slots: all three of B's
    go, four in the address's window."""
    from ratelimits.repositories import AdmissionRequest, RateLimitRepository

    a, b = ClientFactory(), ClientFactory()
    recipient = "ada@example.com"
    for _ in range(9):
        n = NotificationFactory(client=a, recipient=recipient, status=Status.SENT)
        RecipientDelivery.objects.create(
            key=client_key(a.id, recipient), at=clock.now, notification=n, claim_token=n.id
        )
    rows = sorted(
        [NotificationFactory(client=a, recipient=recipient) for _ in range(4)]
        + [NotificationFactory(client=b, recipient=recipient.upper()) for _ in range(3)],
        key=lambda n: n.id,  # the claim's order
    )
    claims = [
        AdmissionRequest("email", n.client_id, n.recipient, n.id, uuid.uuid4(), False) for n in rows
    ]
    admitted = RateLimitRepository().recipients_admit(
        claims=claims, limit=LIMIT, window_s=WINDOW_S, ceiling=5
    )
    a_rows = [n.id for n in rows if n.client_id == a.id]
    b_rows = [n.id for n in rows if n.client_id == b.id]
    assert admitted == {a_rows[0], *b_rows}
    assert RecipientDelivery.objects.exclude(address_key=None).count() == 4


def client_key(client_id, recipient: str, channel: str = "email") -> bytes:
    """ratelimit_key(channel, client, counting form), as the window table stores it."""
    key = f"{channel}:{client_id}:{recipient_key(channel, recipient)}"
    return hashlib.sha256(key.encode()).digest()


def test_windows_kept_under_the_old_keys_are_re_keyed_and_held_rows_still_go(clock, workers):
    """A database whose windows were keyed by the address alone (in-app by
    `in_app:<client>:<user>`) is migrated back to before the per-client keys, given such
    windows, and migrated forward: each delivery gets its notification's new key (a delivery
    whose notification is gone is dropped), so what was sent in the last window still counts,
    and a row a deferral held keeps its due time and goes then."""
    from django.db.migrations.executor import MigrationExecutor

    before = [
        ("ratelimits", "0001_initial"),
        ("notifications", "0003_ratelimit_release_freed"),
        ("delivery", "0003_notification_rate_defer"),
    ]
    client = ClientFactory()
    full = [
        NotificationFactory(
            client=client,
            recipient="Ada@Example.com",
            status=Status.SENT,
            sent_at=clock.now - timedelta(seconds=WINDOW_S - 60),
        )
        for _ in range(LIMIT)
    ]
    inbox = NotificationFactory(
        client=client, channel="in_app", recipient="u7", status=Status.SENT, sent_at=clock.now
    )
    held = NotificationFactory(client=client, recipient="ada@example.com")
    Notification.objects.filter(id=held.id).update(
        due_at=clock.now + timedelta(seconds=60), rate_deferred_from=clock.now
    )
    waiting = NotificationFactory(client=client, recipient="ADA@EXAMPLE.COM")
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(before)
        with connection.cursor() as cursor:
            for n in full:
                cursor.execute(
                    "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token)"
                    " VALUES (sha256(convert_to(%s, 'UTF8')), %s, %s, %s)",
                    [n.recipient, n.sent_at, n.id, n.id],
                )
            cursor.execute(
                "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token)"
                " VALUES (sha256(convert_to(%s, 'UTF8')), %s, %s, %s), (%s, %s, %s, %s)",
                [
                    f"in_app:{client.id}:u7",
                    clock.now,
                    inbox.id,
                    inbox.id,
                    b"gone",
                    clock.now,
                    uuid.uuid4(),
                    uuid.uuid4(),
                ],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())

    keys = dict(RecipientDelivery.objects.values_list("notification_id", "key"))
    assert len(keys) == LIMIT + 1  # the orphan was dropped
    assert {bytes(keys[n.id]) for n in full} == {client_key(client.id, "ada@example.com")}
    assert bytes(keys[inbox.id]) == client_key(client.id, "u7", channel="in_app")

    worker = limited_worker()
    workers(worker)
    step_until_idle(worker)
    waiting.refresh_from_db()
    assert waiting.status == Status.PENDING  # the re-keyed window is full for its spelling
    clock.advance(60)
    drain(worker, clock)
    held.refresh_from_db()
    assert held.status == Status.SENT
    assert held.sent_at >= clock.now - timedelta(seconds=WINDOW_S)
    universal_check(sent_before=frozenset(n.id for n in [*full, inbox]))


@pytest.mark.django_db
def test_with_the_ceiling_on_the_admission_reads_each_addresss_window_not_its_history(clock):
    """Ceiling on: one busy address has 20,000 deliveries in its window across clients; then
    20 claims for other addresses, each with five deliveries in its address's window and five
    older. Each address is read through ratelimit_address_key_at: its five older deliveries,
    forgotten, and its five in the window, counted, whatever the busy address holds."""
    from django.db import transaction

    from ratelimits.repositories import AdmissionRequest, RateLimitRepository

    client = ClientFactory()
    repository = RateLimitRepository()
    busy = NotificationFactory(client=client)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, address_key, at, notification_id, claim_token)"
            " SELECT sha256(('other-' || g)::bytea), ratelimit_key('email', NULL, %s),"
            " %s - g * interval '1 ms', %s, gen_random_uuid()"
            " FROM generate_series(1, 20000) AS g",
            [busy.recipient, clock.now, busy.id],
        )
        cursor.execute("ANALYZE ratelimit_delivery")
    later = [
        AdmissionRequest("email", client.id, n.recipient, n.id, uuid.uuid4(), False)
        for n in NotificationFactory.create_batch(20, client=client)
    ]
    with connection.cursor() as cursor:
        for ago in (1, WINDOW_S + 1):  # five in each address's window, five older
            cursor.execute(
                "INSERT INTO ratelimit_delivery (key, address_key, at, notification_id,"
                " claim_token)"
                " SELECT sha256(gen_random_uuid()::text::bytea), ratelimit_key('email', NULL, r),"
                " %s, %s, gen_random_uuid()"
                " FROM unnest(%s::text[]) AS r, generate_series(1, 5)",
                [clock.now - timedelta(seconds=ago), busy.id, [c.recipient for c in later]],
            )

    def entries_read(index: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)", [index])
            return cursor.fetchone()[0]

    indexes = ("ratelimit_delivery", "ratelimit_at", "ratelimit_key_at", "ratelimit_address_key_at")
    with transaction.atomic():  # the counters are this transaction's
        before = {i: entries_read(i) for i in indexes}
        admitted = repository.recipients_admit(
            claims=later, limit=LIMIT, window_s=WINDOW_S, ceiling=LIMIT
        )
        read = {i: entries_read(i) - before[i] for i in before}

    assert admitted == {c.notification_id for c in later}
    # The claims' own (client, recipient) windows are empty: their probes return nothing.
    assert read == {
        "ratelimit_delivery": 0,
        "ratelimit_at": 0,
        "ratelimit_key_at": 0,
        "ratelimit_address_key_at": 10 * len(later),
    }, read


def test_a_worker_of_the_previous_release_still_admits_through_the_new_functions(clock):
    """While the migration lands, workers of the previous release keep running: their
    statements name the admission and the deferral without the two new parameters, which
    default to the recipient as stored and the ceiling off."""
    client = ClientFactory()
    rows = NotificationFactory.create_batch(3, client=client, recipient="ada@example.com")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT notification_id, admitted"
            " FROM ratelimit_admit_many(%s::text[], %s::uuid[], %s::text[], %s::uuid[],"
            " %s::uuid[], %s::boolean[], %s, %s)",
            [
                ["email"] * 3,
                [client.id] * 3,
                ["ada@example.com"] * 3,
                [n.id for n in rows],
                [uuid.uuid4() for _ in rows],
                [False] * 3,
                2,
                WINDOW_S,
            ],
        )
        admitted = dict(cursor.fetchall())
        cursor.execute(
            "SELECT due_at FROM notification_rate_defer(%s::text, %s::uuid, %s::text, %s::uuid,"
            " %s::uuid, %s::int, %s::float8)",
            ["email", client.id, "ada@example.com", rows[2].id, uuid.uuid4(), 2, WINDOW_S],
        )
        assert cursor.fetchall() == []  # the row is not claimed: nothing to defer
    assert sorted(admitted.values()) == [False, True, True]
    keys = set(RecipientDelivery.objects.values_list("key", flat=True))
    assert {bytes(k) for k in keys} == {client_key(client.id, "ada@example.com")}
