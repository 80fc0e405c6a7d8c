"""Message templates: saving them, and rendering them with a payload. No ORM here.

Invariants protected here:
- rendering is plain substitution: a slot `{name}` names one payload key (an identifier) and
  is replaced by that value's text. Nothing is evaluated and no attribute or index is
  followed (unlike `str.format`, `{user.__class__}` or `{items[0]}` is a syntax error), so a
  template can never reach code or objects;
- `{{` and `}}` stand for literal braces; any other brace is a syntax error, refused when the
  template is saved, so every stored template parses;
- a payload that leaves a slot unfilled is an error naming every missing slot, never a blank;
- a rendered body is at most 64 KiB of UTF-8 and a rendered subject at most 998 characters
  (the same limits as a direct create's);
- escaping is per channel and only what the channel needs: an email subject becomes a mail
  header, so line breaks coming from the payload become spaces (no header injection); bodies
  are plain text on every channel, and sms, push and in_app take the text as it is.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from notifyqueue.errors import InvalidRequest, NotFound
from notifyqueue.vocabulary import MAX_BODY_BYTES, Channel
from templates.models import SUBJECT_MAX_LENGTH
from templates.repositories import TemplateRecord, TemplateRepository

# `{{`, `}}`, a slot, or a stray brace (the last alternative is the syntax error).
_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]{0,99})\}|[{}]")
EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")


@dataclass(frozen=True)
class Slot:
    """A `{name}` in a template."""

    name: str


Part = str | Slot


class TemplateNotFound(NotFound):
    def __init__(self, *, event: str, channel: str) -> None:
        super().__init__(f"There is no {channel} template for event {event!r}.")


class UnknownTemplate(InvalidRequest):
    """A create named a template that does not exist for its channel (400, not 404: the
    request is what is wrong)."""

    code = "unknown_template"

    def __init__(self, *, event: str, channel: str | None) -> None:
        kind = f"{channel} template" if channel else "template"
        message = f"There is no {kind} for event {event!r}."
        super().__init__(message, fields={"template": [message]})


class TemplateSyntaxInvalid(InvalidRequest):
    code = "invalid_template"


class MissingPlaceholders(InvalidRequest):
    code = "missing_placeholders"

    def __init__(self, *, event: str, channel: str, missing: list[str]) -> None:
        slots = ", ".join(f"{{{name}}}" for name in missing)
        super().__init__(
            f"The payload does not fill {slots} of the {channel} template {event!r}.",
            fields={"payload": [f"Missing placeholder: {name}" for name in missing]},
        )


class PlaceholderValueInvalid(InvalidRequest):
    code = "invalid_payload"

    def __init__(self, name: str) -> None:
        message = f"payload.{name} fills a placeholder, so it must be a string, number or boolean."
        super().__init__(message, fields={"payload": [message]})


@dataclass(frozen=True)
class Rendered:
    subject: str
    body: str


@dataclass(frozen=True)
class TemplateSaved:
    template: TemplateRecord
    created: bool


class TemplateStore(Protocol):
    def upsert(
        self,
        *,
        client_id: uuid.UUID,
        event: str,
        channel: str,
        subject: str,
        body: str,
        now: datetime,
    ) -> tuple[TemplateRecord, bool]: ...

    def get(self, *, client_id: uuid.UUID, event: str, channel: str) -> TemplateRecord | None: ...

    def get_many(
        self, *, client_id: uuid.UUID, event: str, channels: list[str]
    ) -> dict[str, TemplateRecord]: ...


def template_parse(text: str, *, field: str = "body") -> tuple[Part, ...]:
    """Splits a template into literal text and slots; raises TemplateSyntaxInvalid at the
    first brace that is neither an escape nor a slot."""
    parts: list[Part] = []
    literal: list[str] = []
    position = 0
    for match in _TOKEN.finditer(text):
        literal.append(text[position : match.start()])
        token = match.group(0)
        if token in ("{{", "}}"):
            literal.append(token[0])
        elif match.group(1) is not None:
            parts.append("".join(literal))
            literal = []
            parts.append(Slot(match.group(1)))
        else:
            message = (
                f"The {token!r} at character {match.start() + 1} is not a placeholder: write "
                "{name} (letters, digits, underscores) for a slot, or {{ and }} for a "
                "literal brace."
            )
            raise TemplateSyntaxInvalid(f"{field}: {message}", fields={field: [message]})
        position = match.end()
    literal.append(text[position:])
    parts.append("".join(literal))
    return tuple(part for part in parts if part != "")


def template_placeholders(template: TemplateRecord) -> list[str]:
    """The slot names the subject and body use, sorted."""
    parts = template_parse(template.subject, field="subject") + template_parse(template.body)
    return sorted({part.name for part in parts if isinstance(part, Slot)})


def template_render(template: TemplateRecord, payload: Mapping[str, Any]) -> Rendered:
    """Fills every slot from `payload`; raises MissingPlaceholders naming all unfilled ones."""
    subject_parts = template_parse(template.subject, field="subject")
    body_parts = template_parse(template.body)
    missing = sorted(
        {p.name for p in subject_parts + body_parts if isinstance(p, Slot)} - payload.keys()
    )
    if missing:
        raise MissingPlaceholders(event=template.event, channel=template.channel, missing=missing)
    subject = _fill(subject_parts, payload, escape=_subject_escape(template.channel))
    body = _fill(body_parts, payload, escape=_unchanged)
    if len(subject) > SUBJECT_MAX_LENGTH:
        message = (
            f"The subject is at most {SUBJECT_MAX_LENGTH} characters after rendering "
            f"(this one is {len(subject)})."
        )
        raise InvalidRequest(f"payload: {message}", fields={"payload": [message]})
    size = len(body.encode("utf-8"))
    if size > MAX_BODY_BYTES:
        message = f"At most {MAX_BODY_BYTES} bytes of UTF-8 after rendering (this one is {size})."
        raise InvalidRequest(f"body: {message}", fields={"payload": [message]})
    return Rendered(subject=subject, body=body)


def template_put(
    *,
    client_id: uuid.UUID,
    event: str,
    channel: str,
    subject: str,
    body: str,
    now: datetime,
    repository: TemplateStore | None = None,
) -> TemplateSaved:
    """Creates or replaces the client's template for (event, channel) after checking that it
    parses, so a broken template is refused when saved rather than when used."""
    repository = repository or TemplateRepository()
    template_check(event=event, channel=channel, subject=subject, body=body)
    record, created = repository.upsert(
        client_id=client_id, event=event, channel=channel, subject=subject, body=body, now=now
    )
    return TemplateSaved(template=record, created=created)


def template_check(*, event: str, channel: str, subject: str, body: str) -> None:
    """Raises InvalidRequest unless the template can be saved as it is."""
    if EVENT_NAME.fullmatch(event) is None:
        message = "1 to 255 letters, digits, '_', '.', ':' or '-'."
        raise InvalidRequest(f"event: {message}", fields={"event": [message]})
    if channel not in Channel.values:
        message = f"One of {', '.join(Channel.values)}."
        raise InvalidRequest(f"channel: {message}", fields={"channel": [message]})
    size = len(body.encode("utf-8"))
    if size > MAX_BODY_BYTES:
        message = f"At most {MAX_BODY_BYTES} bytes of UTF-8 (this one is {size})."
        raise InvalidRequest(f"body: {message}", fields={"body": [message]})
    if channel == Channel.EMAIL and _LINE_BREAKS.search(subject):
        message = "An email subject is one line."
        raise InvalidRequest(f"subject: {message}", fields={"subject": [message]})
    template_parse(subject, field="subject")
    template_parse(body)


def template_get(
    *,
    client_id: uuid.UUID,
    event: str,
    channel: str,
    repository: TemplateStore | None = None,
) -> TemplateRecord:
    repository = repository or TemplateRepository()
    found = repository.get(client_id=client_id, event=event, channel=channel)
    if found is None:
        raise TemplateNotFound(event=event, channel=channel)
    return found


def _fill(parts: tuple[Part, ...], payload: Mapping[str, Any], *, escape) -> str:
    return "".join(
        part if isinstance(part, str) else escape(_text(part.name, payload[part.name]))
        for part in parts
    )


def _text(name: str, value: Any) -> str:
    """A payload value as text: strings as they are, numbers in JSON's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise PlaceholderValueInvalid(name)


def _unchanged(text: str) -> str:
    return text


def _one_line(text: str) -> str:
    return _LINE_BREAKS.sub(" ", text)


def _subject_escape(channel: str):
    # An email subject is a header line; other channels' subjects are plain titles.
    return _one_line if channel == Channel.EMAIL else _unchanged
