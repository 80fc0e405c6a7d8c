"""Template parsing and rendering: pure functions, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from notifyqueue.errors import InvalidRequest
from templates.repositories import TemplateRecord
from templates.services import (
    MissingPlaceholders,
    PlaceholderValueInvalid,
    Slot,
    TemplateSyntaxInvalid,
    UnknownTemplate,
    template_check,
    template_parse,
    template_placeholders,
    template_render,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def template(body: str, subject: str = "", channel: str = "email") -> TemplateRecord:
    return TemplateRecord(uuid.uuid4(), "order_shipped", channel, subject, body, NOW, NOW)


def test_render_fills_every_slot_in_subject_and_body():
    rendered = template_render(
        template("Hi {name}, order {order} costs {total} ({paid}).", subject="Order {order}"),
        {"name": "Ada", "order": "A-17", "total": 12.5, "paid": True, "unused": "x"},
    )
    assert rendered.subject == "Order A-17"
    assert rendered.body == "Hi Ada, order A-17 costs 12.5 (true)."


def test_doubled_braces_are_literal_and_a_slot_may_sit_inside_them():
    rendered = template_render(template("{{literal}} {{{name}}} }}"), {"name": "Ada"})
    assert rendered.body == "{literal} {Ada} }"


def test_payload_text_is_inserted_as_is_and_never_parsed_again():
    rendered = template_render(template("Hi {name}"), {"name": "{code} {{x}} <b>&"})
    assert rendered.body == "Hi {code} {{x}} <b>&"


@pytest.mark.parametrize(
    "body",
    [
        "{user.__class__}",  # attribute access, as str.format would allow
        "{items[0]}",  # index access
        "{0}",  # positional
        "{name!r}",  # conversion
        "{name:>10}",  # format spec
        "{ name }",
        "an open { brace",
        "a close } brace",
        "{}",
    ],
)
def test_anything_but_a_plain_name_in_braces_is_a_syntax_error(body):
    with pytest.raises(TemplateSyntaxInvalid) as caught:
        template_parse(body)
    assert caught.value.code == "invalid_template"
    assert "not a placeholder" in caught.value.fields["body"][0]


def test_parse_splits_text_and_slots():
    assert template_parse("Hi {name}!") == ("Hi ", Slot("name"), "!")


def test_missing_placeholders_are_all_named_in_order():
    with pytest.raises(MissingPlaceholders) as caught:
        template_render(template("{b} {a} {c}", subject="{a}"), {"c": 1})
    error = caught.value
    assert error.code == "missing_placeholders"
    assert error.fields == {"payload": ["Missing placeholder: a", "Missing placeholder: b"]}
    assert "{a}, {b}" in error.message and "'order_shipped'" in error.message


@pytest.mark.parametrize("value", [None, [1], {"a": 1}])
def test_a_slot_filled_by_a_non_scalar_is_refused(value):
    with pytest.raises(PlaceholderValueInvalid):
        template_render(template("Hi {name}"), {"name": value})


def test_email_subject_takes_payload_line_breaks_as_spaces_but_sms_body_keeps_them():
    email = template_render(template("{x}", subject="Re: {x}"), {"x": "a\r\nBcc: eve@x.com"})
    assert email.subject == "Re: a Bcc: eve@x.com"  # no header injection
    assert email.body == "a\r\nBcc: eve@x.com"  # a plain-text body is taken as it is
    sms = template_render(template("{x}", subject="{x}", channel="sms"), {"x": "a\nb"})
    assert (sms.subject, sms.body) == ("a\nb", "a\nb")


def test_rendered_body_over_64_kib_is_refused():
    with pytest.raises(InvalidRequest) as caught:
        template_render(template("{x}{x}"), {"x": "é" * 16_385})  # 2 x 32,770 bytes
    assert "after rendering" in caught.value.message
    assert len(template_render(template("{x}"), {"x": "é" * 32_768}).body) == 32_768


def test_placeholders_lists_subject_and_body_slots_once():
    assert template_placeholders(template("{b} {a} {b}", subject="{c}")) == ["a", "b", "c"]


def test_check_refuses_a_multi_line_email_subject_and_a_bad_event_name():
    with pytest.raises(InvalidRequest, match="one line"):
        template_check(event="e", channel="email", subject="a\nb", body="x")
    template_check(event="e", channel="push", subject="a\nb", body="x")
    with pytest.raises(InvalidRequest, match="event"):
        template_check(event="has space", channel="email", subject="", body="x")
    with pytest.raises(InvalidRequest, match="channel"):
        template_check(event="e", channel="fax", subject="", body="x")


def test_unknown_template_names_the_channel_when_there_is_one():
    assert UnknownTemplate(event="order_shipped", channel="sms").fields == {
        "template": ["There is no sms template for event 'order_shipped'."]
    }
    # A preference-mode create has no channel of its own.
    assert UnknownTemplate(event="order_shipped", channel=None).fields == {
        "template": ["There is no template for event 'order_shipped'."]
    }
    assert UnknownTemplate(event="x", channel=None).code == "unknown_template"
