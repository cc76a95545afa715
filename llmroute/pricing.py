"""Money: what one attempt cost, from the usage its vendor reported and the model's price.

Pure functions, no I/O: :func:`read_usage` sorts a vendor's ``usage`` object into token classes
as the provider's ``[usage]`` fields say (:class:`llmroute._prices.UsageFields`), and
:func:`cost_of` prices them with a :class:`~llmroute._prices.ModelPrice` (the catalog's, or a
config's). :func:`attempt_cost` does both for a provider and model.

Amounts are :class:`decimal.Decimal`: a price per million tokens times a whole number of tokens
divided by a million is exact in decimal, and so is any sum of them (no float drift, no rounding
until a caller shows a figure). A model without a known price costs ``None`` with the reason,
never a silent zero.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ._prices import ANY_MODEL, Cost, CostLine, ModelPrice, UsageFields

if TYPE_CHECKING:
    from ._catalog import ProviderSpec

__all__ = [
    "Cost",
    "CostLine",
    "TokenUsage",
    "UsageError",
    "attempt_cost",
    "cost_of",
    "find_price",
    "read_usage",
]

_MILLION = Decimal(1_000_000)


class UsageError(ValueError):
    """Raised when a vendor's usage object has a count that is not a whole number of tokens, or
    counts that contradict each other (more cached tokens than prompt tokens)."""


@dataclass(frozen=True)
class TokenUsage:
    """One attempt's billed tokens, by class; no token is in two classes, except that
    ``reasoning`` is the part of ``output`` the vendor reported as reasoning."""

    input: int = 0
    """Prompt tokens neither read from nor written to the vendor's cache."""
    cache_read: int = 0
    cache_write: int = 0
    """Prompt tokens written to a 5-minute cache (or the vendor's only one)."""
    cache_write_1h: int = 0
    output: int = 0
    """Answer tokens, reasoning included."""
    reasoning: int = 0

    @property
    def prompt(self) -> int:
        """Every prompt token, as a vendor's long-prompt price tier counts them."""
        return self.input + self.cache_read + self.cache_write + self.cache_write_1h


def _count(usage: Mapping[str, Any], path: str | None) -> int | None:
    """The token count at a dotted ``path`` of ``usage``; ``None`` where the vendor left it out."""
    if path is None:
        return None
    value: Any = usage
    for part in path.split("."):
        if not isinstance(value, Mapping) or value.get(part) is None:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"usage.{path}: expected a whole number of tokens, got {value!r}")
    return value


def _part(whole: int, part: int, whole_name: str, part_name: str) -> int:
    if part > whole:
        raise UsageError(f"usage: {part_name} ({part}) is more than {whole_name} ({whole})")
    return whole - part


def read_usage(usage: Mapping[str, Any], fields: UsageFields) -> TokenUsage:
    """``usage`` (a vendor's usage object, as JSON) sorted into token classes by ``fields``."""
    prompt = _count(usage, fields.prompt) or 0
    cache_read = _count(usage, fields.cache_read) or 0
    writes = _count(usage, fields.cache_write) or 0
    writes_1h = _count(usage, fields.cache_write_1h) or 0
    writes_5m = _part(writes, writes_1h, fields.cache_write or "cache writes", "1-hour writes")
    fresh = prompt
    if fields.prompt_includes_cache:
        fresh = _part(prompt, cache_read + writes, fields.prompt, "cached and written tokens")
    output = _count(usage, fields.completion) or 0
    total = _count(usage, fields.output_from_total)
    if total is not None:
        all_prompt = fresh + cache_read + writes
        output = max(output, _part(total, all_prompt, fields.output_from_total or "", "prompt"))
    reasoning = _count(usage, fields.reasoning) or 0
    _part(output, reasoning, "the answer's tokens", fields.reasoning or "reasoning")
    return TokenUsage(fresh, cache_read, writes_5m, writes_1h, output, reasoning)


def find_price(prices: Mapping[str, ModelPrice], model: str) -> ModelPrice | None:
    """The price of ``model``: its own, else the provider's ``"*"`` price, else ``None``."""
    return prices.get(model, prices.get(ANY_MODEL))


def _classes(usage: TokenUsage) -> list[tuple[str, int, str]]:
    """(token class, tokens, rate field) for every class the usage has tokens in."""
    answer = usage.output - usage.reasoning
    pairs = [
        ("input", usage.input, "input"),
        ("cache_read", usage.cache_read, "cached_input"),
        ("cache_write", usage.cache_write, "cache_write"),
        ("cache_write_1h", usage.cache_write_1h, "cache_write_1h"),
        ("output", answer, "output"),
        ("reasoning", usage.reasoning, "reasoning"),
    ]
    return [pair for pair in pairs if pair[1] > 0]


def cost_of(
    usage: TokenUsage,
    price: ModelPrice | None,
    *,
    model: str,
    day: datetime.date | None = None,
) -> Cost:
    """What ``usage`` of ``model`` cost at ``price`` (on ``day``, for a price that expires)."""
    if price is None:
        return Cost(None, unknown=f"no price known for {model}")
    if day is not None and price.valid_until is not None and day > price.valid_until:
        return Cost(None, unknown=f"the price of {model} held until {price.valid_until}")
    rates = price.rates(usage.prompt)
    if rates is None:
        return Cost(None, unknown=f"no price known for {model} at {usage.prompt} prompt tokens")
    lines: list[CostLine] = []
    for token_class, tokens, field in _classes(usage):
        per_million = getattr(rates, field)
        if per_million is None and field == "reasoning":
            per_million = rates.output  # reasoning is billed as output unless priced apart
        if per_million is None:
            return Cost(None, unknown=f"no {field} price known for {model}")
        lines.append(CostLine(token_class, tokens, per_million, tokens * per_million / _MILLION))
    estimated: list[str] = []
    if price.estimate:
        estimated.append(price.estimate)
    if price.gpu_hour is not None:
        estimated.append("GPU time at the stated throughput")
    total = sum((line.amount for line in lines), Decimal(0))
    return Cost(total, price.currency, tuple(lines), estimated=tuple(estimated))


def attempt_cost(
    spec: ProviderSpec,
    model: str,
    usage: Mapping[str, Any],
    *,
    day: datetime.date | None = None,
) -> Cost:
    """What one attempt at ``model`` on the provider ``spec`` cost, from the ``usage`` object
    its answer carried (as JSON); a malformed usage object makes the cost unknown."""
    try:
        tokens = read_usage(usage, spec.usage_fields)
    except UsageError as exc:
        return Cost(None, unknown=str(exc))
    return cost_of(tokens, find_price(spec.prices, model), model=model, day=day)
