"""The API's JSON parser: DRF's, with the bounds every request body must keep.

- At most `DATA_UPLOAD_MAX_MEMORY_SIZE` bytes are read (413 past that), whatever the
  Content-Length header says.
- Nesting deeper than `JSON_MAX_DEPTH` is a 400 (and so is nesting deep enough to exhaust
  Python's recursion limit while decoding), so no later step ever recurses without bound.
- A NUL character (`\\u0000`) in any key or string is a 400 naming where it is: PostgreSQL's
  text and jsonb cannot store it, and no field of this API has a use for it.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers, status

# The deepest a request body may nest; objects and lists each count one level. Field-level
# limits (metadata and payload: 8 levels) are lower and name their field.
JSON_MAX_DEPTH = 32


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"

    def __init__(self, *, limit: int) -> None:
        super().__init__(f"The request body is larger than {limit} bytes.")


class BoundedJSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        # One byte past the cap tells "too large" from "exactly at it" without reading more.
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise PayloadTooLarge(limit=limit)
        try:
            data = json.loads(raw.decode(settings.DEFAULT_CHARSET))
        except RecursionError as exc:
            raise _too_deep() from exc
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
        json_document_check(data)
        return data


def json_document_check(data: Any) -> None:
    """Raises a 400 for nesting deeper than JSON_MAX_DEPTH or a NUL in any key or string.

    Iterative, so a document just under the decoder's recursion limit cannot exhaust ours.
    """
    pending: list[tuple[Any, str, int]] = [(data, "", 1)]
    while pending:
        value, where, depth = pending.pop()
        if isinstance(value, dict):
            if depth > JSON_MAX_DEPTH:
                raise _too_deep()
            for key, item in value.items():
                place = f"{where}.{key}" if where else key
                if "\x00" in key:
                    raise _nul(place)
                pending.append((item, place, depth + 1))
        elif isinstance(value, list):
            if depth > JSON_MAX_DEPTH:
                raise _too_deep()
            pending.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str) and "\x00" in value:
            raise _nul(where)


def _too_deep() -> exceptions.ValidationError:
    message = f"JSON nested deeper than {JSON_MAX_DEPTH} levels."
    return exceptions.ValidationError({"non_field_errors": [message]})


def _nul(where: str) -> exceptions.ValidationError:
    # The key itself may be what holds the NUL: show it escaped.
    name = json.dumps(where)[1:-1] or "non_field_errors"
    return exceptions.ValidationError({name: ["NUL characters (\\u0000) are not allowed."]})
