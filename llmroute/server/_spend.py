"""Budgets in money: what a gateway request may cost before it is sent, and what it cost.

A key's or team's ``budget_usd`` is counted in whole **nano-dollars** (10^-9 USD), the unit of
:data:`NANOS`, so a Redis script adds and compares it exactly (a budget of at most a million
dollars is at most 10^15 of them, within a Lua number's exact integers).

**Admitted on the most it may cost.** Every attempt it may be billed for
(:meth:`Prices.attempts`: a race's racers or the first and its hedges, an exploration, a
stream's continuations) is priced before it is sent at every target
its model name may use (a route's targets, a tiered name's routes' targets, or
``default_provider``'s model), and counted at the dearest
(:meth:`Prices.estimate`): its prompt at most one token per byte of its JSON body (a token is
at least one byte of text, and the body holds every message, tool and field besides) at the
dearer of the input price and the cache-write prices (a prompt may be written), and its
answer at ``max_tokens`` (``max_completion_tokens``, ``max_output_tokens``), or the dearest
target's context window when it names none. The admission script admits it only when the
scope's spend and that estimate fit in the budget.

**Settled on what it cost**: a routed answer's usage as its route report prices it
(:func:`answer_nanos`: its vendor's usage by token class, cached prompt tokens at the cached
price, cache writes at theirs, as ``route.cost`` says; a stream cut or broken after its vendor
counted its prompt, that prompt and the tokens sent); else (:meth:`Prices.request_cost`) the
gateway's count (the vendor's prompt and answer tokens, or what it delivered: a stream its
client cut before any usage is charged its prompt, as uncached input, and the tokens sent) at
the price of the target that answered, the dearest when none is known; a continued answer,
its first attempt as its route report prices it (:func:`continued_nanos`).
Its other attempts are added as its route report prices them (:func:`extra_nanos`, the
key's ``hedge_nanos``), each filed under the target that billed it. Each target's part is
rounded up to the next nano-dollar: never free, and the parts add up to the request's cost.

**Never free.** A target without a price in USD under a money budget is refused at start
(:func:`money_problem`, a :class:`~llmroute.ConfigError` naming ``budget_usd``) and, for what
the start could not see (an admin API key, a model of ``default_provider``, a price past its
``valid_until``), at the request (400 ``model_not_priced``).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from decimal import Decimal
from itertools import product
from typing import Any

from .._prices import ModelPrice
from .._types import RouteReport
from ..config import MAX_COUNT, Config, ResolvedProvider, Target
from ..pricing import TokenUsage, UsageError, cost_of, find_price, read_usage
from ..routing.costs import attempt_kind
from ..routing.windows import MAX_TOKENS_CAP, answer_room
from ._tenants import NANOS, Tenant, Tenants, to_nanos

__all__ = [
    "NANOS",
    "PriceUnknown",
    "Prices",
    "answer_nanos",
    "continued_nanos",
    "extra_nanos",
    "money_problem",
    "to_nanos",
]

MAX_NANOS = MAX_COUNT
"""The most one request is counted at (10^15 nano-dollars, a million dollars)."""
CURRENCY = "USD"
LATENCY_POLICIES = ("fastest", "hedge", "race", "cheapest")
"""Policies that may start more than one attempt before a first token (a race, hedges, an
exploration beside the first choice)."""


class PriceUnknown(Exception):
    """Raised when a request under a money budget may go to a target without a price in USD."""


def nanos_of(amount: Decimal) -> int:
    """An amount in USD as whole nano-dollars, rounded up, within ``0..MAX_NANOS``."""
    return max(0, min(math.ceil(amount * NANOS), MAX_NANOS))


EXTRA_KINDS = ("hedge", "retry", "continuation")
"""The kinds of a route report's attempts (:class:`~llmroute.RouteCost`) a request is charged
beside its answer."""


def extra_nanos(report: RouteReport | None) -> dict[str, int]:
    """What a routed request's attempts other than its answer cost (its hedges, retries and
    continuations, as its route report prices each), by the target that billed them, in
    nano-dollars rounded up per target; empty when the call was not routed or the report has
    no amount in USD."""
    cost = report.cost if report is not None else None
    if report is None or cost is None or cost.currency != CURRENCY:
        return {}
    by_target: dict[str, Decimal] = {}
    for record in report.attempts:
        priced = record.cost
        if priced is None or not priced.amount or priced.currency != CURRENCY:
            continue
        if attempt_kind(record) in EXTRA_KINDS:
            by_target[record.target] = by_target.get(record.target, Decimal(0)) + priced.amount
    return {target: nanos_of(amount) for target, amount in by_target.items() if amount > 0}


def answer_nanos(report: RouteReport | None) -> tuple[int, bool] | None:
    """A routed answer's own cost as its route report prices it from its vendor's usage (the
    prompt's cache reads at the cached price and its cache writes at theirs, read as the
    target's ``[usage]`` fields say, as ``route.cost`` does), in nano-dollars rounded up, and
    whether that is an estimate: a stream cut by its client or broken before its end, whose
    vendor had counted its prompt (Anthropic's ``message_start``), is its prompt as the vendor
    counted it and the tokens sent. ``None`` when its vendor sent no usage for it (an
    OpenAI-style stream cut before its last chunk), it was not routed or that cost is not
    known in USD: then :meth:`Prices.request_cost` prices the gateway's count."""
    if report is None or report.cache_hit or report.shared:
        return None
    cost = report.cost  # prices every attempt once
    if cost is None:
        return None
    answers = [record for record in report.attempts if attempt_kind(record) == "answer"]
    if len(answers) != 1 or answers[0].usage is None:
        return None
    answer = answers[0]
    if answer.outcome not in ("won", "interrupted"):
        return None
    priced = answer.cost
    if priced is None or priced.amount is None or priced.currency != CURRENCY:
        return None
    return nanos_of(priced.amount), answer.cut or answer.outcome == "interrupted"


def continued_nanos(report: RouteReport | None) -> int | None:
    """A continued answer's own part: what its first attempt cost (its prompt and the tokens it
    streamed before it broke, as its route report prices it), in nano-dollars rounded up;
    ``None`` when the answer was not continued or that cost is not known in USD. A continued
    stream's usage adds every attempt's answer tokens together, with the continuation's prompt
    (which holds the answer so far): priced at the first target, it would charge the
    continuation's part twice."""
    cost = report.cost if report is not None else None
    if report is None or cost is None or cost.currency != CURRENCY:
        return None
    if not any(attempt_kind(record) == "continuation" for record in report.attempts):
        return None
    answer = cost.answer
    return nanos_of(answer) if answer is not None else None


class Prices:
    """The price of every target the gateway may send to (see the module's docstring)."""

    def __init__(self, config: Config, providers: Mapping[str, ResolvedProvider]) -> None:
        self._config = config
        self._providers = providers

    def targets(self, model: str) -> list[Target]:
        """The targets a request to ``model`` may go to."""
        config = self._config
        tiered = config.tiered.get(model)
        routes = [model] if tiered is None else sorted({*tiered.tiers.values(), tiered.default})
        found = [t for r in routes if r in config.models for t in config.models[r].target_list()]
        if not found and config.default_provider is not None and model not in config.models:
            found = [Target(config.default_provider, model)]
        return found

    def price(self, target: Target, day: datetime.date | None = None) -> ModelPrice:
        """``target``'s price in USD; :class:`PriceUnknown` naming it when there is none."""
        provider = self._providers.get(target.provider)
        price = find_price(provider.spec.prices, target.model) if provider is not None else None
        if price is None:
            raise PriceUnknown(f"no price is known for target {target.name!r}")
        if price.currency != CURRENCY:
            raise PriceUnknown(f"target {target.name!r} is priced in {price.currency}, not USD")
        if day is not None and price.valid_until is not None and day > price.valid_until:
            raise PriceUnknown(
                f"the price of target {target.name!r} held until {price.valid_until}"
            )
        return price

    def _cost(self, target: Target, usage: TokenUsage, day: datetime.date) -> int:
        cost = cost_of(usage, self.price(target, day), model=target.model, day=day)
        if cost.amount is None:
            raise PriceUnknown(f"target {target.name!r}: {cost.unknown}")
        return nanos_of(cost.amount)

    def _window(self, target: Target) -> int | None:
        provider = self._providers.get(target.provider)
        return provider.spec.window_for(target.model) if provider is not None else None

    def attempts(self, model: str, body: Mapping[str, Any], kind: str) -> tuple[int, int]:
        """The most attempts a request to ``model`` may be billed for, over the routes it may
        use: those that may run at once before a first token, at most the route's targets
        (a race's ``race``, else the first and its hedges: ``max_hedges``, at least the one a
        latency goal may add; and an exploration while ``routing.explore`` is above 0), and
        the continuations of a broken stream (the route's ``max_continuations``; each re-sends
        the prompt and the answer so far)."""
        config = self._config
        tiered = config.tiered.get(model)
        routes = [model] if tiered is None else sorted({*tiered.tiers.values(), tiered.default})
        streamed = kind == "chat" and body.get("stream") is True
        first, continuations = 1, 0
        explore = int(config.routing.explore > 0)
        for name in routes:
            route = config.models.get(name)
            if route is None:
                continue
            if route.policy in LATENCY_POLICIES:
                start = route.race if route.policy == "race" else 1 + max(route.max_hedges, 1)
                first = max(first, min(len(route.targets), start + explore))
            if streamed and route.continue_on_break:
                continuations = max(continuations, route.max_continuations)
        return first, continuations

    def estimate(
        self, model: str, body: Mapping[str, Any], kind: str, size: int | None = None
    ) -> int:
        """The most a request to ``model`` may cost, in nano-dollars: every attempt it may be
        billed for (:meth:`attempts`) at the dearest target, its prompt at most a token a byte
        of its JSON (``size``: the bytes it came as; else encoded here) and a continuation's
        holding the whole answer (an embedding has none); :class:`PriceUnknown` when a target
        has no price, or the answer has no bound."""
        targets = self.targets(model)
        if not targets:
            raise PriceUnknown(f"no target of model {model!r} is known")
        day = datetime.datetime.now(datetime.UTC).date()
        if size is None:
            size = len(json.dumps(body, ensure_ascii=False).encode())
        prompt = min(size, MAX_TOKENS_CAP)
        room = answer_room(body, kind)
        first, continuations = self.attempts(model, body, kind)
        dearest = continued = 0
        vector = kind == "embeddings"  # an embedding bills its input alone
        for target in targets:
            answer = 0 if vector else room or self._window(target) or 0
            if not answer and not vector:
                raise PriceUnknown(
                    f"the request names no max_tokens and target {target.name!r} has no known "
                    "context window to bound its answer"
                )
            # Reasoning may be dearer than other output, and a cache write than fresh input.
            for reasoning, written in product((0, answer), self._write_classes(target)):
                usage = TokenUsage(output=answer, reasoning=reasoning, **{written: prompt})
                dearest = max(dearest, self._cost(target, usage, day))
                if continuations:
                    again = TokenUsage(
                        output=answer, reasoning=reasoning, **{written: prompt + answer}
                    )
                    continued = max(continued, self._cost(target, again, day))
        return min(first * dearest + continuations * continued, MAX_NANOS)

    def _write_classes(self, target: Target) -> tuple[str, ...]:
        """The token classes a prompt to ``target`` may be billed as: fresh input, and the
        cache writes it has a price for (Anthropic's 1-hour writes cost twice the input)."""
        price = self.price(target)
        writes = (("cache_write", price.cache_write), ("cache_write_1h", price.cache_write_1h))
        return ("input", *(name for name, rate in writes if rate is not None))

    def usage_cost(self, model: str, usage: Any) -> int | None:
        """What an answer to ``model`` on its one target (a model of ``default_provider``,
        not a route) cost by its vendor's ``usage``, each token class at its own price (read
        as the provider's ``[usage]`` fields say), in nano-dollars; ``None`` when ``model``
        has several targets or ``usage`` cannot be read."""
        targets = self.targets(model)
        provider = self._providers.get(targets[0].provider) if len(targets) == 1 else None
        dump = getattr(usage, "model_dump", None)
        data = usage if isinstance(usage, Mapping) else dump() if dump is not None else None
        if provider is None or not isinstance(data, Mapping):
            return None
        try:
            tokens = read_usage(data, provider.spec.usage_fields)
        except UsageError:
            return None
        return self._cost(targets[0], tokens, datetime.datetime.now(datetime.UTC).date())

    def request_cost(self, model: str, winner: str, prompt: int, completion: int) -> int:
        """What a request to ``model`` cost, in nano-dollars: ``prompt`` and ``completion``
        tokens at the price of ``winner`` (the target that answered; ``""``: the dearest).

        Its answer's part: :func:`extra_nanos` adds what its other attempts cost (its
        cancelled hedges and racers, retries and continuations, as its route report prices
        them)."""
        if not prompt and not completion:
            return 0
        day = datetime.datetime.now(datetime.UTC).date()
        usage = TokenUsage(input=prompt, output=completion)
        targets = self.targets(model)
        named = [t for t in targets if t.name == winner]
        return max(self._cost(t, usage, day) for t in (named or targets))


def _owners(tenants: Tenants) -> list[tuple[str, Tenant]]:
    """Each key with a money budget of its own or its team's, with the field that sets it."""
    found: list[tuple[str, Tenant]] = []
    for name, tenant in tenants.by_name.items():
        if tenant.settings.budget_usd is not None:
            found.append((f"the budget_usd of key {name!r}", tenant))
        elif tenant.team is not None and tenant.team.settings.budget_usd is not None:
            found.append((f"the budget_usd of team {tenant.team.name!r} (key {name!r})", tenant))
    return found


def money_problem(config: Config, tenants: Tenants, prices: Prices) -> str | None:
    """The first target a key under a money budget may use without a price in USD, as a
    sentence naming ``budget_usd``; ``None`` when every one has a price."""
    routes = [*config.models, *config.tiered]
    for field, tenant in _owners(tenants):
        for model in routes:
            if not tenant.may_use(model):
                continue
            for target in prices.targets(model):
                try:
                    prices.price(target)
                except PriceUnknown as exc:
                    return (
                        f"gateway: {field} counts USD, but {exc} (model {model!r}): give the "
                        f"provider a USD price (prices.{target.model!r} in "
                        f"[providers.{target.provider}]) or limit the key's models"
                    )
    return None
