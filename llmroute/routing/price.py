"""What one request is expected to cost on a target, for routing decisions.

A :class:`TargetPrice` is a target's price (the catalog's or the config's
:class:`~llmroute._prices.ModelPrice`) turned into floats per token, so that a policy can rank
targets and a hedge budget can count money in well under a microsecond. The exact, billed
amounts stay :mod:`llmroute.pricing`'s (``Decimal``); these are estimates:

    expected cost = prompt tokens (the route's estimate, characters / 4) x input price
                    + expected answer tokens x output price

where the expected answer is the request's own ``max_tokens`` (``max_completion_tokens``,
``max_output_tokens``) when it is below :data:`EXPECTED_ANSWER_TOKENS`, else that constant.
The answer's length depends on the prompt far more than on the target serving the same model,
so one figure for every target ranks them as their prices do. The prompt is priced as uncached
input (an upper bound where a vendor's cache would hit).

A price that is not known is ``None``, never zero: no price at all, a price in another currency
than USD (amounts in two currencies do not compare), a long prompt above a tier the catalog
cannot price, or a promotion past its ``valid_until`` day.
"""

from __future__ import annotations

import calendar
import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._prices import ModelPrice

__all__ = ["EXPECTED_ANSWER_TOKENS", "TargetPrice", "answer_tokens", "target_price"]

EXPECTED_ANSWER_TOKENS = 256
"""The answer length a request is priced at when its ``max_tokens`` does not say less."""
_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True, slots=True)
class TargetPrice:
    """A target's price per token, in USD (floats: for ranking and budgets, not for bills)."""

    input: float
    output: float
    tiers: tuple[tuple[int, float | None, float | None], ...] = ()
    """(above this many prompt tokens, input, output); ``None`` prices: not known there."""
    expires_at: float | None = None
    """Epoch seconds from which the price no longer holds (the day after ``valid_until``)."""

    def estimate(self, prompt_tokens: int, answer: int, now: float | None = None) -> float | None:
        """The expected cost of a request of ``prompt_tokens`` with an ``answer`` of that many
        tokens, in USD; ``None`` when the price does not hold for it."""
        if self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at:
            return None
        rate_in, rate_out = self.input, self.output
        for above, tier_in, tier_out in self.tiers:
            if prompt_tokens > above:
                if tier_in is None or tier_out is None:
                    return None
                rate_in, rate_out = tier_in, tier_out
        return prompt_tokens * rate_in + answer * rate_out


def target_price(price: ModelPrice | None, model: str) -> tuple[TargetPrice | None, str]:
    """``price`` as a :class:`TargetPrice`, or ``None`` with the reason it cannot be used."""
    if price is None:
        return None, f"no price known for {model}"
    if price.currency != "USD":
        return None, f"the price of {model} is in {price.currency}, not USD"
    expires = None
    if price.valid_until is not None:
        day_after = price.valid_until + datetime.timedelta(days=1)
        expires = float(calendar.timegm(day_after.timetuple()))
    if price.gpu_hour is not None:
        each = float(price.gpu_hour.per_million()) / 1e6
        return TargetPrice(each, each, expires_at=expires), ""
    assert price.input is not None and price.output is not None  # a ModelPrice guarantees it
    tiers = tuple(
        (
            tier.above_prompt_tokens,
            None if tier.input is None else float(tier.input) / 1e6,
            None if tier.output is None else float(tier.output) / 1e6,
        )
        for tier in price.tiers
    )
    base = TargetPrice(float(price.input) / 1e6, float(price.output) / 1e6, tiers, expires)
    return base, ""


def answer_tokens(body: Mapping[str, Any]) -> int:
    """The answer length a request is priced at: its own limit if below
    :data:`EXPECTED_ANSWER_TOKENS`, else that."""
    for name in _LIMITS:
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return min(limit, EXPECTED_ANSWER_TOKENS)
    return EXPECTED_ANSWER_TOKENS
