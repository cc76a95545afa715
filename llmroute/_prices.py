"""What a model costs and where a vendor reports the tokens it bills: the schema of a catalog
file's (or a config's) ``[prices."<model>"]`` tables and its ``[usage]`` table.

Prices are :class:`decimal.Decimal` amounts per million tokens, read from TOML numbers through
their shortest decimal spelling (``0.0028`` stays ``0.0028``), so sums never drift. The money
arithmetic lives in :mod:`llmroute.pricing`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

__all__ = [
    "ANY_MODEL",
    "GpuHour",
    "ModelPrice",
    "PerMillion",
    "PriceTier",
    "UsageFields",
]

ANY_MODEL = "*"
"""The ``prices`` key that prices every model a provider has no own price for (self-hosted)."""


def decimal_input(value: Any) -> Any:
    if isinstance(value, bool):
        return value  # refused below: true is not a price
    if isinstance(value, float | int):
        return Decimal(repr(value))  # a TOML 0.3 is 0.3, not 0.299999...
    if isinstance(value, str):
        return value.strip()
    return value


PerMillion = Annotated[
    Decimal,
    BeforeValidator(decimal_input),
    Field(ge=0, allow_inf_nan=False, strict=False),
]
"""A price per million tokens, in the price's currency: zero or more, never NaN."""


class _Rates(BaseModel):
    """The per-token-class prices a base price and a tier share (per million tokens). A class
    left unset has no known price: tokens in it make a cost unknown (reasoning: see below)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: PerMillion | None = None
    """Prompt tokens not read from the vendor's cache."""
    cached_input: PerMillion | None = None
    """Prompt tokens read from the vendor's prompt cache (a cache hit)."""
    cache_write: PerMillion | None = None
    """Prompt tokens written to the cache, where the vendor bills writes apart (Anthropic's
    5-minute writes)."""
    cache_write_1h: PerMillion | None = None
    """Prompt tokens written to a 1-hour cache (Anthropic)."""
    output: PerMillion | None = None
    """Answer tokens, reasoning included unless ``reasoning`` prices it apart."""
    reasoning: PerMillion | None = None
    """Reasoning tokens, where the vendor prices them apart from other output; unset: output."""


class PriceTier(_Rates):
    """The prices of a request whose prompt (cached and written tokens included) is longer than
    ``above_prompt_tokens``: they replace the base prices for every token of that request."""

    above_prompt_tokens: Annotated[StrictInt, Field(ge=1)]
    priced: bool = Field(True, strict=True)
    """False: the vendor charges more above the threshold but the catalog does not know how
    much, so such a request's cost is unknown (never the base price, which would be too low)."""

    @pydantic.model_validator(mode="after")
    def _prices_or_not(self) -> PriceTier:
        given = [name for name in _Rates.model_fields if getattr(self, name) is not None]
        if not self.priced and given:
            raise ValueError(f"priced = false takes no prices, got {', '.join(given)}")
        if self.priced and (self.input is None or self.output is None):
            raise ValueError("a tier needs input and output (or priced = false)")
        return self


class GpuHour(BaseModel):
    """A self-hosted server priced by its GPU time: ``usd`` an hour at a stated throughput."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd: PerMillion
    """What an hour of the server's GPUs costs, in USD."""
    tokens_per_second: Annotated[StrictInt, Field(ge=1)]
    """Tokens (prompt and answer together) the server processes a second at its usual load."""

    def per_million(self) -> Decimal:
        """The price of a million tokens at that throughput: ``usd / (tokens an hour) * 10**6``."""
        return self.usd * 1_000_000 / (self.tokens_per_second * 3600)


class ModelPrice(_Rates):
    """One ``[prices."<model>"]`` table: a model's price per million tokens, by token class."""

    currency: Literal["USD", "CNY"] = "USD"
    per: Literal["1M tokens"] = "1M tokens"
    tiers: tuple[PriceTier, ...] = ()
    """Prices of long prompts, by increasing ``above_prompt_tokens``."""
    gpu_hour: GpuHour | None = None
    """Instead of token prices (config only): one price for every token class, from GPU time."""
    valid_until: datetime.date | None = None
    """The last day the price is known to hold (a promotion's end); after it, unknown."""
    estimate: str = ""
    """Why a cost from this price is an estimate even with exact usage (e.g. DeepSeek's
    off-peak hours at half price, charged here at the peak price)."""
    note: str = ""

    @pydantic.model_validator(mode="after")
    def _complete(self) -> ModelPrice:
        if self.gpu_hour is not None:
            given = [name for name in _Rates.model_fields if getattr(self, name) is not None]
            if given or self.tiers:
                raise ValueError(f"gpu_hour replaces token prices, got {', '.join(given)}")
            if self.currency != "USD":
                raise ValueError("gpu_hour is in USD: currency must be USD")
            return self
        if self.input is None or self.output is None:
            raise ValueError("a price needs input and output (per million tokens), or gpu_hour")
        bounds = [tier.above_prompt_tokens for tier in self.tiers]
        if bounds != sorted(set(bounds)):
            raise ValueError(f"tiers: above_prompt_tokens must increase, got {bounds}")
        return self

    def rates(self, prompt_tokens: int) -> _Rates | None:
        """The rates of a request with ``prompt_tokens``; ``None`` when that length's price is
        not known (an unpriced tier)."""
        if self.gpu_hour is not None:
            each = self.gpu_hour.per_million()
            return _Rates(
                input=each, cached_input=each, cache_write=each, cache_write_1h=each, output=each
            )
        chosen: _Rates = self
        for tier in self.tiers:
            if prompt_tokens > tier.above_prompt_tokens:
                chosen = tier
        if isinstance(chosen, PriceTier) and not chosen.priced:
            return None
        return chosen


class UsageFields(BaseModel):
    """Where a vendor's ``usage`` object reports each class of tokens it bills (dotted paths
    into the object), and how the counts overlap: the catalog's ``[usage]`` table. A provider
    without one uses its protocol's (its adapter's ``usage_fields``,
    :func:`llmroute.protocols.adapter_for`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str
    """All prompt tokens, or those not read from or written to the cache (see the next)."""
    prompt_includes_cache: bool = Field(strict=True)
    """Whether ``prompt`` counts the cached and written tokens too (OpenAI: yes; Anthropic: no)."""
    cache_read: str | None = None
    cache_write: str | None = None
    """All tokens written to the cache (both lifetimes)."""
    cache_write_1h: str | None = None
    """The part of ``cache_write`` written to a 1-hour cache."""
    completion: str
    """Answer tokens."""
    reasoning: str | None = None
    """Reasoning tokens, a part of ``completion`` (the vendor's own count, for the report)."""
    output_from_total: str | None = None
    """A total-tokens path: the answer is ``total - all prompt tokens`` rather than
    ``completion`` (Gemini's OpenAI endpoint has left thinking out of ``completion_tokens``)."""


@dataclass(frozen=True)
class CostLine:
    """One token class of a cost: ``tokens`` at ``per_million`` make ``amount``."""

    token_class: str
    tokens: int
    per_million: Decimal
    amount: Decimal


@dataclass(frozen=True)
class Cost:
    """What an attempt cost: ``amount`` in ``currency``, or ``None`` with the reason in
    ``unknown``. ``estimated`` says why a known amount may differ from the vendor's bill."""

    amount: Decimal | None
    currency: str | None = None
    lines: tuple[CostLine, ...] = ()
    unknown: str = ""
    estimated: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return self.amount is not None
