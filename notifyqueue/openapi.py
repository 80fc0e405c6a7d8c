"""Answers every API operation can give, added to the OpenAPI schema in one place.

Views document their own answers (201, 409, 422...). Some answers come from layers every
request passes through, so each operation gets them here unless it describes them itself:
400 (a NUL in the path, query or a header is refused before any view), 401 (no or a wrong
key), 404 (an id in the path that names nothing of yours), 406 (an Accept header without
JSON), 413 (a body over the size cap), 415 (a body that is not JSON), 429 (the per-client
request throttle) and 503 (the request lost its database session: send it again). The HTTP
server itself (gunicorn) refuses a request line over 4,094 bytes with 414 and headers over its
limits with 431, before the API sees them, in its own HTML.
A drf-spectacular postprocessing hook.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorOutput"}
RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer"},
    }
}
_METHODS = ("get", "put", "post", "patch", "delete")


def _error(description: str, *, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": ERROR_SCHEMA}},
    }
    if headers:
        answer["headers"] = headers
    return answer


def _server_refusal(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}


def common_error_responses(operation: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    """The answers `operation` at `path` can give whatever its view does."""
    answers = {
        "400": _error(
            "Invalid request; also a NUL character in the path, the query string or a header."
        ),
        "406": _error("The Accept header does not allow application/json."),
        "414": _server_refusal("The URL is longer than the HTTP server accepts (gunicorn)."),
        "431": _server_refusal("The headers are larger than the HTTP server accepts (gunicorn)."),
        "429": _error(
            "Too many requests from your client in this window (or, on creates, your "
            "PENDING backlog is over its limit).",
            headers=RETRY_AFTER,
        ),
        "503": _error(
            "The database could not be reached (its session was lost, or the server is "
            "restarting or failing over to its standby). Send the request again after "
            "Retry-After; a create sent again with the same Idempotency-Key answers the row if "
            "the lost try made it.",
            headers=RETRY_AFTER,
        ),
    }
    if operation.get("security"):
        answers["401"] = _error("Missing or wrong API key.")
    if "{" in path:
        answers["404"] = _error("Nothing of yours has this id or name.")
    if "requestBody" in operation:
        answers["413"] = _error("The request body is over the size limit.")
        answers["415"] = _error("The body is not application/json.")
    return answers


def postprocess_common_responses(result, generator, request, public):
    """Adds `common_error_responses` to every /api/ operation that lacks them."""
    for path, item in result.get("paths", {}).items():
        if not path.startswith("/api/"):
            continue
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            for code, answer in common_error_responses(operation, path).items():
                responses.setdefault(code, answer)
            if "429" in responses:
                responses["429"].setdefault("headers", RETRY_AFTER)
    return result
