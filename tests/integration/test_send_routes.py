"""The send-time re-check's read of a whole claim's preferences (`PreferenceRouter.
routes_at_send`) on real PostgreSQL: one statement for every user of the claim, one more for
the templates of the claims that move to a fallback, each claim's routes the same as the
user's preferences alone decide, and the pages read the same whatever other users have."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from delivery.repositories import Claim
from preferences.repositories import SQL, PreferencesRepository
from preferences.routing import PreferenceRouter, Route, SendRoutes
from templates.repositories import TemplateRepository
from tests.support.factories import ClientFactory
from tests.support.reads import pages_visited_by_relation

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
PAYLOAD = {"order": "A-17"}


def preferences_put(client_id: uuid.UUID, user_id: str, **fields) -> None:
    document = {
        "channels": ["push", "email", "sms"],
        "addresses": {"push": f"{user_id}-device", "email": f"{user_id}@example.com"},
        "muted_events": [],
        "disabled_channels": [],
        **fields,
    }
    PreferencesRepository().upsert(
        client_id=client_id, user_id=user_id, timezone="UTC", quiet_hours=[], now=NOW, **document
    )


def templates_put(client_id: uuid.UUID) -> None:
    for channel in ("push", "email", "sms"):
        TemplateRepository().upsert(
            client_id=client_id,
            event="order_shipped",
            channel=channel,
            subject=f"[{channel}]",
            body=f"{channel}: {{order}}",
            now=NOW,
        )


def claim(client_id: uuid.UUID, user_id: str, **overrides) -> Claim:
    fields = {
        "id": uuid.uuid4(),
        "claim_token": uuid.uuid4(),
        "client_id": client_id,
        "channel": "push",
        "recipient": f"{user_id}-old-device",
        "subject": "[push]",
        "body": "push: A-17",
        "metadata": {},
        "priority": 2,
        "attempt_count": 1,
        "max_attempts": 3,
        "user_id": user_id,
        "template": "order_shipped",
        "payload": PAYLOAD,
        "fallback_channels": ("email", "sms"),
    }
    return Claim(**{**fields, **overrides})


def test_a_claims_routes_come_from_one_statement_and_its_fallbacks_templates_from_one_more():
    shop, other = ClientFactory().id, ClientFactory().id
    templates_put(shop)
    templates_put(other)
    preferences_put(shop, "moved", addresses={"push": "new-device"})
    preferences_put(shop, "muted", muted_events=["order_shipped"])
    preferences_put(shop, "no-push", disabled_channels=["push"])
    preferences_put(shop, "nothing-left", channels=["sms"])
    # The same user id at another client: its own preferences, never the shop's.
    preferences_put(other, "moved", addresses={"push": "other-device"})
    claims = [
        claim(shop, "moved"),
        claim(shop, "muted"),
        claim(shop, "no-push"),
        claim(shop, "nothing-left"),
        claim(shop, "never-had-any"),
        claim(other, "moved"),
        claim(shop, "moved"),  # the same user twice in one claim
    ]
    router = PreferenceRouter()

    with CaptureQueriesContext(connection) as queries:
        routes = router.routes_at_send(claims)
    assert len(queries) == 2, [q["sql"] for q in queries]

    def current(recipient: str) -> SendRoutes:
        return SendRoutes(
            current=Route("push", recipient, "[push]", "push: A-17", ("email", "sms"))
        )

    assert routes == {
        claims[0].id: current("new-device"),
        claims[1].id: SendRoutes(current=None, fallback=None),
        claims[2].id: SendRoutes(
            current=None,
            fallback=Route("email", "no-push@example.com", "[email]", "email: A-17", ("sms",)),
        ),
        claims[3].id: SendRoutes(current=None, fallback=None),
        claims[4].id: SendRoutes(current=None, fallback=None),
        claims[5].id: current("other-device"),
        claims[6].id: current("new-device"),
    }
    # The fallback is the one a lone look-up finds.
    assert routes[claims[2].id].fallback == router.route_next(claims[2])

    allowed = [claims[0], claims[5]]
    with CaptureQueriesContext(connection) as queries:
        assert set(router.routes_at_send(allowed)) == {c.id for c in allowed}
    assert len(queries) == 1  # no fallback needed: no template read


def test_user_ids_that_look_like_array_syntax_are_read_as_themselves():
    shop = ClientFactory().id
    templates_put(shop)
    odd = ["a,b", "{c}", "NULL", 'quote"d', "back\\slash", " spaced ", "é"]
    for user_id in odd:
        preferences_put(shop, user_id, addresses={"push": f"device of {user_id}"})
    claims = [claim(shop, user_id) for user_id in [*odd, "a", "b"]]
    routes = PreferenceRouter().routes_at_send(claims)
    found = {c.user_id: routes[c.id].current for c in claims}
    assert {user: route.recipient for user, route in found.items() if route} == {
        user_id: f"device of {user_id}" for user_id in odd
    }
    assert found["a"] is None and found["b"] is None


def other_users_preferences_insert(client_id: uuid.UUID, count: int, prefix: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO user_preferences (id, client_id, user_id, channels, addresses,
                                          muted_events, disabled_channels, timezone,
                                          quiet_hours, created_at, updated_at)
            SELECT gen_random_uuid(), %(client_id)s, %(prefix)s || n, '["push", "email"]',
                   jsonb_build_object('push', 'device-' || n), '[]', '[]', 'UTC', '[]',
                   now(), now()
              FROM generate_series(1, %(count)s) AS n
            """,
            {"client_id": client_id, "count": count, "prefix": prefix},
        )
        cursor.execute("ANALYZE user_preferences")


def test_a_claims_read_costs_a_few_pages_a_user_however_many_users_have_preferences():
    """50 claims (10 of them moving to a fallback) read as many pages with 60,000 other users'
    preferences present as with 20,000, and a few pages a user: each user is one probe of
    user_preferences_client_user and one heap page, never a scan of the table (over 400 pages
    at 20,000 users)."""
    shop = ClientFactory().id
    templates_put(shop)
    for n in range(50):
        preferences_put(shop, f"u-{n}", disabled_channels=["push"] if n % 5 == 0 else [])
    claims = [claim(shop, f"u-{n}") for n in range(50)]
    router = PreferenceRouter()

    def pages() -> dict[str, int]:
        with transaction.atomic():
            before = pages_visited_by_relation()
            routes = router.routes_at_send(claims)
            after = pages_visited_by_relation()
        assert sum(r.fallback is not None for r in routes.values()) == 10
        return {name: after[name] - before.get(name, 0) for name in after}

    other_users_preferences_insert(ClientFactory().id, 10_000, "a-")
    other_users_preferences_insert(shop, 10_000, "a-")
    some = pages()
    other_users_preferences_insert(ClientFactory().id, 20_000, "b-")
    other_users_preferences_insert(shop, 20_000, "b-")
    many = pages()
    grown = {name: (some.get(name, 0), n) for name, n in many.items() if n > some.get(name, 0)}
    # A deeper index costs a page a probe.
    assert sum(many.values()) <= sum(some.values()) + 60, sorted(grown.items())
    assert many["user_preferences"] <= 60, many
    assert sum(many.values()) <= 50 * 6, sorted(grown.items())
    print(f"50 users' routes: {sum(some.values())} pages, {sum(many.values())} with 60,000 others")

    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN " + SQL["preferences_read_many"],
            {"client_ids": [c.client_id for c in claims], "user_ids": [c.user_id for c in claims]},
        )
        plan = "\n".join(row for (row,) in cursor.fetchall())
    assert "user_preferences_client_user" in plan and "Seq Scan on user_preferences" not in plan, (
        plan
    )
