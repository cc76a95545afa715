"""What a request's plan is made over: the router's live stats and health as the policies read
them (:class:`RequestView`, a :class:`~.policies.RouteView`), and :class:`RouterState`, the part
of the :class:`~.engine.Router` a request's run reads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from .goal import LatencyGoal
from .health import TargetHealth
from .price import EXPECTED_ANSWER_TOKENS, TargetPrice
from .route import Route
from .stats import LiveStats

__all__ = ["RequestView", "RouterState"]


class RouterState(Protocol):
    """What a request's run reads of its router (:class:`~.engine.Router`): the live stats,
    the targets' health, the retry and exploration settings, its random numbers and clock."""

    stats: LiveStats
    max_retries: int
    explore_share: float
    misconfigured_cooldown: float
    _rng: random.Random
    _clock: Callable[[], float]

    def health(self, target: str) -> TargetHealth: ...

    def load(self, target: str) -> float: ...

    def remeasure_due(self, route: str) -> Callable[[], bool]: ...

    def probe_open_circuits(self, route: Route) -> None: ...

    def soonest_available(self, targets: Iterable[str], *, trials: bool = True) -> float | None: ...


class RequestView:
    """A :class:`~llmroute.routing.policies.RouteView` over the router's stats and health."""

    def __init__(
        self,
        router: RouterState,
        prompt_tokens: int,
        stream: bool,
        messages: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self._router = router
        self._tokens = prompt_tokens
        self._stream = stream
        self._messages = messages
        self.goal: LatencyGoal | None = None
        self.prices: Mapping[str, TargetPrice] = {}
        self.answer_tokens = EXPECTED_ANSWER_TOKENS

    def predict(self, target: str, q: float | None) -> float:
        stats = self._router.stats.target(target)
        if not self._stream:
            return stats.predict_latency(q if q is not None else 0.5)
        if q is None:
            mean = stats.snapshot().ttft_mean
            return mean if mean is not None else stats.predict(0.5, self._tokens)
        return stats.predict(q, self._tokens)

    def available(self, target: str) -> bool:
        return self._router.health(target).available()

    def rank(self, target: str, q: float) -> float:
        """What ``target`` is ranked by for the ``q`` quantile (``TargetStats.rank``)."""
        if not self._stream:
            return self.predict(target, q)
        return self._router.stats.target(target).rank(q, self._tokens)

    def hedge_delay(self, target: str, q: float, backup: float) -> float:
        """When to hedge an attempt on ``target`` (``TargetStats.hedge_delay``), its live
        ``q`` quantile at the earliest; a hedge to a target answering in ``backup`` seconds."""
        if not self._stream:
            return self.predict(target, q)
        return self._router.stats.target(target).hedge_delay(q, backup, self._tokens)

    @property
    def probes(self) -> bool:
        """Whether a probe of a cold target runs on to its first token whoever wins (a
        stream's: its TTFT is the sample; :meth:`~.coordinator.Coordinator.run_on`)."""
        return self._stream

    def cold(self, target: str) -> bool:
        stats = self._router.stats.target(target)
        if self._stream:  # the samples on their way (probes running on) count
            return stats.needs_samples()
        return stats.cold(streamed=False)

    def improving(self, target: str) -> bool:
        """Whether the target's newest TTFT sample is below the range of its older ones."""
        return self._stream and self._router.stats.target(target).improving

    def unanswered(self, target: str) -> int:
        """Explorations of the target since its newest sample."""
        return self._router.stats.target(target).unanswered_explorations(streamed=self._stream)

    def staleness(self, target: str) -> float:
        stats = self._router.stats.target(target)
        newest = stats.newest_at(streamed=self._stream)
        explored = stats.explored_at
        if explored is not None:
            newest = explored if newest is None else max(newest, explored)
        return math.inf if newest is None else self._router._clock() - newest

    def load(self, target: str) -> float:
        return self._router.load(target)

    def messages(self) -> Sequence[Mapping[str, Any]]:
        return self._messages

    def ttft_target(self) -> float | None:
        """The request's TTFT goal in seconds (its own over the route's), if any."""
        goal = self.goal
        return None if goal is None else goal.ttft_target

    def price(self, target: str) -> float | None:
        """The expected cost of this request on ``target`` in USD (:mod:`.price`); ``None``
        when its price is not known."""
        known = self.prices.get(target)
        return None if known is None else known.estimate(self._tokens, self.answer_tokens)
