"""One webhook POST through the guarded outbound transport (notifyqueue/outbound.py), and what
its answer means for the event.

Invariants: no database access here (the caller records the result); the transport never
follows a redirect, never uses a proxy from the environment, connects only to the checked
address and ends within `timeout_s`. The receiver's body is never read or recorded: the
attempt keeps the status code and a short error class.
"""

from __future__ import annotations

from dataclasses import dataclass

from notifyqueue.outbound import OutboundAnswer, outbound_post

USER_AGENT = "NotifyQueue-Webhooks/1.0"


@dataclass(frozen=True)
class PostResult:
    delivered: bool
    permanent: bool
    """True when retrying cannot help (the URL is refused)."""
    status_code: int | None
    error: str | None
    duration_s: float


def webhook_post_result(answer: OutboundAnswer, *, timeout_s: float) -> PostResult:
    """2xx delivers; a refused URL fails for good; anything else (3xx included) is retried."""
    status = answer.status_code
    if status is not None and 200 <= status < 300:
        return PostResult(True, False, status, None, answer.duration_s)
    if status is not None:
        error = f"HTTP {status}" + (" (redirect not followed)" if 300 <= status < 400 else "")
    elif answer.failure == "timeout":
        error = f"timed out after {answer.duration_s:.2f}s (limit {timeout_s:g}s)"
    else:
        error = answer.failure
    return PostResult(False, answer.refused, status, error, answer.duration_s)


def webhook_post(
    *, url: str, body: bytes, headers: dict[str, str], timeout_s: float, allow_private: bool
) -> PostResult:
    """Checks `url` against the address rules after resolving it, then POSTs to that address."""
    answer = outbound_post(
        url=url,
        body=body,
        headers={"User-Agent": USER_AGENT, "Content-Type": "application/json", **headers},
        timeout_s=timeout_s,
        allow_private=allow_private,
        max_body_bytes=0,
    )
    return webhook_post_result(answer, timeout_s=timeout_s)
