"""What a routed request cost: each attempt's usage priced, the attempts summed by kind.

An attempt's cost comes from the usage its vendor reported for it (:attr:`AttemptReport.usage`,
read as its provider's ``[usage]`` fields say, :func:`llmroute.pricing.read_usage`). Where the
vendor reported none, llmroute counts (docs/cost.md, "What llmroute assumes"):

- an attempt cancelled before its first token (a losing hedge or race, a first-token timeout)
  was billed its whole prompt, as uncached input, and no answer tokens;
- an attempt cancelled after its first token (it lost the race as it answered) was billed its
  prompt and the answer tokens it streamed before it was closed;
- an attempt that broke mid-answer, or whose stream its caller closed before its end, was
  billed its prompt (the vendor's count, cache reads included, where it sent one before the
  answer: Anthropic's ``message_start``) and the tokens it delivered;
- a continuation's prompt is the request's prompt and the answer so far;
- an attempt that failed before its first token (an error status, a refused connection) was
  not billed.

Every such figure is an estimate and says so (``Cost.estimated``). Prompt tokens are llmroute's
own count (four characters a token) unless the vendor reported them.

The engine gives each request's report a pricer (:func:`pricer_for`); nothing is priced until
``route.cost`` is read. The metrics, which count every request as it ends, take
:meth:`RoutePricer.amounts`: a whole answer at a flat price is priced from its usage without
building a :class:`~llmroute.pricing.Cost` (a few microseconds), anything else by
:func:`route_cost`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .._prices import UsageFields
from .._types import AttemptReport, RouteCost, RouteReport
from ..pricing import Cost, TokenUsage, UsageError, cost_of, read_usage
from ..protocols import adapter_for
from .route import Route, RouteTarget

__all__ = ["RoutePricer", "attempt_kind", "lost_cost", "pricer_for", "route_cost", "saved_by"]

NO_USAGE = "no usage from the vendor: llmroute's count of the tokens"
CANCELLED = "cancelled before its first token: its prompt assumed billed, no answer tokens"
LOST = "cancelled as it answered: its prompt and the tokens it streamed assumed billed"
BROKE = "broke mid-answer: its answer tokens counted by llmroute"
FAILED = "failed before its first token: assumed not billed"
CUT = (
    "closed before its end: its prompt as its vendor counted it, the tokens it streamed "
    "assumed billed"
)
CUT_BLIND = (
    "closed before its end and its vendor's usage: its prompt assumed billed as uncached "
    "input (llmroute's count), and the tokens it streamed"
)
_GROWING = frozenset({"won", "interrupted", "pending"})
"""Outcomes whose usage may still change (an answer being read): priced again when read."""


def attempt_kind(record: AttemptReport) -> str:
    """``"answer"``, ``"continuation"``, ``"hedge"`` or ``"retry"`` (:class:`RouteCost`); a
    probe of ``warmup(probe=True)``'s, whatever its outcome: ``"probe"``."""
    if record.reason == "probe":
        return "probe"
    if record.reason == "continuation":
        return "continuation"
    if record.outcome in ("won", "interrupted"):
        return "answer"
    if record.outcome in ("cancelled", "pending"):
        return "hedge"
    return "retry"


def _fields(target: RouteTarget) -> UsageFields:
    return target.usage_fields or adapter_for(target.protocol).usage_fields


def _as_json(usage: Any) -> Mapping[str, Any] | None:
    if isinstance(usage, Mapping):
        return usage
    dump = getattr(usage, "model_dump", None)
    return dump() if dump is not None else None


def _today() -> datetime.date:
    return datetime.datetime.now(datetime.UTC).date()


def _priced(target: RouteTarget, tokens: TokenUsage, *why: str) -> Cost:
    price = target.price
    day = _today() if price is not None and price.valid_until is not None else None
    cost = cost_of(tokens, price, model=target.model, day=day)
    if why and cost.amount is not None:
        cost = dataclasses.replace(cost, estimated=(*why, *cost.estimated))
    return cost


def _vendor_tokens(target: RouteTarget, usage: Any) -> TokenUsage | str:
    """The vendor's usage sorted into token classes, or why it cannot be."""
    data = _as_json(usage)
    if data is None:
        return f"usage of an unknown shape ({type(usage).__name__})"
    try:
        return read_usage(data, _fields(target))
    except UsageError as exc:
        return str(exc)


def lost_cost(target: RouteTarget, usage: Any, prompt: int, streamed: int | None) -> Cost:
    """An attempt that reached its first token after another won: its prompt (the vendor's
    count, where it sent one before the answer: Anthropic does) and ``streamed`` answer tokens;
    ``streamed=None``: a whole answer (not streamed), its ``usage`` exact."""
    tokens = _vendor_tokens(target, usage) if usage is not None else None
    if isinstance(tokens, str):
        return Cost(None, unknown=tokens)
    if streamed is None:
        return (
            _priced(target, tokens)
            if tokens is not None
            else _priced(target, TokenUsage(input=prompt), NO_USAGE)
        )
    if tokens is None:
        tokens = TokenUsage(input=prompt)
    return _priced(target, dataclasses.replace(tokens, output=max(tokens.output, streamed)), LOST)


def _cost(record: AttemptReport, target: RouteTarget, prompt: int) -> Cost:
    """The cost of an attempt the engine did not price when it ended."""
    if record.outcome not in ("won", "interrupted"):
        if record.outcome in ("cancelled", "timeout", "pending"):
            return _priced(target, TokenUsage(input=prompt), CANCELLED)
        return Cost(Decimal(0), estimated=(FAILED,))
    delivered = record.tokens_estimate or record.tokens or 0
    if record.usage is None:
        why = (CUT_BLIND,) if record.cut else (NO_USAGE,)
        return _priced(target, TokenUsage(input=prompt, output=delivered), *why)
    tokens = _vendor_tokens(target, record.usage)
    if isinstance(tokens, str):
        return Cost(None, unknown=tokens)
    if record.cut:  # the vendor's usage so far (its prompt), the tokens it streamed
        return _priced(
            target, dataclasses.replace(tokens, output=max(tokens.output, delivered)), CUT
        )
    if record.outcome == "interrupted" and delivered > tokens.output:
        return _priced(target, dataclasses.replace(tokens, output=delivered), BROKE)
    return _priced(target, tokens)


def route_cost(route: Route, prompt_tokens: int, report: RouteReport) -> RouteCost:
    """Every attempt of ``report`` priced (each once) and summed by kind."""
    kinds: dict[str, Decimal] = {}
    unknown: list[str] = []
    estimated: list[str] = []
    currencies: set[str] = set()
    delivered = 0  # the answer so far, which a continuation's prompt repeats
    for record in report.attempts:
        cost = record.cost
        if cost is None or record.outcome in _GROWING:
            try:
                target = route.target(record.target)
            except KeyError:
                cost = Cost(None, unknown=f"not a target of {route.name!r}")
            else:
                prompt = prompt_tokens + (delivered if record.reason == "continuation" else 0)
                cost = record.cost = _cost(record, target, prompt)
        if record.outcome == "interrupted":
            delivered += record.tokens or 0
        if cost.amount is None:
            unknown.append(f"{record.target}: {cost.unknown}")
            continue
        if cost.currency is not None:
            currencies.add(cost.currency)
        kind = attempt_kind(record)
        kinds[kind] = kinds.get(kind, Decimal(0)) + cost.amount
        estimated.extend(f"{record.target}: {why}" for why in cost.estimated if cost.amount)
    if len(currencies) > 1:
        unknown.append(f"attempts priced in several currencies ({', '.join(sorted(currencies))})")
    amount = None if unknown else sum(kinds.values(), Decimal(0))
    currency = currencies.pop() if len(currencies) == 1 else None
    return RouteCost(amount, currency, kinds, tuple(unknown), tuple(dict.fromkeys(estimated)))


class _Rates:
    """A target's flat price, read once, for pricing a whole answer's usage without building
    a :class:`~llmroute.pricing.Cost` (the metrics' path: a few microseconds a request). Each
    rate is kept as a whole number of ``10**exponent`` currency units per token, so an answer's
    cost is integer arithmetic, exact. A price with a GPU-hour rate or an end date is not flat:
    ``None`` instead (a long prompt's tier goes to the full pricing too)."""

    __slots__ = ("currency", "exponent", "includes_cache", "paths", "rates", "tier_above")

    def __init__(self, target: RouteTarget) -> None:
        price = target.price
        assert price is not None
        fields = _fields(target)
        self.includes_cache = fields.prompt_includes_cache
        paths = (
            fields.prompt,
            fields.cache_read,
            fields.cache_write,
            fields.cache_write_1h,
            fields.completion,
            fields.reasoning,
        )
        self.paths = tuple(
            (index, tuple(path.split("."))) for index, path in enumerate(paths) if path is not None
        )
        self.currency = price.currency
        reasoning = price.reasoning if price.reasoning is not None else price.output
        rates = (
            price.input,
            price.cached_input,
            price.cache_write,
            price.cache_write_1h,
            price.output,
            reasoning,
        )
        per_token = [None if r is None else r / _MILLION for r in rates]
        exponent = min((int(r.as_tuple().exponent) for r in per_token if r is not None), default=0)
        self.exponent = exponent
        self.rates: tuple[Any, ...] = tuple(  # int, or None: no price (a TypeError in units)
            None if r is None else int(r.scaleb(-exponent)) for r in per_token
        )
        self.tier_above = price.tiers[0].above_prompt_tokens if price.tiers else None
        """Prompts longer than this have a tier's price: the full pricing decides."""

    def units(self, usage: Any) -> int | None:
        """What ``usage`` costs in ``10**exponent`` units; ``None`` where the full pricing must
        decide (a count that is not a whole number, tokens of a class without a price)."""
        counts = [0, 0, 0, 0, 0, 0]
        for index, path in self.paths:
            value = usage
            for part in path:
                value = value.get(part) if type(value) is dict else getattr(value, part, None)
                if value is None:
                    break
            else:
                if type(value) is not int or value < 0:
                    return None
                counts[index] = value
        prompt, read, writes, writes_1h, output, reasoning = counts
        fresh = prompt - read - writes if self.includes_cache else prompt
        if fresh < 0 or writes_1h > writes or reasoning > output:
            return None
        above = self.tier_above
        if above is not None and fresh + read + writes > above:
            return None
        r_input, r_read, r_write, r_write_1h, r_output, r_reasoning = self.rates
        try:
            return (
                (fresh * r_input if fresh else 0)
                + (read * r_read if read else 0)
                + ((writes - writes_1h) * r_write if writes > writes_1h else 0)
                + (writes_1h * r_write_1h if writes_1h else 0)
                + ((output - reasoning) * r_output if output > reasoning else 0)
                + (reasoning * r_reasoning if reasoning else 0)
            )
        except TypeError:  # tokens of a class without a price (None)
            return None


def _rates(route: Route, target: RouteTarget) -> _Rates | None:
    book = route.price_book
    try:
        return book[target.name]
    except KeyError:
        price = target.price
        flat = price is not None and price.gpu_hour is None and price.valid_until is None
        rates = book[target.name] = _Rates(target) if flat else None
        return rates


class RoutePricer:
    """Prices the attempts of a route's requests (:attr:`RouteReport.pricer`, one per route):
    called with a report, the whole :class:`RouteCost`; :meth:`amounts`, only what the metrics
    count."""

    __slots__ = ("route",)

    def __init__(self, route: Route) -> None:
        self.route = route

    def __call__(self, report: RouteReport) -> RouteCost:
        return route_cost(self.route, report.prompt_tokens, report)

    def amounts(self, report: RouteReport) -> list[tuple[AttemptReport, int | None, int, str]]:
        """Each attempt with its cost as a whole number of ``10**exponent`` units (``None``:
        unknown), the exponent and the currency. A whole answer of a flat price is priced
        from its usage in integers; anything else by :func:`route_cost`."""
        attempts = report.attempts
        if len(attempts) == 1:
            record = attempts[0]
            if (
                record.outcome == "won"
                and record.usage is not None
                and record.cost is None
                and not record.cut
            ):
                route = self.route
                rates = route.price_book.get(record.target, _UNREAD)
                if rates is _UNREAD:
                    try:
                        rates = _rates(route, route.target(record.target))
                    except KeyError:
                        rates = None
                if rates is not None:
                    units = rates.units(record.usage)
                    if units is not None:
                        return [(record, units, rates.exponent, rates.currency)]
        self(report)
        out: list[tuple[AttemptReport, int | None, int, str]] = []
        for record in attempts:
            cost = record.cost
            if cost is None:
                continue
            amount = cost.amount
            if amount is None:
                out.append((record, None, 0, ""))
            else:
                exponent = int(amount.as_tuple().exponent)
                out.append((record, int(amount.scaleb(-exponent)), exponent, cost.currency or ""))
        return out


_UNREAD = object()
_MILLION = Decimal(1_000_000)


def pricer_for(route: Route) -> RoutePricer:
    """The pricer of ``route``'s reports (:attr:`RouteReport.pricer`), made once per route."""
    book = route.price_book
    try:
        return book[_PRICER]
    except KeyError:
        pricer = book[_PRICER] = RoutePricer(route)
        return pricer


_PRICER = ""  # its key in the route's price book (no target is named "")


def _stored_usage(chunks: list[dict[str, Any]] | None, completion: Any) -> Any:
    """The usage a stored chat answer carries (openai's shape, as the cache keeps it)."""
    if isinstance(completion, Mapping):
        return completion.get("usage")
    for chunk in reversed(chunks or ()):
        if isinstance(chunk, Mapping) and chunk.get("usage"):
            return chunk["usage"]
    return None


def saved_by(route: Route, entry: Any) -> Any:
    """For a cache hit's report (:attr:`RouteReport.saved`): what the stored answer cost when
    its target (``entry.origin``) made it, priced when read; ``None`` when unknown. The cache
    keeps openai's usage object, so a vendor's cache writes count as input (an estimate)."""

    def saved() -> Decimal | None:
        usage = _stored_usage(entry.chunks, entry.completion)
        if usage is None or entry.kind != "chat" or entry.origin is None:
            return None
        try:
            target = route.target(entry.origin)
        except KeyError:
            return None
        target = dataclasses.replace(target, usage_fields=adapter_for("openai").usage_fields)
        tokens = _vendor_tokens(target, usage)
        return None if isinstance(tokens, str) else _priced(target, tokens).amount

    return saved
