"""A routed call's upstream timeouts: its route's, or one request's own through headers.

A route sets ``connect_timeout``, ``first_token_timeout`` and ``stall_timeout`` (between
tokens) in its ``[models.<name>]`` table; one request may set its own with these headers (the
call's ``extra_headers``, or a gateway client's request headers), never sent upstream:

- ``x-llmroute-timeout-connect``: opening a connection to a target;
- ``x-llmroute-timeout-first-token``: an attempt's wait for its first token (then the route
  moves on);
- ``x-llmroute-timeout-between-tokens``: a stream's silence after its first token (then it
  counts as broken and is continued elsewhere);
- ``x-llmroute-timeout-total``: the whole request, kept by the gateway (``llmroute serve``).

Each value is seconds (``2.5``) or a duration (``"800ms"``, ``"2s"``), above 0 and at most an
hour; anything else is a :class:`TimeoutHeaderError` naming the header.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from .config import parse_duration
from .routing.route import Route

__all__ = [
    "BETWEEN_TOKENS_HEADER",
    "CONNECT_HEADER",
    "FIRST_TOKEN_HEADER",
    "MAX_TIMEOUT",
    "TIMEOUT_HEADERS",
    "TOTAL_HEADER",
    "RequestTimeouts",
    "TimeoutHeaderError",
    "request_timeouts",
    "with_timeouts",
]

CONNECT_HEADER = "x-llmroute-timeout-connect"
FIRST_TOKEN_HEADER = "x-llmroute-timeout-first-token"
BETWEEN_TOKENS_HEADER = "x-llmroute-timeout-between-tokens"
TOTAL_HEADER = "x-llmroute-timeout-total"
TIMEOUT_HEADERS = (CONNECT_HEADER, FIRST_TOKEN_HEADER, BETWEEN_TOKENS_HEADER, TOTAL_HEADER)
MAX_TIMEOUT = 3600.0
"""The longest timeout a header may ask for (seconds)."""


class TimeoutHeaderError(ValueError):
    """A ``x-llmroute-timeout-*`` header whose value is not a usable timeout."""

    def __init__(self, header: str, value: object) -> None:
        shown = repr(value)[:80]
        super().__init__(
            f"{header}: expected seconds or a duration such as '800ms' or '2s', above 0 and at "
            f"most {MAX_TIMEOUT:g} s, got {shown}"
        )
        self.header = header


@dataclass(frozen=True, slots=True)
class RequestTimeouts:
    """One request's own upstream timeouts in seconds (``None``: the route's)."""

    connect: float | None = None
    first_token: float | None = None
    between_tokens: float | None = None
    total: float | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))


def _seconds(header: str, value: object) -> float:
    if not isinstance(value, str):
        raise TimeoutHeaderError(header, value)
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise TimeoutHeaderError(header, value) from None
    if not (0 < seconds <= MAX_TIMEOUT) or not math.isfinite(seconds):
        raise TimeoutHeaderError(header, value)
    return seconds


def request_timeouts(headers: Mapping[str, object]) -> RequestTimeouts:
    """The ``x-llmroute-timeout-*`` headers among ``headers`` (any case); raises
    :class:`TimeoutHeaderError` naming the first header that is not a usable timeout."""
    found: dict[str, float] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("x-llmroute-timeout"):
            if lower not in TIMEOUT_HEADERS:
                raise TimeoutHeaderError(lower, f"(unknown header; one of {TIMEOUT_HEADERS})")
            found[lower] = _seconds(lower, value)
    if not found:
        return RequestTimeouts()
    return RequestTimeouts(
        connect=found.get(CONNECT_HEADER),
        first_token=found.get(FIRST_TOKEN_HEADER),
        between_tokens=found.get(BETWEEN_TOKENS_HEADER),
        total=found.get(TOTAL_HEADER),
    )


def with_timeouts(
    route: Route, timeout: httpx.Timeout, given: RequestTimeouts
) -> tuple[Route, httpx.Timeout]:
    """The route and the HTTP timeout one call runs with: the request's own timeouts over the
    route's (``connect_timeout``, ``first_token_timeout``, ``stall_timeout``) over the call's
    ``timeout``. The route itself is not changed (a copy shares its policy and budget)."""
    connect = given.connect if given.connect is not None else route.connect_timeout
    if connect is not None and connect != timeout.connect:
        timeout = httpx.Timeout(
            connect=connect, read=timeout.read, write=timeout.write, pool=timeout.pool
        )
    changes: dict[str, object] = {}
    if given.first_token is not None:
        changes["first_token_timeout"] = given.first_token
    if given.between_tokens is not None:
        changes["stall_timeout"] = given.between_tokens
    if changes:
        route = dataclasses.replace(route, **changes)  # type: ignore[arg-type]
    return route, timeout
