"""What an admission answers: the verdict of every scope's counters, the refusal it words
(OpenAI's 429 bodies and ``retry-after``), and OpenAI's ``x-ratelimit-*`` headers (and the
budgets') of the scope with the least left."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .._tenants import Scope, usd
from ._counts import BUCKET, BUCKETS, Counts, Refusal

__all__ = [
    "ADMITTED",
    "BUDGET",
    "CONCURRENCY",
    "MONEY",
    "REQUESTS",
    "TOKENS",
    "TOO_LARGE",
    "Row",
    "least_left_headers",
    "leaves",
    "refusal",
    "reset_text",
    "retry_headers",
    "scope_headers",
    "verdict_of",
]


def reset_text(seconds: float) -> str:
    """A wait as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``20ms``, ``1.5s``,
    ``6m0s``, ``1h2m3s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


def leaves(oldest: int | None, now: float) -> float:
    """Seconds until the bucket ``oldest`` leaves the window (0 with none)."""
    if oldest is None:
        return 0.0
    return max(0.001, (oldest + BUCKETS + 1) * BUCKET - now)


def retry_headers(seconds: float) -> dict[str, str]:
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(int(seconds * 1000)),
    }


Row = tuple[Scope, Counts, float | None]
"""A scope, its counters and when its budget period ends."""


def scope_headers(settings: Any, counts: Counts, now: float, end: float | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers (and the budget's) of one scope (or a key's
    settings: anything with ``rpm``, ``tpm`` and ``budget_tokens``)."""
    out: dict[str, str] = {}
    if settings.rpm is not None:
        out["x-ratelimit-limit-requests"] = str(settings.rpm)
        out["x-ratelimit-remaining-requests"] = str(max(0, settings.rpm - counts.requests))
        out["x-ratelimit-reset-requests"] = reset_text(leaves(counts.requests_oldest, now))
    if settings.tpm is not None:
        out["x-ratelimit-limit-tokens"] = str(settings.tpm)
        out["x-ratelimit-remaining-tokens"] = str(max(0, settings.tpm - counts.tokens))
        out["x-ratelimit-reset-tokens"] = reset_text(leaves(counts.tokens_oldest, now))
    if settings.budget_tokens is not None and end is not None:
        out["x-llmroute-budget-limit-tokens"] = str(settings.budget_tokens)
        out["x-llmroute-budget-remaining-tokens"] = str(
            max(0, settings.budget_tokens - counts.spent)
        )
        out["x-llmroute-budget-reset"] = reset_text(end - now)
    nanos = getattr(settings, "budget_nanos", None)
    if nanos is not None and end is not None:
        out["x-llmroute-budget-limit-usd"] = usd(nanos)
        out["x-llmroute-budget-remaining-usd"] = usd(max(0, nanos - counts.money))
        out["x-llmroute-budget-reset-usd"] = reset_text(end - now)
    return out


def least_left_headers(rows: Sequence[Row], now: float) -> dict[str, str]:
    """The headers of the scope with the least left, for requests, tokens and the budget each
    (with one scope: its own headers)."""
    if len(rows) == 1:
        scope, counts, end = rows[0]
        return scope_headers(scope, counts, now, end)
    out: dict[str, str] = {}
    kinds: tuple[tuple[str, Callable[[Any, Counts], int], Callable[[str], bool]], ...] = (
        ("rpm", lambda s, c: (s.rpm or 0) - c.requests, lambda k: k.endswith("-requests")),
        ("tpm", lambda s, c: (s.tpm or 0) - c.tokens, lambda k: k.endswith("-tokens")),
        (
            "budget_tokens",
            lambda s, c: (s.budget_tokens or 0) - c.spent,
            lambda k: k.startswith("x-llmroute-budget") and not k.endswith("-usd"),
        ),
        (
            "budget_nanos",
            lambda s, c: (s.budget_nanos or 0) - c.money,
            lambda k: k.startswith("x-llmroute-budget") and k.endswith("-usd"),
        ),
    )
    for attribute, left, mark in kinds:
        candidates = [r for r in rows if getattr(r[0], attribute) is not None]
        if not candidates:
            continue
        scope, counts, end = min(candidates, key=lambda r: left(r[0], r[1]))
        own = scope_headers(scope, counts, now, end)
        out.update((k, v) for k, v in own.items() if mark(k))
    return out


# What an admission decided: admitted, or refused on one limit.
ADMITTED, REQUESTS, TOKENS, TOO_LARGE, BUDGET, CONCURRENCY, MONEY = range(7)


def _upper(label: str) -> str:
    return label[:1].upper() + label[1:]


def refusal(
    scope: Scope,
    tokens: int,
    counts: Counts,
    verdict: int,
    now: float,
    end: float | None,
    headers: dict[str, str],
    money: int = 0,
) -> Refusal:
    """The refusal for ``verdict`` on ``scope``; ``headers``: the answer's limits headers;
    ``money``: the request's dearest cost (nano-dollars)."""
    s = scope
    if verdict == REQUESTS:
        wait = leaves(counts.requests_oldest, now)
        used = f"Limit {s.rpm}, Used {counts.requests}"
        return _rate_refusal("requests", s.label, used, wait, headers)
    if verdict == TOO_LARGE:
        return Refusal(
            429,
            "too_large",
            "rate_limit_exceeded",
            "tokens",
            f"Request too large for {s.label} on tokens per minute (TPM): Limit "
            f"{s.tpm}, Requested {tokens}. Send a shorter prompt or a smaller max_tokens.",
            headers | {"x-should-retry": "false"},
        )
    if verdict == TOKENS:
        wait = leaves(counts.tokens_oldest, now)
        used = f"Limit {s.tpm}, Used {counts.tokens}, Requested {tokens}"
        return _rate_refusal("tokens", s.label, used, wait, headers)
    return _budget_refusal(s, counts, verdict, (end or now) - now, headers, money)


def _rate_refusal(
    kind: str, label: str, used: str, wait: float, headers: dict[str, str]
) -> Refusal:
    """Over ``rpm`` (``kind`` ``requests``) or ``tpm`` (``tokens``): OpenAI's
    ``rate_limit_exceeded``, to be retried in ``wait`` seconds."""
    per_minute = "requests per minute (RPM)" if kind == "requests" else "tokens per minute (TPM)"
    return Refusal(
        429,
        kind,
        "rate_limit_exceeded",
        kind,
        f"Rate limit reached for {label} on {per_minute}: {used}. Please try again in "
        f"{reset_text(wait)}.",
        headers | retry_headers(wait),
    )


def _budget_refusal(
    scope: Scope, counts: Counts, verdict: int, wait: float, headers: dict[str, str], money: int
) -> Refusal:
    """A spent budget (``BUDGET``, or ``MONEY`` when ``money`` does not fit): OpenAI's
    ``insufficient_quota``, not to be retried before the period ends in ``wait`` seconds."""
    if verdict == MONEY:
        budget = scope.budget_nanos or 0
        whole = "" if money <= budget else " (more than the whole budget)"
        message = (
            f"{_upper(scope.label)} has ${usd(max(0, budget - counts.money))} left of its "
            f"budget of ${usd(budget)} for this period, and this request may cost up to "
            f"${usd(money)}{whole}; the budget renews in {reset_text(wait)}. A smaller "
            "max_tokens costs less."
        )
    else:
        message = (
            f"{_upper(scope.label)} has used its budget of {scope.budget_tokens} tokens for "
            f"this period; it renews in {reset_text(wait)}."
        )
    return Refusal(
        429,
        "budget",
        "insufficient_quota",
        "insufficient_quota",
        message,
        headers | retry_headers(wait) | {"x-should-retry": "false"},
    )


def verdict_of(
    scopes: Sequence[Scope], rows: Sequence[Counts], tokens: int, money: int = 0
) -> tuple[int, int]:
    """The first limit a request of ``tokens`` would pass, and its scope's index (``ADMITTED,
    -1`` when none): too large for any scope first (it can never be admitted), then each
    scope's requests, tokens and budget in order."""
    for i, s in enumerate(scopes):
        if s.tpm is not None and tokens > s.tpm:
            return TOO_LARGE, i
    for i, (s, c) in enumerate(zip(scopes, rows, strict=True)):
        if s.rpm is not None and c.requests + 1 > s.rpm:
            return REQUESTS, i
        if s.tpm is not None and c.tokens + tokens > s.tpm:
            return TOKENS, i
        if s.budget_tokens is not None and c.spent >= s.budget_tokens:
            return BUDGET, i
        if s.budget_nanos is not None and c.money + money > s.budget_nanos:
            return MONEY, i
    return ADMITTED, -1
