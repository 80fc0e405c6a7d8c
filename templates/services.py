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
  header, so each run of control characters (but tab) and line separators coming from the
  payload becomes one space (no header injection); bodies
  are plain text on every channel, and sms, push and in_app take the text as it is.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from notifyqueue.errors import InvalidRequest, NotFound
from notifyqueue.vocabulary import HEADER_BREAKS, MAX_BODY_BYTES, Channel
from templates.models import SUBJECT_MAX_LENGTH
from templates.repositories import TemplateRecord, TemplateRepository

# `{{`, `}}`, a slot, or a stray brace (the last alternative is the syntax error).
_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]{0,99})\}|[{}]")
EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_HEADER_BREAK_RUNS = re.compile(f"{HEADER_BREAKS.pattern}+")


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
    return tuple(part for part in parts if isinstance(part, Slot) or part)


def template_placeholders(template: TemplateRecord) -> list[str]:
    """The slot names the subject and body use, sorted."""
    parts = template_parse(template.subject, field="subject") + template_parse(template.body)
    return sorted({part.name for part in parts if isinstance(part, Slot)})


def template_render(template: TemplateRecord, payload: Mapping[str, Any]) -> Rendered:
    """Fills every slot from `payload`; raises MissingPlaceholders naming all unfilled ones.

    The rendered sizes are added up from the parts (each distinct value converted once)
    before any string is joined, so a template that would render past its bounds is refused
    in time linear in the template and the payload, whatever it would have expanded to."""
    subject_parts = template_parse(template.subject, field="subject")
    body_parts = template_parse(template.body)
    # Each slot's name once, in the template's order (so an error names the first bad one).
    subject_names = dict.fromkeys(p.name for p in subject_parts if isinstance(p, Slot))
    body_names = dict.fromkeys(p.name for p in body_parts if isinstance(p, Slot))
    missing = sorted((subject_names.keys() | body_names.keys()) - payload.keys())
    if missing:
        raise MissingPlaceholders(event=template.event, channel=template.channel, missing=missing)
    escape = _subject_escape(template.channel)
    subject_values = {name: escape(_text(name, payload[name])) for name in subject_names}
    body_values = {name: _text(name, payload[name]) for name in body_names}
    subject_length = _rendered_size(subject_parts, subject_values, len)
    if subject_length > SUBJECT_MAX_LENGTH:
        message = (
            f"The subject is at most {SUBJECT_MAX_LENGTH} characters after rendering "
            f"(this one would be {subject_length})."
        )
        raise InvalidRequest(f"payload: {message}", fields={"payload": [message]})
    body_size = _rendered_size(body_parts, body_values, _utf8_size)
    if body_size > MAX_BODY_BYTES:
        message = (
            f"At most {MAX_BODY_BYTES} bytes of UTF-8 after rendering (this one would be "
            f"{body_size})."
        )
        raise InvalidRequest(f"body: {message}", fields={"payload": [message]})
    return Rendered(
        subject=_fill(subject_parts, subject_values), body=_fill(body_parts, body_values)
    )


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
    if channel == Channel.EMAIL and HEADER_BREAKS.search(subject):
        message = "An email subject is one line: no control character but tab, no line separator."
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


def _rendered_size(
    parts: tuple[Part, ...], values: Mapping[str, str], size: Callable[[str], int]
) -> int:
    value_sizes = {name: size(value) for name, value in values.items()}
    return sum(size(part) if isinstance(part, str) else value_sizes[part.name] for part in parts)


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _fill(parts: tuple[Part, ...], values: Mapping[str, str]) -> str:
    return "".join(part if isinstance(part, str) else values[part.name] for part in parts)


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
    return _HEADER_BREAK_RUNS.sub(" ", text)


def _subject_escape(channel: str):
    # An email subject is a header line; other channels' subjects are plain titles.
    return _one_line if channel == Channel.EMAIL else _unchanged
