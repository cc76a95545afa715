"""What a route is: its targets, its settings, and how the engine sends to one target.

A :class:`Route` is one model name the application uses, served by several
:class:`RouteTarget` s under a policy; a :data:`Sender` is the client's part of an attempt (URL,
keys, headers, timeouts), which the engine calls without knowing HTTP requests are built.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from .._catalog import Continuation
from .._prices import ModelPrice, UsageFields
from .._types import AttemptReport, Timings
from .budget import CostBudget, HedgeBudget
from .causes import CauseRules
from .goal import LatencyGoal
from .policies import Policy
from .price import TargetPrice

__all__ = ["SENDING", "Route", "RouteTarget", "Sender"]


class Sender(Protocol):
    """Sends one request to one target: the client's part (URL, keys, headers, timeouts).

    Returns once the response headers arrived with a status below 400 (a status error raises
    openai's exception); with ``stream=False`` the body has been read. ``continuation`` says
    the request continues an answer (some vendors take those on another base URL).
    """

    def __call__(
        self, target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
    ) -> Awaitable[tuple[httpx.Response, Timings]]: ...


SENDING: contextvars.ContextVar[AttemptReport | None] = contextvars.ContextVar(
    "llmroute_sending", default=None
)
"""The attempt a :data:`Sender` is called for (the sender puts its trace span on it)."""


@dataclass(frozen=True, slots=True)
class RouteTarget:
    """A provider and the model name it serves a route with."""

    provider: str
    model: str
    continuation: Continuation | None = None
    stream_usage: bool = True
    stream_usage_continuous: bool = False
    """Whether the target takes ``stream_options.continuous_usage_stats`` (vLLM, SGLang)."""
    protocol: str = "openai"
    """The wire protocol: ``"openai"`` (chat completions) or ``"anthropic"`` (Messages)."""
    context_window: int | None = None
    """Tokens (prompt plus answer) the model takes at most, if declared (:mod:`.windows`)."""
    trial: Mapping[str, Any] = field(
        default_factory=lambda: {"max_tokens": 1}, compare=False, hash=False
    )
    """Top-level fields of the trial request sent while its circuit is open (the catalog's)."""
    request_id_headers: tuple[str, ...] = ()
    """Response headers carrying the vendor's request id, tried before the protocol's own."""
    max_tokens_field: str | None = None
    """The field the vendor takes for the answer's length limit (the catalog's): a caller's
    ``max_tokens`` / ``max_completion_tokens`` is renamed to it; ``None``: sent as written."""
    price: ModelPrice | None = field(default=None, compare=False, hash=False)
    """The model's price (the config's, else the catalog's); ``None``: unknown (docs/cost.md)."""
    usage_fields: UsageFields | None = field(default=None, compare=False, hash=False)
    """Where the vendor's ``usage`` reports each billed token class; ``None``: the protocol's."""

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"


@dataclass
class Route:
    """One model name the application uses, served by several targets under a policy."""

    name: str
    targets: tuple[RouteTarget, ...]
    policy: Policy
    budget: HedgeBudget = field(default_factory=HedgeBudget)
    first_token_timeout: float | None = 30.0
    continue_on_break: bool = True
    max_continuations: int = 3
    retry_after_max: float = 5.0
    """An ordered (``failover``) route waits out a Retry-After up to this long to retry the
    same target (0: fail over at once)."""
    server_error_retries: int = 1
    """An ordered route retries the same target this many times after a 5xx."""
    stall_timeout: float | Literal["auto"] | None = "auto"
    """Seconds a stream may send nothing after its first token before it counts as broken
    (and is continued on another target): ``"auto"`` derives it from the target's live
    pauses between chunks (:func:`~.stats.stall_deadline`), ``None`` turns it off."""
    connect_timeout: float | None = None
    """Seconds to open a connection to a target (``None``: the call's own timeout)."""
    failover_on: frozenset[str] = frozenset()
    """Request-caused errors (``invalid_request``, ``content_policy``, ``context_length``)
    the route fails over on instead of returning them to the caller."""
    goal: LatencyGoal | None = None
    """The route's latency goal (``ttft_target``, ``min_tokens_per_s``); a request's own
    options override it (:mod:`.goal`)."""
    prices: Mapping[str, TargetPrice] = field(default_factory=dict)
    """Each target's price, by name, where one is known (:mod:`.price`): policy
    ``cheapest`` and a hedge budget in money read it."""
    cost_budget: CostBudget | None = None
    """Hedging's budget in money (``hedge_budget_cost``); when set, it replaces ``budget``."""
    price_book: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Each target's exact price, read once for pricing answers as they end (:mod:`.costs`)."""

    def rules(self) -> CauseRules:
        """How the route reacts to each cause of failure (:mod:`.causes`)."""
        return CauseRules(
            ordered=self.policy.name == "failover",
            retry_after_max=self.retry_after_max,
            server_error_retries=self.server_error_retries,
            failover_on=self.failover_on,
        )

    @functools.cached_property
    def windows(self) -> dict[str, int | None]:
        """Each target's declared context window, by name; empty when none declares one."""
        windows = {t.name: t.context_window for t in self.targets}
        return windows if any(windows.values()) else {}

    def target(self, name: str) -> RouteTarget:
        for target in self.targets:
            if target.name == name:
                return target
        raise KeyError(name)
