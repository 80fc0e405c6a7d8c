"""The digest's content: `{digest_items}` one line per item, at most DIGEST_ITEMS_SHOWN, fewer
when the rendered body would pass the body bound, "and N more" past them; a template the
payload no longer fills gives the items alone. No database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from notifications.digests import (
    DIGEST_ITEM_LINE_MAX,
    DIGEST_ITEMS_SHOWN,
    digest_item_line,
    digest_items_text,
    digest_render,
)
from notifyqueue.vocabulary import MAX_BODY_BYTES
from templates.repositories import TemplateRecord

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def template(subject: str, body: str, channel: str = "email") -> TemplateRecord:
    return TemplateRecord(uuid.uuid4(), "comment", channel, subject, body, NOW, NOW)


def test_an_item_is_its_subject_or_its_body_on_one_bounded_line():
    assert digest_item_line(subject="Bob commented", body="long body") == "Bob commented"
    assert digest_item_line(subject="  ", body="line one\nline two\r\n") == "line one line two"
    long = digest_item_line(subject="", body="x" * 1000)
    assert len(long) == DIGEST_ITEM_LINE_MAX and long.endswith("…")


def test_items_past_those_shown_are_counted_as_more():
    assert digest_items_text(["a", "b"], total=2) == "a\nb"
    assert digest_items_text(["a", "b"], total=7) == "a\nb\nand 5 more"
    assert digest_items_text([], total=3) == "and 3 more"


def test_the_digest_fills_the_templates_slots_and_keeps_its_payload():
    rendered, payload = digest_render(
        template("{digest_count} about {post}", "{digest_items}"),
        payload={"post": "P"},
        total=3,
        lines=["a", "b", "c"],
    )
    assert (rendered.subject, rendered.body) == ("3 about P", "a\nb\nc")
    assert payload == {"post": "P", "digest_count": 3, "digest_items": "a\nb\nc"}


def test_at_most_the_shown_lines_then_and_n_more():
    lines = [f"item {n}" for n in range(500)]
    rendered, _ = digest_render(
        template("", "{digest_items}"), payload={}, total=100_000, lines=lines
    )
    shown = rendered.body.split("\n")
    assert shown[:-1] == lines[:DIGEST_ITEMS_SHOWN]
    assert shown[-1] == f"and {100_000 - DIGEST_ITEMS_SHOWN} more"


def test_a_body_that_would_pass_the_bound_shows_fewer_lines():
    # The template's own text leaves room for only a few lines.
    filler = "x" * (MAX_BODY_BYTES - 1000)
    lines = ["y" * DIGEST_ITEM_LINE_MAX] * DIGEST_ITEMS_SHOWN
    rendered, _ = digest_render(
        template("", filler + "{digest_items}"), payload={}, total=80, lines=lines
    )
    assert len(rendered.body.encode()) <= MAX_BODY_BYTES
    body_lines = rendered.body[len(filler) :].split("\n")
    assert 1 <= len(body_lines) - 1 < DIGEST_ITEMS_SHOWN
    assert body_lines[-1] == f"and {80 - (len(body_lines) - 1)} more"


def test_a_template_the_payload_no_longer_fills_gives_the_items_alone():
    rendered, payload = digest_render(
        template("{gone}", "{digest_items}"), payload={}, total=2, lines=["a", "b"]
    )
    assert (rendered.subject, rendered.body) == ("", "a\nb")
    assert payload["digest_count"] == 2
    rendered, _ = digest_render(None, payload={}, total=1, lines=["a"])
    assert rendered.body == "a"
