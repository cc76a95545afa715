"""Routing policies: given a route's targets and what is known of them, the plan of one request.

A policy sees targets through a :class:`RouteView` (predicted TTFT quantiles, availability,
staleness of the stats, load, the request's messages) and a random source, and returns a
:class:`Plan`, the order in which the engine tries targets, how many start at once, and when a
hedge may start. It knows nothing of HTTP, tasks or clocks. Most policies are pure; round-robin
keeps a counter, and prefix affinity keeps the prompt prefixes each target was sent (it learns
which target served a request through :meth:`PrefixPolicy.observe`, and the answer it gave
through :meth:`PrefixPolicy.answered`, which the engine calls for a plan that carries a
``key``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .prefix import DEFAULT_BLOCK_CHARS, DEFAULT_MAX_BLOCKS, CommonPrefixes, PrefixIndex, Prompt

__all__ = [
    "COLD_EXPLORE_SHARE",
    "COLD_EXPLORE_UNANSWERED",
    "IMPROVING_EXPLORE_SHARE",
    "RECENT_REQUESTS_HALF_LIFE",
    "FailoverPolicy",
    "FastestPolicy",
    "HedgePolicy",
    "LeastLoadedPolicy",
    "Plan",
    "Policy",
    "PrefixPolicy",
    "RacePolicy",
    "RoundRobinPolicy",
    "RouteView",
    "WeightedPolicy",
    "explore",
    "rank_quantile",
]

_RANKS = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}

COLD_EXPLORE_SHARE = 0.25
"""The share of requests that explore a cold target (one without enough samples yet). A cold
target is explored at most ``min_samples`` times a window, whatever the share: the share only
says how soon. 10% until issue 26: a new client of three targets at ~12 requests a second then
knew its second and third targets after ~10 s, and sent long prompts to the target fast only on
short ones until then (``benchmarks/routing.py --scenarios``, longshort: 1.45x the per-request
best's p95 in one run, 1.05x in another; at 25%, 1.01x-1.03x in three)."""
IMPROVING_EXPLORE_SHARE = 0.25
"""The share of requests that re-measure an *improving* target (a slow one whose newest sample
was fast). Such a re-measure is a race beside the first choice (no wait for the caller, one
more request), and a few fast samples decide the change back, so a target that recovered gets
its traffic back within a few requests of its first fast re-measure."""
RECENT_REQUESTS_HALF_LIFE = 256.0
"""Requests of a route after which one request's weight in :class:`PrefixPolicy`'s count of the
requests each target served lately halves. The count helps break ties of load (few requests in
flight tie often): a target kept busy by long conversations takes fewer new ones."""
COLD_EXPLORE_UNANSWERED = 5
"""Explorations in a row without a sample after which a cold (or improving) target is no longer
explored at the cold share, only re-measured when stale (a race it keeps losing, say)."""


def rank_quantile(name: str) -> float | None:
    """The quantile a ranking name stands for ("p95" -> 0.95); ``None`` for "mean"."""
    if name == "mean":
        return None
    return _RANKS[name]


class RouteView(Protocol):
    """What a policy may know about targets."""

    def predict(self, target: str, q: float | None) -> float:
        """Predicted TTFT quantile ``q`` (the mean for ``None``) of ``target``, in seconds."""
        ...

    def available(self, target: str) -> bool:
        """False while the target's circuit is open or it cools down after a 429."""
        ...

    def staleness(self, target: str) -> float:
        """Seconds since the target's newest TTFT sample or its last exploration, whichever is
        newer (``inf`` if it has neither)."""
        ...

    def cold(self, target: str) -> bool:
        """Whether the target has too few samples for its own prediction (a prior still counts)."""
        ...

    def load(self, target: str) -> float:
        """The requests the target is working on: its own queued + running ones when it reports
        them (a fresh ``/metrics`` reading), else this client's attempts in flight there."""
        ...

    def messages(self) -> Sequence[Mapping[str, Any]]:
        """The request's chat messages (empty when it has none)."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The attempts of one request, in order.

    ``start`` attempts begin at once; each following one begins when an earlier one fails
    (failover) or, for ``hedge_delays[i]`` not ``None``, when attempt ``i`` has gone that many
    seconds without a first token (a hedge).
    """

    order: tuple[str, ...]
    start: int = 1
    hedge_delays: tuple[float | None, ...] = ()
    explored: str | None = None
    probe: bool = False
    """The ``explored`` target is cold and starts beside the plan's other first attempts to
    be measured (a probe: one request more); whoever wins, the engine lets it run on to its
    first token, so that it is a sample."""
    key: object = None
    """Not ``None``: the policy wants to learn the outcome. The engine calls
    ``policy.observe(key, winner)`` once, when the request has its first token (or its whole
    answer, when not streamed), with the target that served (``None`` if none did, retries
    included); and, if the policy has it, ``policy.answered(key, target, text)`` when an answer
    whose only choice is plain text completed (a stream read to its end, or a completion
    returned), with the target that finished it and the answer's text."""
    reason: str = ""
    """Why the first target is first, in the policy's words (empty: its rule says it all, as
    for "fastest"); the route report carries it."""

    def hedge_delay(self, index: int) -> float | None:
        """The hedge delay after attempt ``index`` started, or ``None`` (no hedge)."""
        return self.hedge_delays[index] if index < len(self.hedge_delays) else None


class Policy(Protocol):
    """Plans requests. A policy that returns plans with a ``key`` also has ``observe(key,
    winner)`` and may have ``answered(key, target, text)`` (see :attr:`Plan.key`)."""

    @property
    def name(self) -> str: ...

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan: ...


def _ranked(targets: Sequence[str], view: RouteView, q: float | None) -> list[str]:
    """Available targets by predicted TTFT, then unavailable ones (a last resort), stable.
    A view with ``rank`` (optional in a RouteView) ranks a quantile by it instead: a
    target with too few samples for the quantile by a lower bound of it (``TargetStats.rank``)."""
    rank = getattr(view, "rank", None) if q is not None else None
    if rank is not None:
        return sorted(targets, key=lambda t: (not view.available(t), rank(t, q)))
    return sorted(targets, key=lambda t: (not view.available(t), view.predict(t, q)))


@dataclass(frozen=True)
class FastestPolicy:
    """The target with the lowest predicted TTFT first; the others in order on failure."""

    rank_by: str = "p95"
    name: str = "fastest"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        return Plan(tuple(_ranked(targets, view, rank_quantile(self.rank_by))))


@dataclass(frozen=True)
class HedgePolicy:
    """Start the best target; with no first token by its live quantile ``hedge_after`` (or a
    fixed delay in seconds), start the next, up to ``max_hedges`` extra attempts.

    The first target is the best by ``rank_by``; the ones after it, which only start when an
    attempt is late or failed, by their predicted median."""

    rank_by: str = "p95"
    hedge_after: str | float = "p95"
    max_hedges: int = 1
    name: str = "hedge"

    def delay(self, target: str, view: RouteView, backup: str | None = None) -> float:
        """When to hedge an attempt on ``target``: its live ``hedge_after`` quantile (or the
        fixed delay); with a quantile, a ``backup`` target to hedge to and a view that has
        ``hedge_delay`` (optional in a RouteView), later while a hedge started then would
        mostly lose to the first attempt (``TargetStats.hedge_delay``)."""
        if not isinstance(self.hedge_after, str):
            return float(self.hedge_after)
        q = rank_quantile(self.hedge_after)
        assert q is not None  # hedge_after is a quantile name
        later = getattr(view, "hedge_delay", None)
        if later is None or backup is None:
            return view.predict(target, q)
        return float(later(target, q, view.predict(backup, 0.5)))

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        best, *rest = _ranked(targets, view, rank_quantile(self.rank_by))
        # A hedge starts once the first attempt is already late: what counts then is how soon
        # the next target usually answers, its median, not its tail.
        order = [best, *_ranked(rest, view, 0.5)]
        hedges = min(self.max_hedges, len(order) - 1)
        delays = tuple(self.delay(t, view, order[i + 1]) for i, t in enumerate(order[:hedges]))
        return Plan(tuple(order), hedge_delays=delays)


@dataclass(frozen=True)
class RacePolicy:
    """Start the ``k`` best targets at once; the first token wins."""

    k: int = 2
    rank_by: str = "p95"
    name: str = "race"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        order = _ranked(targets, view, rank_quantile(self.rank_by))
        return Plan(tuple(order), start=min(self.k, len(order)))


@dataclass(frozen=True)
class FailoverPolicy:
    """The targets in their configured order; the next only when one fails."""

    name: str = "failover"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        ready = [t for t in targets if view.available(t)]
        return Plan((*ready, *(t for t in targets if t not in ready)))


@dataclass(frozen=True)
class WeightedPolicy:
    """A random target in proportion to its weight first; the rest, also by weight, on failure.

    ``weights`` go with the targets in order, one each: planning for another number of targets
    raises :class:`ValueError` (a target without a weight is not silently left out)."""

    weights: tuple[float, ...]
    name: str = "weighted"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        if len(targets) != len(self.weights):
            weights, count = len(self.weights), len(targets)
            raise ValueError(
                f"policy 'weighted' has {weights} weight{'s' * (weights != 1)} for {count} "
                f"target{'s' * (count != 1)} ({', '.join(targets)}): each target needs exactly "
                "one weight, in order, so a weighted route's targets cannot change without its "
                "weights"
            )
        # Weighted random order without replacement: sort by u ** (1 / w) (Efraimidis-Spirakis).
        keys = {t: rng.random() ** (1.0 / w) for t, w in zip(targets, self.weights, strict=True)}
        order = sorted(targets, key=lambda t: (not view.available(t), -keys[t]))
        return Plan(tuple(order))


def _by_load(targets: Sequence[str], view: RouteView, q: float | None) -> list[str]:
    """Available targets by load, then predicted TTFT, then as given; unavailable ones last."""
    return sorted(targets, key=lambda t: (not view.available(t), view.load(t), view.predict(t, q)))


@dataclass(frozen=True)
class LeastLoadedPolicy:
    """The available target working on the fewest requests first (ties: the lowest predicted
    ``rank_by`` TTFT, then the configured order); the others in that order on failure."""

    rank_by: str = "p95"
    name: str = "least-loaded"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        return Plan(tuple(_by_load(targets, view, rank_quantile(self.rank_by))))


class RoundRobinPolicy:
    """Each request starts on the next available target in turn; the others follow in turn
    on failure, unavailable ones last."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        ready = [t for t in targets if view.available(t)]
        if not ready:
            return Plan(tuple(targets))
        turn = self._next % len(ready)
        self._next = turn + 1
        rest = (t for t in targets if t not in ready)
        return Plan((*ready[turn:], *ready[:turn], *rest))


@dataclass(frozen=True, slots=True)
class _PrefixKey:
    """What :meth:`PrefixPolicy.observe` and :meth:`PrefixPolicy.answered` need of a plan: the
    prompt, the target chosen, how many blocks its tree held before the plan's optimistic
    insert, and the owner number of that insert (what :meth:`PrefixTree.discard` may take back).
    """

    prompt: Prompt
    choice: str
    held: int
    owner: int


class PrefixPolicy:
    """Prefix affinity: the target whose cache most likely holds the prompt's longest prefix.

    Each target has a :class:`~llmroute.routing.prefix.PrefixTree` of the prompts sent to it
    lately. A request goes to the available target whose tree matches the longest share of its
    prompt, if that share is above ``cache_threshold``; else to the least-loaded target (ties:
    the least of the route's recent work, its share of the prefixes the trees hold plus its
    share of the requests served lately; then predicted ``rank_by`` TTFT; then the configured
    order). When the targets are imbalanced, the highest load exceeding the lowest by more than
    ``balance_abs_threshold`` requests *and* by a factor above ``balance_rel_threshold``, the
    least-loaded target is chosen whatever it holds (SGLang gateway's rule). The other targets
    follow, least loaded first, on failure.

    The share is counted beyond the prompt's *common* prefix: the leading part that more than
    an even share (one in as many as there are available targets) of the conversations started
    lately share, such as a system prompt every user gets (see
    :class:`~llmroute.routing.prefix.CommonPrefixes`). Every target ends up holding such a
    prefix, and keeping all the conversations that start with it on one target would overload
    it, so holding it is no reason to choose a target: a new conversation goes to the
    least-loaded target, its later turns where their history is. A prefix fewer conversations
    share (one system prompt of ten, a user's own history) counts in full.

    The share of the prompt a tree holds is counted in characters (a short trailing partial
    block weighs its few characters). The prompt goes into the chosen target's tree at once, so
    concurrent requests of one conversation stick together; when another target serves it
    (:meth:`observe`), it moves there, leaving in the chosen tree only what other requests also
    put there. When the answer is complete (:meth:`answered`), the prompt followed by the answer
    as an assistant message, which is what the server caches and the next turn of the chat
    starts with, goes into the tree of the target that answered: a chat's next turn then matches
    nearly all of its prompt, however short its first one was. Works for any targets: a
    self-hosted server's load is its own queue, a vendor's the client's requests in flight.
    Each plan says why it chose its first target (:attr:`Plan.reason`).
    """

    name = "prefix"

    def __init__(
        self,
        *,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        cache_threshold: float = 0.5,
        balance_abs_threshold: float = 64,
        balance_rel_threshold: float = 1.5,
        rank_by: str = "p95",
    ) -> None:
        if block_chars < 1:
            raise ValueError(f"block_chars must be at least 1, got {block_chars!r}")
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold!r}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1")
        self.block_chars = block_chars
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.rank_by = rank_by
        self.index = PrefixIndex(max_blocks)
        self.common = CommonPrefixes(max_blocks)
        self._owners = itertools.count()
        self._planned = 0  # requests planned: the clock of the recent-requests decay
        self._sent: dict[str, tuple[float, int]] = {}

    def imbalanced(self, loads: Sequence[float]) -> bool:
        """Whether the highest load exceeds the lowest by both thresholds."""
        if len(loads) < 2:
            return False
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low

    def sent_lately(self, target: str) -> float:
        """The requests ``target`` served lately (or, until they are served, was chosen for),
        each weighing half as much every :data:`RECENT_REQUESTS_HALF_LIFE` requests planned."""
        entry = self._sent.get(target)
        if entry is None:
            return 0.0
        value, at = entry
        return value * 0.5 ** ((self._planned - at) / RECENT_REQUESTS_HALF_LIFE)

    def _work_lately(self, targets: Sequence[str]) -> dict[str, float]:
        """Each target's part of the route's recent work, what breaks ties of load: its share
        of the prefixes the targets' trees hold (so new prefixes go where the cache has room,
        SGLang's smallest tree) plus its share of the requests served lately (so a target kept
        busy by long chats of short turns, whose tree is small, takes fewer new ones)."""
        trees = {t: len(self.index.tree(t)) for t in targets}
        sent = {t: self.sent_lately(t) for t in targets}
        blocks, requests = sum(trees.values()) or 1, sum(sent.values()) or 1.0
        return {t: trees[t] / blocks + sent[t] / requests for t in targets}

    def _count_sent(self, target: str, requests: float) -> None:
        self._sent[target] = (max(0.0, self.sent_lately(target) + requests), self._planned)

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        q = rank_quantile(self.rank_by)
        index = self.index
        ready = [t for t in targets if view.available(t)]
        if not ready:
            return Plan(tuple(_by_load(targets, view, q)))
        loads = {t: view.load(t) for t in ready}
        work = self._work_lately(ready)
        fallback = sorted(ready, key=lambda t: (loads[t], work[t], view.predict(t, q)))
        prompt = Prompt.of(view.messages(), self.block_chars, index.max_blocks)
        choice, held, owner, reason = fallback[0], 0, 0, "least loaded: an empty prompt"
        if prompt.blocks:
            choice, held, reason = self._choose(prompt, fallback, loads)
            owner = next(self._owners)
            index.tree(choice).insert(prompt.blocks, owner)
        self._planned += 1
        self._count_sent(choice, 1.0)
        order = (choice, *(t for t in fallback if t != choice))
        order += tuple(t for t in targets if t not in loads)
        key = _PrefixKey(prompt, choice, held, owner) if prompt.blocks else None
        return Plan(order, key=key, reason=reason)

    def _choose(
        self, prompt: Prompt, fallback: list[str], loads: Mapping[str, float]
    ) -> tuple[str, int, str]:
        """The target a non-empty prompt starts on, the blocks its tree holds, and why."""
        blocks = prompt.blocks
        matches = {t: self.index.tree(t).match(blocks) for t in fallback}
        best = max(fallback, key=lambda t: matches[t])  # the first of the longest: least loaded
        most = matches[best]
        common = self.common.depth(blocks, most, 1 / len(fallback))
        self.common.record(prompt, most)
        least = fallback[0]
        if self.imbalanced(list(loads.values())):
            return least, matches[least], "least loaded: the load is out of balance"
        share = prompt.share(most, common)
        beyond = " beyond its common prefix" if common else ""
        if share > self.cache_threshold:
            return best, most, f"prefix: holds {share:.0%} of the prompt{beyond}"
        if most and most <= common:
            why = "holds only the prompt's common prefix, which many conversations share"
        elif most:
            why = f"holds {share:.0%} of the prompt{beyond}, not above {self.cache_threshold:g}"
        else:
            why = "holds none of the prompt"
        return least, matches[least], f"least loaded: the best match ({best}) {why}"

    def observe(self, key: object, winner: str | None) -> None:
        """The target that served the planned request (``None``: none did).

        When it is not the one the plan chose, the prompt's blocks that the plan added to the
        chosen target's tree are taken out again, except those another request's prompt (one
        still in flight, say, a longer turn of the same chat) touched since; and the winner's
        tree gets the prompt, and the request counts among those the winner served lately.
        """
        if not isinstance(key, _PrefixKey) or winner == key.choice:
            return
        self._count_sent(key.choice, -1.0)
        if winner is not None:
            self._count_sent(winner, 1.0)
        blocks = key.prompt.blocks
        self.index.tree(key.choice).discard(blocks[key.held :], key.owner)
        if winner is not None:
            self.index.tree(winner).insert(blocks)

    def answered(self, key: object, target: str, text: str) -> None:
        """``target`` completed the planned request's answer, ``text``: its tree gets the
        prompt followed by the answer as the next turn of the chat sends it back (an assistant
        message with that text), the prefix the server now has in its cache."""
        if not isinstance(key, _PrefixKey):
            return
        answer = key.prompt.extend(({"role": "assistant", "content": text},))
        self.index.tree(target).insert(answer.blocks)
        self.common.answered(key.prompt, answer)


def explore(
    plan: Plan,
    view: RouteView,
    *,
    share: float,
    max_age: float,
    rng: random.Random,
    hedge_delay: Callable[[str], float] | None = None,
    cold_share: float = COLD_EXPLORE_SHARE,
    improving_share: float = IMPROVING_EXPLORE_SHARE,
    due: Callable[[], bool] | None = None,
) -> Plan:
    """Now and then, put a target the plan does not start with first, so its stats stay fresh.

    While some target is *cold* (too few samples to predict from, counting those on their
    way: the view's ``cold``) or *improving* (its newest
    sample is below the range of its older ones: a slow target re-measured fast, when the view
    has ``improving``), a request explores it with probability ``cold_share``
    (``improving_share`` for an improving one that is not cold; every request while a cold
    one can be probed, below; never when ``share`` is 0: exploration is off). A target is cold
    for at most ``min_samples`` explorations per window, so this costs a bounded number of
    requests; and never after :data:`COLD_EXPLORE_UNANSWERED` explorations in a row that gave
    no sample (when the view has ``unanswered``). Otherwise, with probability ``share``
    (or when ``due()`` says so: the caller paces re-measures at that share of its requests,
    one every ``1 / share`` requests, rather than by chance), the stalest target goes first
    when its newest sample (or its last exploration) is older than ``max_age`` seconds: a
    target that was only slow is re-measured now and then, and wins its traffic back when it
    got fast again. A hedging plan over a view that ``probes`` (optional in a RouteView: the
    engine lets an attempt on a cold target run on to its first token, whoever wins) starts an
    explored cold target beside the first choice (``start`` 2, ``probe``): one request more,
    no wait for the caller, and a sample. Without probes, it hedges an explored cold target
    after ``hedge_delay(target)`` (its own live quantile, or a prior when it has no samples),
    so one exploration costs at most about that. A known one starts together with the first
    choice (``start`` 2; the first choice's own hedge follows at its delay), so re-measuring a
    slow target costs the caller nothing but one more request. A plan that starts several at
    once (a race) explores only a target it does not start, which joins the racers (``start``
    one more) instead of taking the place of one.
    """
    if len(plan.order) < 2:
        return plan
    # A view that probes (optional in a RouteView) lets a cold target's attempt run on to
    # its first token whoever wins; a plan that hedges or races can then start it beside its
    # first choice, at no wait for the caller.
    probes = bool(getattr(view, "probes", False)) and bool(plan.hedge_delays or plan.start > 1)
    chosen = _explored(
        plan,
        view,
        share=share,
        max_age=max_age,
        rng=rng,
        cold_share=cold_share,
        improving_share=improving_share,
        due=due,
        probes=probes,
    )
    if chosen is None:
        return plan
    cold = view.cold(chosen)
    return _with_explored(plan, chosen, probe=probes and cold, hedge_delay=hedge_delay, cold=cold)


def _explored(
    plan: Plan,
    view: RouteView,
    *,
    share: float,
    max_age: float,
    rng: random.Random,
    cold_share: float,
    improving_share: float,
    due: Callable[[], bool] | None,
    probes: bool,
) -> str | None:
    """The target :func:`explore` puts first in ``plan`` this time, if any (its rules)."""
    candidates = [t for t in plan.order[max(1, plan.start) :] if view.available(t)]
    improving = getattr(view, "improving", None)  # optional in a RouteView
    unanswered = getattr(view, "unanswered", None)  # optional too
    cold = [
        t
        for t in candidates
        if (view.cold(t) or (improving is not None and improving(t)))
        and (unanswered is None or unanswered(t) < COLD_EXPLORE_UNANSWERED)
    ]
    if cold:
        chosen = max(cold, key=view.staleness)
        odds = cold_share if view.cold(chosen) else improving_share
        if probes and view.cold(chosen):
            odds = 1.0  # as soon as possible: a probe costs the caller no wait
        if share <= 0 or rng.random() >= max(share, odds):
            return None
        return chosen
    if share <= 0 or not candidates:
        return None
    if due is None and rng.random() >= share:
        return None
    chosen = max(candidates, key=view.staleness)
    if view.staleness(chosen) <= max_age or (due is not None and not due()):
        return None
    return chosen


def _with_explored(
    plan: Plan,
    chosen: str,
    *,
    probe: bool,
    hedge_delay: Callable[[str], float] | None,
    cold: bool,
) -> Plan:
    """``plan`` with ``chosen`` explored (:func:`explore`'s docstring says how): ``probe``
    when a cold target starts beside the first choice and runs on to its first token."""
    delays, start = plan.hedge_delays, plan.start
    if start > 1:
        # A race keeps its racers (losing a racer to an exploration would cost the caller
        # whenever the target left out would have won); the explored target is one more.
        order = (*plan.order[:start], chosen, *(t for t in plan.order[start:] if t != chosen))
        if len(delays) > start:
            delays = (*delays[:start], None, *delays[start:])
        return Plan(
            order,
            start=start + 1,
            hedge_delays=delays,
            explored=chosen,
            probe=probe,
            key=plan.key,
        )
    order = (chosen, *(t for t in plan.order if t != chosen))
    if delays and hedge_delay is not None:
        if probe and delays[0] is not None:
            # A cold target the view can probe starts beside the first choice, whose own
            # hedge follows: the caller waits for neither an unknown target nor its hedge,
            # and the probe runs on to its first token whoever wins, so it is a sample.
            first = plan.order[0]
            order = (chosen, first, *(t for t in plan.order[1:] if t != chosen))
            delays = (None, *delays)
            return Plan(
                order, start=2, hedge_delays=delays, explored=chosen, probe=True, key=plan.key
            )
        if cold or delays[0] is None:
            # A cold target waits out its own delay, so that it yields a sample.
            delays = (hedge_delay(chosen), *delays[1:])
        elif start == 1:
            # A known one starts beside the first choice (a race of two, the first token
            # wins), whose own hedge follows: re-measuring a target that got slow costs the
            # caller one request, not a wait.
            first = plan.order[0]
            order = (chosen, first, *(t for t in plan.order[1:] if t != chosen))
            delays, start = (None, *delays), 2
    return Plan(order, start=start, hedge_delays=delays, explored=chosen, key=plan.key)
