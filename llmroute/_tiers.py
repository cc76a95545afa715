"""The routing stage of a tiered model name: which route (tier) a request goes to.

A :class:`TieredModel` holds one ``[models.<name>]`` table with ``tiers``. Its classifier
(:mod:`llmroute.tiers`, the ``tiers`` extra) is built from the examples or read from the
artefact on the first request or at ``warmup()``, in a worker thread (fitting takes up to a
second; the embedding loads in ~0.2 s), never at import. A decision itself costs 0.1-0.5 ms
of CPU and runs inline. Nothing here fails a request: a classifier that cannot be built or
that errs sends the request to the default tier, with ``reason="error"``.

Tiers are ranked in the order ``tiers`` names them (smallest first), the default tier after
them if ``tiers`` does not name it: a chat follow-up never goes below the tier its
conversation reached (:class:`ConversationMemory`, keyed by hashes of the messages only), an
unsure decision may be hedged from the smaller of two tiers to the larger, and a request's
``ttft_target_ms`` may move it to another tier its class allows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from ._types import TierDecision
from .config import TieredSettings

__all__ = [
    "MEMORY_SIZE",
    "MEMORY_TTL",
    "Conversation",
    "ConversationMemory",
    "TierError",
    "TieredModel",
    "conversation_of",
]

log = logging.getLogger("llmroute")


MEMORY_SIZE = 10_000
"""Conversations a tiered name remembers (least recently used forgotten first)."""
MEMORY_TTL = 3600.0
"""Seconds a conversation's tier is remembered after its latest turn."""
_ENDS = 64
"""Messages (and content parts) hashed from each end of a list (its length is hashed too)."""
_CUT_SEARCH = 256
"""Messages searched from the end for the last assistant turn."""
_TEXT_ENDS = 4096
"""Characters of each string hashed from each end (its length is hashed too)."""


class TierError(ValueError):
    """A request's ``llmroute.tier`` option that names no tier of its model."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """What identifies a chat request's conversation: hashes of its messages, never text."""

    own: bytes
    """The hash of all its messages: what its follow-up's ``earlier`` will be."""
    earlier: bytes | None
    """The hash of its messages before its last assistant turn (``None``: no assistant turn
    among its last 256 messages, a first turn)."""
    cut: int | None
    """The index of that last assistant turn."""


def _ends(items: Sequence[Any]) -> tuple[Sequence[Any], int]:
    if len(items) <= 2 * _ENDS:
        return items, len(items)
    return [*items[:_ENDS], *items[-_ENDS:]], len(items)


_NODES = 512
"""Values hashed per body at most (messages, parts, strings): a crafted body costs no more."""


def _feed(h: Any, value: object, budget: list[int], depth: int = 0) -> None:
    """Hash what a message's role and content say, bounded: long strings, long lists, deep
    nesting (below four levels only the type counts), and ``budget`` values in all."""
    budget[0] -= 1
    if depth > 4 or budget[0] < 0:
        h.update(b"d" + type(value).__name__.encode())
    elif isinstance(value, str):
        text = value if len(value) <= 2 * _TEXT_ENDS else value[:_TEXT_ENDS] + value[-_TEXT_ENDS:]
        h.update(b"s%d:" % len(value))
        h.update(text.encode("utf-8", "surrogatepass"))
    elif isinstance(value, list):
        items, n = _ends(value)
        h.update(b"l%d:" % n)
        for item in items:
            _feed(h, item, budget, depth + 1)
    elif isinstance(value, Mapping):
        h.update(b"m")
        for key in ("type", "text", "image_url", "url", "input_audio", "file", "refusal"):
            if key in value:
                h.update(key.encode())
                _feed(h, value[key], budget, depth + 1)
    elif value is None:
        h.update(b"n")
    else:
        h.update(b"o" + type(value).__name__.encode())


def _digest(messages: Sequence[Any]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    items, n = _ends(messages)
    h.update(b"%d" % n)
    budget = [_NODES]
    for message in items:
        if isinstance(message, Mapping):
            _feed(h, message.get("role"), budget)
            _feed(h, message.get("content"), budget)
        else:
            _feed(h, message, budget)
    return h.digest()


def conversation_of(body: Mapping[str, Any]) -> Conversation | None:
    """The conversation of a chat body (``None``: it has no list of messages). Only a role
    and content of each message count (the fields an application may add or drop when it
    sends an answer back, ``refusal`` or ``annotations``, do not)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    cut = None
    for index in range(len(messages) - 1, max(-1, len(messages) - 1 - _CUT_SEARCH), -1):
        message = messages[index]
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            cut = index
            break
    earlier = _digest(messages[:cut]) if cut is not None else None
    return Conversation(_digest(messages), earlier, cut)


class ConversationMemory:
    """The tier each recent conversation turn was served by, by the hash of its messages:
    at most ``size`` entries, each kept ``ttl`` seconds after it was last written or read."""

    def __init__(
        self,
        size: int = MEMORY_SIZE,
        ttl: float = MEMORY_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.size, self.ttl, self.clock = size, ttl, clock
        self._entries: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()  # the sync client and the gateway share one per name

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> str | None:
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[1] <= now:
                del self._entries[key]
                return None
            self._entries[key] = (entry[0], now + self.ttl)
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: bytes, tier: str) -> None:
        now = self.clock()
        with self._lock:
            self._entries[key] = (tier, now + self.ttl)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
            # The oldest few expired ones go as new ones come (bounded work per write).
            for _ in range(2):
                oldest = next(iter(self._entries.items()), None)
                if oldest is None or oldest[1][1] > now:
                    break
                del self._entries[oldest[0]]


class TieredModel:
    """One tiered model name: its tiers, default, classifier and decisions."""

    def __init__(self, settings: TieredSettings) -> None:
        self.name = settings.name
        self.settings = settings
        config = settings.config
        self.tiers: dict[str, str] = dict(config.tiers)
        self.default = config.default
        self.shadow = config.shadow
        self.uncertain_below = config.uncertain_below
        self.hedge_unsure = config.uncertain == "hedge"
        order = dict.fromkeys([*self.tiers.values(), self.default])
        self.rank: dict[str, int] = {route: i for i, route in enumerate(order)}
        """Tiers from the smallest (the first ``tiers`` names) to the largest."""
        self.allow: dict[str, tuple[str, ...]] = {
            label: tuple(given.allow) for label, given in config.classes.items() if given.allow
        }
        self.memory = ConversationMemory()
        self.classifier: Any = None
        self.error: str | None = None
        self._lock = threading.Lock()

    @property
    def routes(self) -> set[str]:
        """Every route a request for this name may go to."""
        return {*self.tiers.values(), self.default}

    def forced(self, option: object) -> str:
        """The route a request's ``llmroute.tier`` names (a class or one of the routes)."""
        if isinstance(option, str):
            if option in self.tiers:
                return self.tiers[option]
            if option in self.routes:
                return option
        choices = ", ".join(repr(c) for c in [*self.tiers, *sorted(self.routes)])
        raise TierError(
            f"llmroute.tier: {str(option)[:80]!r} is not a class or tier of model "
            f"{self.name!r} (one of: {choices})"
        )

    @property
    def ready(self) -> bool:
        return self.classifier is not None or self.error is not None

    async def prepare(self) -> None:
        """Build the classifier (once), in a worker thread."""
        if not self.ready:
            await anyio.to_thread.run_sync(self.build)

    def build(self) -> None:
        """Build the classifier now (blocking); a failure is kept and logged, not raised."""
        with self._lock:
            if self.ready:
                return
            try:
                self.classifier = self._build()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                log.warning(
                    "tiers: models.%s: the classifier cannot be built (every request goes to "
                    "the default tier %r): %s",
                    self.name,
                    self.default,
                    self.error,
                )

    def _build(self) -> Any:
        from .tiers import Classifier, Example, TiersError, cached_fit, read_examples

        settings = self.settings
        if settings.classifier is not None:
            classifier = Classifier.open(settings.classifier)
            where = str(settings.classifier)
        else:
            examples = read_examples(settings.examples) if settings.examples else []
            for label, given in settings.config.classes.items():
                texts = [*(given.examples or ()), *filter(None, [given.description])]
                examples += [
                    Example({"messages": [{"role": "user", "content": t}]}, label) for t in texts
                ]
            where = str(settings.examples or f"models.{self.name}.classes")
            unknown = sorted({e.label for e in examples} - set(self.tiers))
            if unknown:
                raise TiersError(f"{where}: classes {unknown} are not in models.{self.name}.tiers")
            missing = sorted(set(self.tiers) - {e.label for e in examples})
            if missing:
                raise TiersError(f"models.{self.name}: no examples of classes {missing}")
            classifier = cached_fit(examples)  # fitted once per examples, then read
        unknown = sorted(set(classifier.labels) - set(self.tiers))
        if unknown:
            raise TiersError(f"{where}: classes {unknown} are not in models.{self.name}.tiers")
        missing = sorted(set(self.tiers) - set(classifier.labels))
        if missing:  # those tiers would never be chosen by the classifier
            raise TiersError(f"{where}: has no classes {missing} of models.{self.name}.tiers")
        classifier.load()
        return classifier

    def conversation(self, route: str) -> TierDecision:
        """The tier of a follow-up whose earlier response is held by ``route``'s target: no
        decision, as the conversation can be continued only there."""
        label = next((k for k, v in self.tiers.items() if v == route), None)
        return TierDecision(self.name, route, label, 1.0, "conversation", 0.0, route)

    def decide(
        self,
        body: Mapping[str, Any],
        forced: str | None = None,
        *,
        conversation: Conversation | None = None,
        ttft_target: float | None = None,
        p95: Callable[[str], float] | None = None,
    ) -> TierDecision:
        """The tier of one request body (``forced``: the route its options named).

        ``conversation``: a chat body's (:func:`conversation_of`), so a follow-up does not go
        below the tier its conversation reached; ``ttft_target`` (seconds) and ``p95`` (a
        tier's live p95 TTFT): the request's latency goal, met by another tier its class
        allows when its own misses it."""
        if forced is not None:
            label = next((k for k, v in self.tiers.items() if v == forced), None)
            return TierDecision(self.name, forced, label, 1.0, "override", 0.0, forced)
        decision = self._classified(body, ttft_target, p95)
        if conversation is None or conversation.earlier is None or self.shadow:
            return decision
        lowest = decision.hedged[0] if decision.hedged is not None else decision.tier
        if self.rank.get(lowest, -1) == len(self.rank) - 1:
            return decision  # already on the largest tier: no floor can raise it
        floor, micros = self._floor(body, conversation)
        if micros:
            decision = dataclasses.replace(decision, micros=decision.micros + micros)
        return self._at_least(decision, floor)

    def remember(self, conversation: Conversation | None, decision: TierDecision) -> None:
        """A chat turn was answered by ``decision.tier``: its follow-ups start from there."""
        if conversation is not None and decision.reason != "shadow":
            self.memory.put(conversation.own, decision.tier)

    def _classified(
        self,
        body: Mapping[str, Any],
        ttft_target: float | None,
        p95: Callable[[str], float] | None,
    ) -> TierDecision:
        classifier = self.classifier
        if classifier is None:
            error = self.error or "the classifier is not built"
            return TierDecision(self.name, self.default, None, 0.0, "error", 0.0, None, error)
        try:
            decision = classifier.decide(body, self.uncertain_below)
        except Exception as exc:  # decide() never raises; if it ever did, no request fails
            error = f"{type(exc).__name__}: {exc}"[:300]
            return TierDecision(self.name, self.default, None, 0.0, "error", 0.0, None, error)
        if decision.label is None:
            return TierDecision(
                self.name, self.default, None, 0.0, "error", decision.micros, None, decision.error
            )
        chosen = self.tiers[decision.label]
        hedged = None
        if self.shadow:
            tier, reason = self.default, "shadow"
        elif decision.uncertain:
            hedged = self._pair(decision, chosen) if self.hedge_unsure else None
            tier, reason = (hedged[0], "hedged") if hedged else (self.default, "default")
        else:
            tier, reason = chosen, "classifier"
            if ttft_target is not None and p95 is not None:
                faster = self._faster(decision.label, chosen, ttft_target, p95)
                if faster is not None:
                    tier, reason = faster, "latency"
        return TierDecision(
            self.name,
            tier,
            decision.label,
            decision.probability,
            reason,
            decision.micros,
            chosen,
            hedged=hedged,
        )

    def _pair(self, decision: Any, chosen: str) -> tuple[str, str] | None:
        """The two most probable tiers (a tier's probability: its classes'), smaller first;
        ``None`` when every class goes to one tier."""
        by_tier: dict[str, float] = {}
        for label, probability in dict(getattr(decision, "probabilities", None) or {}).items():
            route = self.tiers.get(label)
            if route is not None:
                by_tier[route] = by_tier.get(route, 0.0) + float(probability)
        if not by_tier:  # a classifier that gives no probabilities: its class or the default
            by_tier = dict.fromkeys([chosen, self.default], 0.0)
        top = sorted(by_tier, key=lambda r: (-by_tier[r], self.rank[r]))[:2]
        if len(top) < 2:
            return None
        small, large = sorted(top, key=self.rank.__getitem__)
        return small, large

    def _faster(
        self, label: str, chosen: str, target: float, p95: Callable[[str], float]
    ) -> str | None:
        """The largest tier ``label`` allows that meets ``target`` when ``chosen`` misses it."""
        allowed = self.allow.get(label)
        if not allowed or p95(chosen) <= target:
            return None
        meeting = [r for r in allowed if r != chosen and p95(r) <= target]
        return max(meeting, key=self.rank.__getitem__) if meeting else None

    def _floor(
        self, body: Mapping[str, Any], conversation: Conversation
    ) -> tuple[str | None, float]:
        """The tier a follow-up may not go below, and the classifier's microseconds spent on
        it: the tier its conversation's previous turn was served by, remembered; else (a fresh
        process, another gateway replica) what the classifier gives the turns before the last
        assistant turn, as it would have decided them (unsure: the default tier, or the
        smaller tier of a hedge)."""
        assert conversation.earlier is not None and conversation.cut is not None
        held = self.memory.get(conversation.earlier)
        if held is not None or self.classifier is None:
            return held, 0.0
        earlier = {**body, "messages": body["messages"][: conversation.cut]}
        decision = self._classified(earlier, None, None)
        if decision.reason == "error":
            return None, decision.micros
        return decision.tier, decision.micros

    def _at_least(self, decision: TierDecision, floor: str | None) -> TierDecision:
        """``decision``, not below ``floor`` (reason "conversation" where it went up)."""
        rank = self.rank
        if floor is None or floor not in rank:
            return decision
        if decision.hedged is not None:
            small, large = decision.hedged
            if rank[floor] >= rank[large]:
                return dataclasses.replace(decision, tier=floor, reason="conversation", hedged=None)
            if rank[floor] > rank[small]:
                return dataclasses.replace(decision, tier=floor, hedged=(floor, large))
            return decision
        if rank[floor] > rank.get(decision.tier, -1):
            return dataclasses.replace(decision, tier=floor, reason="conversation")
        return decision
