"""The serializers' plain field checks (`CREATE_PLAIN`, `BATCH_ITEM_PLAIN`, which the thin create
path and the views use) against DRF's validation of the same fields: whatever the plain checks
accept, the serializer accepts with the same values; what they do not accept is left to the
serializer, which then answers."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework import serializers

from notifications.repositories import QUERIES, RECORD_FIELDS
from notifications.serializers import (
    BATCH_ITEM_PLAIN,
    CREATE_PLAIN,
    BatchItemInput,
    NotificationCreateInput,
    notification_request,
)
from notifyqueue.vocabulary import MAX_BODY_BYTES, RECIPIENT_MAX_LENGTH, Priority

BASE = {"channel": "email", "recipient": "ada@example.com", "body": "Welcome"}
LATER = (datetime.now(UTC) + timedelta(days=3)).isoformat()


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


# (name, request): plain, valid requests the thin path must take itself.
PLAIN = [
    ("minimal", BASE),
    ("subject", {**BASE, "subject": "Hi"}),
    ("empty subject", {**BASE, "subject": ""}),
    ("upper-case channel", {**BASE, "channel": "EMAIL"}),
    ("priority, any case", {**BASE, "priority": "high"}),
    ("critical", {**BASE, "priority": "CRITICAL"}),
    ("recipient with spaces around", {**BASE, "recipient": "  ada@example.com "}),
    ("body of spaces", {**BASE, "body": "   "}),
    ("non-ASCII body", {**BASE, "body": "Grüße, 東京 🎉"}),
    ("body at its length", {**BASE, "body": "x" * MAX_BODY_BYTES}),
    ("sms", {"channel": "sms", "recipient": "+447700900123", "body": "1234"}),
    ("push", {"channel": "push", "recipient": "device-token-1", "body": "b"}),
    ("in_app", {"channel": "in_app", "recipient": "user-1", "body": "b"}),
    ("delay", {**BASE, "delay_seconds": 0}),
    ("delay at its most", {**BASE, "delay_seconds": 10 * 366 * 24 * 3600}),
    ("send_at", {**BASE, "send_at": "2026-12-01T12:00:00+02:00"}),
    ("send_at later", {**BASE, "send_at": LATER}),
    ("metadata", {**BASE, "metadata": {"order": "A-17", "n": [1, 2.5, None, True]}}),
    ("metadata 8 deep", {**BASE, "metadata": nested(8)}),
    ("template", {"channel": "email", "recipient": "a@b.co", "template": "x", "payload": {}}),
    ("preference mode", {"template": " signup ", "payload": {"a": 1}, "user_id": "u1"}),
]

# Requests the serializer refuses, or accepts only by turning a value into another type.
NOT_PLAIN = [
    ("unknown field", {**BASE, "colour": "red"}),
    ("null", {**BASE, "subject": None}),
    ("number recipient", {"channel": "in_app", "recipient": 12345, "body": "b"}),
    ("number body", {**BASE, "body": 5}),
    ("blank recipient", {**BASE, "recipient": "   "}),
    ("empty body", {**BASE, "body": ""}),
    ("bad channel", {**BASE, "channel": "fax"}),
    ("channel not text", {**BASE, "channel": ["email"]}),
    ("bad priority", {**BASE, "priority": "URGENT"}),
    ("priority number", {**BASE, "priority": 1}),
    ("surrogate", {**BASE, "body": "a\ud800b"}),
    ("NUL", {**BASE, "body": "a\x00b"}),
    ("recipient too long", {"channel": "in_app", "recipient": "u" * (RECIPIENT_MAX_LENGTH + 1)}),
    ("body too long", {**BASE, "body": "x" * (MAX_BODY_BYTES + 1)}),
    ("subject too long", {**BASE, "subject": "s" * 999}),
    ("delay negative", {**BASE, "delay_seconds": -1}),
    ("delay too far", {**BASE, "delay_seconds": 10 * 366 * 24 * 3600 + 1}),
    ("delay as text", {**BASE, "delay_seconds": "5"}),
    ("delay as float", {**BASE, "delay_seconds": 5.0}),
    ("delay as bool", {**BASE, "delay_seconds": True}),
    ("both timings", {**BASE, "delay_seconds": 1, "send_at": LATER}),
    ("naive send_at", {**BASE, "send_at": "2026-12-01T12:00:00"}),
    ("send_at too far", {**BASE, "send_at": "2099-01-01T00:00:00Z"}),
    ("metadata 9 deep", {**BASE, "metadata": nested(9)}),
    ("metadata too large", {**BASE, "metadata": {"a": "x" * 20_000}}),
    ("metadata a list", {**BASE, "metadata": [1]}),
    ("payload without template", {**BASE, "payload": {}}),
    ("template and body", {**BASE, "template": "x"}),
    ("no recipient", {"channel": "email", "body": "b"}),
    ("bad email", {**BASE, "recipient": "not-an-address"}),
    ("bad sms", {"channel": "sms", "recipient": "12", "body": "b"}),
    ("line break in email subject", {**BASE, "subject": "a\nb"}),
    ("user id without template", {**BASE, "user_id": "u1"}),
    ("not an object", ["a"]),
]


def drf_validated(serializer_class, data):
    serializer = serializer_class(data=copy.deepcopy(data))
    if not serializer.is_valid():
        return None
    return dict(serializer.validated_data)


@pytest.mark.parametrize(("name", "data"), PLAIN, ids=[name for name, _ in PLAIN])
def test_a_plain_valid_request_is_taken_with_the_serializers_values(name, data):
    expected = drf_validated(NotificationCreateInput, data)
    assert expected is not None, name
    got = CREATE_PLAIN.validated(copy.deepcopy(data))
    assert got == expected
    assert notification_request(got) == notification_request(expected)
    if "priority" in got:
        assert type(got["priority"]) is Priority


@pytest.mark.parametrize(("name", "data"), NOT_PLAIN, ids=[name for name, _ in NOT_PLAIN])
def test_anything_else_is_left_to_the_serializer(name, data):
    assert CREATE_PLAIN.validated(copy.deepcopy(data)) is None
    # The case list is about the serializer too: refused, or accepted by coercion.
    validated = drf_validated(NotificationCreateInput, data)
    assert validated is None or name.startswith("number ")


@pytest.mark.parametrize(
    "key", ["k-1", "x" * 255, "with space"], ids=["short", "longest", "inner space"]
)
def test_a_batch_item_with_a_usable_key_is_taken(key):
    item = {**BASE, "idempotency_key": key}
    assert BATCH_ITEM_PLAIN.validated(dict(item)) == drf_validated(BatchItemInput, item)


@pytest.mark.parametrize(
    "item",
    [
        BASE,  # no key
        {**BASE, "idempotency_key": ""},
        {**BASE, "idempotency_key": "   "},
        {**BASE, "idempotency_key": "x" * 256},
        {**BASE, "idempotency_key": "é"},
        {**BASE, "idempotency_key": 5},
    ],
    ids=["missing", "empty", "spaces", "too long", "not ascii", "number"],
)
def test_a_batch_item_without_a_usable_key_is_left_to_the_serializer(item):
    assert BATCH_ITEM_PLAIN.validated(dict(item)) is None


def test_a_single_create_takes_no_idempotency_key_field():
    item = {**BASE, "idempotency_key": "k-1"}
    assert CREATE_PLAIN.validated(item) is None
    with pytest.raises(serializers.ValidationError):
        NotificationCreateInput(data=item).is_valid(raise_exception=True)


def test_the_batch_create_answers_created_then_the_records_columns_in_order():
    # Read by position (_fetch_created_in_order), so both halves of its UNION ALL must list
    # `created` and then NotificationRecord's columns, in the record's order. A row it
    # inserted answers what the database chose and its JSON as stored; the caller has the
    # rest (NULL here).
    text = QUERIES["notifications_create_many"].rpartition("\n)\n")[2]
    halves = text.split("UNION ALL")
    assert len(halves) == 2
    from_the_database = {"id", "idempotency_key", "send_at", "due_at", "created_at", "updated_at"}
    from_the_database |= {"metadata", "payload", "fallback_channels"}
    # A time to live becomes an expiry counted from the send time, in the database.
    from_the_database.add("expires_at")
    for half, created in zip(halves, ("true", "false"), strict=True):
        selected = half.partition("SELECT")[2].partition("\n  FROM")[0]
        # Commas inside a call (nullif(a, b)) do not separate columns.
        found = [column.strip() for column in re.split(r",(?![^()]*\))", selected)]
        assert found[0] == f"{created} AS created"
        names = [column.rpartition(" AS ")[2].rpartition(".")[2] for column in found[1:]]
        assert tuple(names) == RECORD_FIELDS
        columns = zip(names, found[1:], strict=True)
        left_null = {name for name, column in columns if column.startswith("NULL")}
        expected = set(RECORD_FIELDS) - from_the_database if created == "true" else set()
        assert left_null == expected
