"""The gateway's answers that are errors, in OpenAI's shape: ``{"error": {"message", "type",
"param", "code"}}``.

:class:`Refused` is an answer decided before (or instead of) the routed answer; the gateway's
app sends it. :func:`map_error` turns an exception of the routed call into one (an upstream's
4xx passed on as it is, the upstreams' failures as 502 or 504, the gateway's own credentials
refused upstream as 502, never as the client's 401); :func:`stream_error` is the last event of
a stream that broke. The rest build the refusals of a request's checks.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import openai

from .._errors import AllTargetsFailed, RequestBodyError, StreamInterrupted
from .._model_names import suggest_route
from .._secrets import masked_forms, scrub
from ..config import ConfigError
from ._validate import InvalidField, clipped

__all__ = [
    "ErrorAnswers",
    "Refused",
    "TotalTimeout",
    "error_body",
    "invalid_field",
    "map_error",
    "missing",
    "model_not_found",
    "not_allowed",
    "stream_error",
    "too_deep",
    "unknown_url",
]

log = logging.getLogger("llmroute.server")

UPSTREAM_AUTH = (401, 403, 407)
_REDACTED = "[redacted]"


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> Any:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class Refused(Exception):
    """An answer decided before the routing: status, OpenAI error body, extra headers."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


class TotalTimeout(Exception):
    """The request's total timeout (its route's ``total_timeout`` or its own header) passed."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"The answer did not end within the total timeout of {seconds:g} s.")
        self.message = str(self)


def retry_after(headers: Mapping[str, str], cap: float, now: float) -> dict[str, str]:
    """An upstream's ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date) as the
    gateway's own two headers, capped at ``cap`` seconds; none when neither is a valid time."""
    seconds: float | None = None
    try:
        seconds = float(headers.get("retry-after-ms", "")) / 1000
    except ValueError:
        text = headers.get("retry-after", "").strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(text).timestamp() - now
            except (TypeError, ValueError, IndexError, OverflowError):
                seconds = None
    if seconds is None or not math.isfinite(seconds):
        return {}
    seconds = min(max(seconds, 0.0), cap)
    return {"retry-after": str(math.ceil(seconds)), "retry-after-ms": str(int(seconds * 1000))}


def map_error(exc: Exception, max_retry_after: float, scrub: Callable[[str], str]) -> Refused:
    """An exception of the routed call as the OpenAI-shaped error a client should see
    (``scrub`` hides the upstream keys in what is logged)."""
    if isinstance(exc, AllTargetsFailed):
        cause = _client_fault(exc)
        if cause is not None:
            return map_error(cause, max_retry_after, scrub)
        return Refused(502, error_body(exc.message, "upstream_error", "all_targets_failed"))
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, max_retry_after)
    if isinstance(exc, openai.APITimeoutError | TotalTimeout):
        return Refused(504, error_body(exc.message, "timeout", "upstream_timeout"))
    if isinstance(exc, openai.APIError):
        return Refused(502, error_body(exc.message, "upstream_error", "upstream_unavailable"))
    if isinstance(exc, ConfigError | RequestBodyError):
        return Refused(400, error_body(str(exc), "invalid_request_error"))
    if isinstance(exc, RecursionError):
        return too_deep()
    log.error("unexpected error: %s", scrub(f"{type(exc).__name__}: {exc}"))
    return Refused(500, error_body("The gateway failed to answer.", "server_error"))


def _client_fault(exc: AllTargetsFailed) -> Exception | None:
    """The last cause when every target refused the request with the same 4xx (not an auth
    status): the client's mistake, passed on as the upstream said it."""
    causes = list(exc.errors.values())
    if not causes or not all(isinstance(c, openai.APIStatusError) for c in causes):
        return None
    statuses = {c.status_code for c in causes if isinstance(c, openai.APIStatusError)}
    if len(statuses) != 1:
        return None
    status = statuses.pop()
    if status >= 500 or status in UPSTREAM_AUTH:
        return None
    cause = causes[-1]
    assert isinstance(cause, Exception)
    return cause


def _status_error(exc: openai.APIStatusError, max_retry_after: float) -> Refused:
    status = exc.status_code
    if status in UPSTREAM_AUTH:
        log.error("upstream refused the gateway's credentials (HTTP %d)", status)
        return Refused(
            502,
            error_body(
                "The upstream provider refused the gateway's credentials.",
                "upstream_error",
                "upstream_auth",
            ),
        )
    error = exc.body if isinstance(exc.body, dict) else {}
    kind = "server_error" if status >= 500 else "upstream_error"
    body = {
        "message": error.get("message") or exc.message,
        "type": error.get("type") or kind,
        "param": error.get("param"),
        "code": error.get("code"),
    }
    headers: dict[str, str] = {}
    if status in (429, 503):
        headers = retry_after(exc.response.headers, max_retry_after, time.time())
    return Refused(status if 400 <= status <= 599 else 502, {"error": body}, headers)


def stream_error(exc: Exception, scrub: Callable[[str], str]) -> Any:
    """The last SSE event of a stream that broke: OpenAI's error shape, never ``[DONE]``."""
    if isinstance(exc, StreamInterrupted):
        return error_body(exc.message, "server_error", "stream_interrupted")
    if isinstance(exc, TotalTimeout):
        return error_body(exc.message, "timeout", "upstream_timeout")
    if isinstance(exc, openai.APIError):
        return error_body(exc.message, "server_error", "upstream_error")
    log.error("unexpected error in a stream: %s", scrub(f"{type(exc).__name__}: {exc}"))
    return error_body("The gateway failed to finish the answer.", "server_error")


def not_allowed(method: str, allowed: str) -> None:
    """405 unless ``method`` is the one the path takes."""
    if method != allowed:
        raise Refused(
            405,
            error_body(
                f"Method {method} is not allowed here; use {allowed}.", "invalid_request_error"
            ),
            {"allow": allowed},
        )


def invalid_field(invalid: InvalidField) -> Refused:
    return Refused(
        400, error_body(invalid.message, "invalid_request_error", invalid.code, invalid.param)
    )


def missing(param: str) -> Refused:
    return Refused(
        400,
        error_body(f"Missing required parameter: '{param}'.", "invalid_request_error", None, param),
    )


def too_deep() -> Refused:
    return Refused(
        400, error_body("The request body is nested too deeply.", "invalid_request_error")
    )


def unknown_url(asked: str) -> Refused:
    """OpenAI's 404 for a path nothing serves, ``asked`` (the path, or the method and the
    path) shown up to 100 characters: a client's request line can be kilobytes long."""
    return Refused(
        404, error_body(f"Unknown request URL: {clipped(asked, 100)}", "invalid_request_error")
    )


def model_not_found(name: str, usable: Iterable[str] = ()) -> Refused:
    """OpenAI's 404 for a model, naming the closest of ``usable`` as the SDK does (the
    routes the key may use, never another), else listing the first ten of them."""
    shown = clipped(name, 100)
    names = list(usable)
    closest = suggest_route(name, names) if len(name) <= 100 else None
    if closest is not None:
        hint = f" (did you mean {closest!r}?)"
    elif names:
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        hint = f" (the models you can use here: {', '.join(map(repr, names[:10]))}{more})"
    else:
        hint = ""
    return Refused(
        404,
        error_body(
            f"The model '{shown}' does not exist or you do not have access to it{hint}.",
            "invalid_request_error",
            "model_not_found",
        ),
    )


class ErrorAnswers:
    """The gateway's error bodies as they leave it: no upstream key in them, whole or masked
    as a vendor echoes it (``secrets``: the upstream keys and credential header values), nor in
    what is logged."""

    def __init__(self, secrets: list[str], max_retry_after: float) -> None:
        self._secrets = secrets
        self._masked = masked_forms(secrets)  # as vendors echo them: sk-...abcd
        self._max_retry_after = max_retry_after

    def scrub(self, text: str) -> str:
        return scrub(text, self._secrets, _REDACTED, self._masked)

    def error_bytes(self, body: Any) -> bytes:
        # Not ASCII-escaped, so a masked key's ellipsis or bullets are seen as such.
        return self.scrub(json.dumps(body, ensure_ascii=False)).encode()

    def map_error(self, exc: Exception) -> Refused:
        """An exception of the routed call as the OpenAI-shaped error a client should see."""
        return map_error(exc, self._max_retry_after, self.scrub)

    def stream_error(self, exc: Exception) -> Any:
        return stream_error(exc, self.scrub)
