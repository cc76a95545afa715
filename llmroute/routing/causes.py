"""Why an attempt failed, and what a route does about it: pure functions of the exception.

:func:`classify` names the cause of a failed attempt (a 429, a 5xx, a request the vendor refused
as invalid, ...); :func:`react` says what the route does next: retry the same target (after a
wait), fail over to the next target, or hand the error to the caller unchanged. An ordered
``failover`` route retries its primary after a short Retry-After and once after a 5xx; the
latency policies move on at once. A request-caused 400 goes back to the caller on every policy,
unless the route opts in to failing over on that cause. docs/errors-and-retries.md has the table.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from openai import APIConnectionError, APIError, APIStatusError, APITimeoutError

from .._errors import FirstTokenTimeout, StallTimeout, TargetUnavailable
from .backoff import parse_retry_after, retry_delay, should_retry_status

__all__ = [
    "REQUEST_CAUSES",
    "Cause",
    "CauseRules",
    "Reaction",
    "any_retryable",
    "classify",
    "cooldown_after",
    "error_message",
    "is_health_failure",
    "outcome",
    "react",
    "round_delay",
]

Cause = Literal[
    "rate_limited",
    "server_error",
    "connection",
    "timeout",
    "first_token_timeout",
    "stall",
    "invalid_request",
    "content_policy",
    "context_length",
    "unsupported",
    "misconfigured",
    "not_held",
    "other",
]
REQUEST_CAUSES: Final = frozenset({"invalid_request", "content_policy", "context_length"})
"""Causes that are the request's fault: another target would refuse it too, or answer
something else. Returned to the caller unless a route opts in to failing over on them."""

_CONTEXT_LENGTH = re.compile(
    r"context[ _-]?(length|window|limit)|prompt is too long|maximum context|too many tokens"
    r"|reduce the length|input is too long",
    re.IGNORECASE,
)
_CONTENT_POLICY = re.compile(
    r"content[ _-]?(policy|filter|management)|safety system|flagged|moderation", re.IGNORECASE
)
_UNSUPPORTED = re.compile(
    r"unsupported|not supported|supports only|does not support", re.IGNORECASE
)
_MISCONFIGURED_CODES = frozenset({"model_not_found", "invalid_api_key", "not_found_error"})


def _error_fields(body: Any) -> tuple[str, str, str]:
    """The ``code``, ``type`` and ``message`` of an error body (OpenAI's or Anthropic's)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if not isinstance(body, Mapping):
        return "", "", body if isinstance(body, str) else ""
    fields = (body.get("code"), body.get("type"), body.get("message"))
    code, kind, message = (f if isinstance(f, str) else "" for f in fields)
    return code, kind, message


def classify(exc: BaseException) -> Cause:
    """The cause of one failed attempt."""
    if isinstance(exc, APIStatusError):
        status = exc.status_code
        if status in (400, 404) and _error_fields(exc.body)[0] == "previous_response_not_found":
            return "not_held"  # a Responses call continues a response another target holds
        if status == 429:
            return "rate_limited"
        if status in (401, 403, 404):
            return "misconfigured"
        if status >= 500 or status in (408, 409):
            return "server_error"
        if status in (400, 413, 422):
            code, kind, message = _error_fields(exc.body)
            if code in _MISCONFIGURED_CODES:
                return "misconfigured"  # SGLang's gateway answers an unknown model with 400
            text = f"{code} {kind} {message}"
            if code == "context_length_exceeded" or status == 413 or _CONTEXT_LENGTH.search(text):
                return "context_length"
            if _CONTENT_POLICY.search(text):
                return "content_policy"
            if _UNSUPPORTED.search(text):
                return "unsupported"  # this target cannot do it; another may
            return "invalid_request"
        return "other"
    if isinstance(exc, StallTimeout):
        return "stall"
    if isinstance(exc, FirstTokenTimeout):
        return "first_token_timeout"
    if isinstance(exc, APITimeoutError):
        return "timeout"
    if isinstance(exc, APIConnectionError):
        return "connection"
    return "other"


@dataclass(frozen=True, slots=True)
class CauseRules:
    """A route's reactions: whether it is ordered, and its settings."""

    ordered: bool = False
    """An ordered (``failover``) route: its first target is preferred, so it is retried."""
    retry_after_max: float = 5.0
    """Longest Retry-After an ordered route waits out to retry the same target (0: never)."""
    server_error_retries: int = 1
    """Retries of the same target after a 5xx, on an ordered route."""
    failover_on: frozenset[str] = frozenset()
    """Request-caused causes (:data:`REQUEST_CAUSES`) the route fails over on anyway."""


@dataclass(frozen=True, slots=True)
class Reaction:
    """What a route does after a failed attempt: ``retry`` the same target after ``delay``
    seconds, ``failover`` to the next, or ``raise`` the attempt's error to the caller."""

    action: Literal["retry", "failover", "raise"]
    cause: Cause
    delay: float = 0.0


def react(exc: BaseException, rules: CauseRules, *, retried: int, now: float) -> Reaction:
    """What to do after ``exc`` ended an attempt that was the ``retried + 1``-th on its
    target in this request; ``now`` is ``time.time()`` (for a Retry-After date)."""
    cause = classify(exc)
    if cause in REQUEST_CAUSES:
        return Reaction("failover" if cause in rules.failover_on else "raise", cause)
    if not rules.ordered or not isinstance(exc, APIStatusError):
        return Reaction("failover", cause)
    wait = parse_retry_after(exc.response.headers, now=now)
    if cause == "rate_limited":
        if wait is not None and 0 <= wait <= rules.retry_after_max > 0 and retried < 1:
            return Reaction("retry", cause, wait)
    elif cause == "server_error" and retried < rules.server_error_retries:
        if wait is None or wait < 0:
            wait = 0.0
        if wait == 0 or wait <= rules.retry_after_max:
            return Reaction("retry", cause, wait)
    return Reaction("failover", cause)


def outcome(exc: BaseException) -> str:
    """The outcome a failed attempt counts as in its target's stats."""
    if isinstance(exc, APIStatusError) and exc.status_code == 429:
        return "rate_limited"
    if isinstance(exc, APITimeoutError):  # FirstTokenTimeout is one too
        return "timeout"
    return "error"


def is_health_failure(exc: BaseException) -> bool:
    """Whether a failure says the target is unwell (not that the request was bad, nor that
    it does not hold the response a Responses call continues)."""
    if isinstance(exc, APIStatusError):
        return exc.status_code not in (400, 413, 422, 429) and classify(exc) != "not_held"
    return True


def cooldown_after(headers: Mapping[str, str]) -> float:
    """Seconds a target that answered 429 with these headers cools down (1 without a
    Retry-After)."""
    seconds = parse_retry_after(headers, now=time.time())
    return seconds if seconds is not None and seconds > 0 else 1.0


def any_retryable(failures: Iterable[BaseException]) -> bool:
    """Whether any of a round's failures may succeed when the request is sent again."""
    for exc in failures:
        if isinstance(exc, APIStatusError):
            if should_retry_status(exc.status_code, exc.response.headers, now=time.time()):
                return True
        elif isinstance(exc, APIError) and not isinstance(exc, TargetUnavailable):
            return True
    return False


def round_delay(
    failures: Iterable[BaseException], *, rounds: int, max_retries: int, rand: float
) -> float:
    """The wait before a route's next round of attempts, after ``rounds`` rounds: the
    Retry-After of the last status error among ``failures``, else openai's backoff (``rand``
    in [0, 1) draws its jitter)."""
    headers = None
    for exc in failures:
        if isinstance(exc, APIStatusError):
            headers = exc.response.headers
    return retry_delay(
        retries_done=rounds,
        max_retries=max_retries,
        headers=headers,
        now=time.time(),
        rand=rand,
    )


def error_message(exc: BaseException) -> str:
    """The text of an upstream error: its message and, where the body is JSON, the
    vendor's own ``message`` (openai's exceptions keep both)."""
    parts = [str(getattr(exc, "message", "") or exc)]
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = cast(Mapping[str, Any], body).get("error", body)
        text = inner.get("message") if isinstance(inner, Mapping) else None
        if isinstance(text, str):
            parts.append(text)
    return " ".join(parts)
