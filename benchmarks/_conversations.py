"""A chat workload with the published statistics of the Mooncake conversation trace, and the
in-process replays that judge a routing policy on it (``benchmarks/prefix.py --workload mooncake``).

The trace (Mooncake, FAST'25: ``FAST25-release/traces/conversation_trace.jsonl``, 12,031
requests over an hour, each a list of 512-token block hashes) shows, by our count of it:

- every request starts with the same first block (one system prompt for all users);
- 36.6% of all blocks were seen in an earlier request (the reuse an unlimited shared cache gets);
- chains of requests extending one another (conversations): 69% have one turn, the mean is
  1.63, the longest 43; a first turn has a median 11 blocks (10% have at most 2, 10% over 50),
  a later turn adds a median 2 blocks (mean 6.9); 85% of later turns resend all of the previous
  prompt; the median pause between turns is 123 s (10% under 42 s, 10% over 480 s);
- answers average 343 tokens.

The synthetic workload draws conversations to match: a 509-word system prompt (its three role
tokens make it exactly the first 512-token block of every prompt), turn counts in the trace's
proportions, log-normal question and answer lengths, one later turn in seven an edit of the
previous question (it resends the history before it), and bursty arrivals: conversations start
as a Poisson process whose rate switches between ``burst`` times the mean and ``1 / burst`` of
it, each state lasting an exponential time. Time is compressed (seconds, not minutes, between
turns) so that a run takes about a minute. Words are short (3.6 characters with their space),
so a stand-in's token (one word) is about as many characters as an English token.

:func:`simulate` drives a policy's own decisions (``plan``, ``observe``, ``answered``) against
in-process replicas whose prefix caches are the SGLang stand-in's (:class:`PrefixCache`, whole
512-token pages), and :class:`SharedCeiling` replays the same requests through one cache of the
replicas' total size: the hit rate no placement over separate caches can beat by much.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmroute.testing._sglang import PrefixCache, prompt_token_list

BLOCK_TOKENS = 512
"""The trace's block: 512 tokens (the stand-in's ``--page-size``)."""
TURN_COUNTS = (5114, 1311, 464, 200, 117, 55, 27, 26, 10, 16, 5, 2, 4, 2, 5, 4, 4, 1, 1, 0, 1, 1)
"""Conversations of 1, 2, 3, ... 22 turns in the trace (one of 43 turns left out)."""
EDIT_SHARE = 0.15
"""Later turns that resend less than the whole previous prompt (an edited question)."""
WORDS = (
    "the of and to in is it for on as at by an be or we he so no do if up my me us go via new "
    "old one two six ten red top map key log run set get put add end sum max min few all any can "
    "may"
).split()


@dataclass(frozen=True)
class Conversation:
    """One user's chat: when it starts and each turn's question, answer length and pause."""

    start: float
    """Seconds after the run starts."""
    questions: tuple[str, ...]
    answer_tokens: tuple[int, ...]
    """Each turn's answer length (its ``max_tokens``)."""
    pauses: tuple[float, ...]
    """Seconds from each answer to the next question."""
    edits: tuple[bool, ...]
    """Whether each turn replaces the previous question (and its answer) instead of following
    the answer."""

    def next_messages(
        self, messages: list[dict[str, str]], turn: int, answer: str
    ) -> list[dict[str, str]]:
        """The messages turn ``turn`` + 1 starts from, after turn ``turn`` was answered."""
        if self.edits[turn + 1]:
            return messages[:-1]
        return [*messages, {"role": "assistant", "content": answer}]


@dataclass(frozen=True)
class Workload:
    system: str
    conversations: tuple[Conversation, ...]
    block: int = BLOCK_TOKENS
    """Tokens per block (the system prompt's length): 512, or less for a scaled-down test."""

    @property
    def requests(self) -> int:
        return sum(len(c.questions) for c in self.conversations)

    def first_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}]


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


def workload(
    seed: int,
    conversations: int,
    *,
    rate: float = 8.0,
    burst: float = 4.0,
    burst_seconds: float = 2.5,
    pause: float = 2.0,
    first_words: float = 11 * BLOCK_TOKENS - BLOCK_TOKENS,
    scale: float = 1.0,
) -> Workload:
    """``conversations`` conversations starting ``rate`` a second on average, in bursts.

    ``first_words``: the median first question, in words (tokens); the trace's first turns
    have a median 11 blocks, the system prompt's one among them. ``pause``: the median pause
    between an answer and the next question, in seconds. ``scale`` multiplies every length,
    the block's included (a test's workload at an eighth of the size has the same shape in
    64-token blocks)."""
    rng = random.Random(seed)
    block = round(BLOCK_TOKENS * scale)

    def size(median: float, sigma: float, low: int, high: int) -> int:
        return _lognormal(rng, median * scale, sigma, max(1, round(low * scale)), high)

    system = words(random.Random(f"system {seed}"), block - 3)
    mean = (burst + 1 / burst) / 2  # equal time in both states: the mean rate is ``rate``
    bursting, switch, now = True, rng.expovariate(1 / burst_seconds), 0.0
    drawn = []
    for _ in range(conversations):
        now += rng.expovariate(rate * (burst if bursting else 1 / burst) / mean)
        while now > switch:
            bursting, switch = not bursting, switch + rng.expovariate(1 / burst_seconds)
        turns = rng.choices(range(1, len(TURN_COUNTS) + 1), TURN_COUNTS)[0]
        first = words(rng, size(first_words, 1.17, 16, 60_000))
        later = [words(rng, size(600, 1.7, 4, 30_000)) for _ in range(turns - 1)]
        drawn.append(
            Conversation(
                start=now,
                questions=(first, *later),
                answer_tokens=tuple(size(250, 0.8, 1, 2_000) for _ in range(turns)),
                pauses=tuple(pause * rng.lognormvariate(0, 1.0) for _ in range(turns)),
                edits=(False, *(rng.random() < EDIT_SHARE for _ in range(turns - 1))),
            )
        )
    return Workload(system, tuple(drawn), block)


def block_names(tokens: Sequence[str], block: int) -> list[int]:
    """Chain hashes of a prompt's blocks, a trailing partial block included (as the trace
    counts them)."""
    names, name = [], 0
    for start in range(0, len(tokens), block):
        name = hash((name, *tokens[start : start + block]))
        names.append(name)
    return names


def block_reuse(prompts: Sequence[Sequence[str]], block: int = BLOCK_TOKENS) -> float:
    """The share of the prompts' blocks that an earlier prompt had (an unlimited cache of
    prompts, answers not counted): the trace's 36.6%."""
    seen: set[int] = set()
    total = reused = 0
    for tokens in prompts:
        for name in block_names(tokens, block):
            total += 1
            reused += name in seen
            seen.add(name)
    return reused / total if total else math.nan


class SharedCeiling:
    """One prefix cache of the replicas' total size, fed the same requests in the same order
    (a prompt when it is sent, the prompt with its answer when the answer completes, as each
    stand-in caches them): the hits no placement over separate caches can much exceed."""

    def __init__(self, tokens: int, block: int = BLOCK_TOKENS) -> None:
        self.cache = PrefixCache(tokens, block)
        self.prompt_tokens = self.cached_tokens = 0

    def sent(self, tokens: Sequence[str]) -> int:
        cached = self.cache.match(tokens, touch=True)
        self.cache.insert(tokens)
        self.prompt_tokens += len(tokens)
        self.cached_tokens += cached
        return cached

    def answered(self, tokens: Sequence[str], answer: str) -> None:
        self.cache.insert([*tokens, *answer.split(), "<|im_end|>"])

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan


@dataclass
class Replayed:
    """What a run (in-process or against stand-ins) measured."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    served: dict[str, int] = field(default_factory=dict)
    """Requests per replica."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Prompt tokens per replica."""
    ceiling: float = math.nan
    reuse: float = math.nan

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    @property
    def busiest(self) -> float:
        """The busiest replica's requests over an even share."""
        return _busiest(self.served)

    @property
    def busiest_tokens(self) -> float:
        """The busiest replica's prompt tokens over an even share."""
        return _busiest(self.tokens)


def _busiest(per_replica: Mapping[str, int]) -> float:
    total = sum(per_replica.values())
    return max(per_replica.values()) * len(per_replica) / total if total else math.nan


class _View:
    """The route view of the in-process replay: loads are requests in flight, predictions
    each replica's mean TTFT so far (0 before its first request)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.loads = dict.fromkeys(names, 0)
        self.ttfts: dict[str, list[float]] = {name: [] for name in names}
        self.current: Sequence[Mapping[str, Any]] = ()

    def predict(self, target: str, q: float | None) -> float:
        seen = self.ttfts[target]
        return sum(seen) / len(seen) if seen else 0.0

    def available(self, target: str) -> bool:
        return True

    def staleness(self, target: str) -> float:
        return 0.0

    def cold(self, target: str) -> bool:
        return False

    def load(self, target: str) -> float:
        return float(self.loads[target])

    def messages(self) -> Sequence[Mapping[str, Any]]:
        return self.current


def simulate(
    work: Workload,
    policy: Any,
    *,
    replicas: int = 8,
    cache_tokens: int = 150_000,
    ttft: float = 0.02,
    prefill_ms: float = 5.0,
    inter_token: float = 0.001,
    seed: int = 0,
) -> Replayed:
    """The workload through ``policy``'s own decisions, in simulated time, over ``replicas``
    stand-in prefix caches (each ``cache_tokens``), and through one shared cache of their
    total size. A request's first token comes ``ttft`` plus ``prefill_ms`` per 1,000 uncached
    tokens after it is sent, its answer ``inter_token`` a token later; it is in flight (its
    replica's load) until then."""
    names = [f"w{i}" for i in range(replicas)]
    caches = {name: PrefixCache(cache_tokens, work.block) for name in names}
    ceiling = SharedCeiling(cache_tokens * replicas, work.block)
    view, rng, answers = _View(names), random.Random(seed), random.Random(seed + 1)
    result = Replayed(served=dict.fromkeys(names, 0), tokens=dict.fromkeys(names, 0))
    prompts: list[list[str]] = []
    events: list[tuple[float, int, Callable[[float], None]]] = []
    order = iter(range(1 << 62))

    def at(when: float, action: Callable[[float], None]) -> None:
        heapq.heappush(events, (when, next(order), action))

    def send(
        chat: Conversation, turn: int, messages: list[dict[str, str]]
    ) -> Callable[[float], None]:
        def sent(now: float) -> None:
            asked = [*messages, {"role": "user", "content": chat.questions[turn]}]
            view.current = asked
            plan = policy.plan(names, view, rng)
            target = plan.order[0]
            tokens = prompt_token_list(asked)
            prompts.append(tokens)
            cached = caches[target].match(tokens, touch=True)
            caches[target].insert(tokens)
            ceiling.sent(tokens)
            result.prompt_tokens += len(tokens)
            result.cached_tokens += cached
            result.served[target] += 1
            result.tokens[target] += len(tokens)
            view.loads[target] += 1
            first = ttft + prefill_ms * (len(tokens) - cached) / 1e6
            view.ttfts[target].append(first)
            if plan.key is not None:
                policy.observe(plan.key, target)
            answer = words(answers, chat.answer_tokens[turn])

            def done(now: float) -> None:
                view.loads[target] -= 1
                caches[target].insert([*tokens, *answer.split(), "<|im_end|>"])
                ceiling.answered(tokens, answer)
                if plan.key is not None and hasattr(policy, "answered"):
                    policy.answered(plan.key, target, answer)
                if turn + 1 < len(chat.questions):
                    later = chat.next_messages(asked, turn, answer)
                    at(now + chat.pauses[turn], send(chat, turn + 1, later))

            at(now + first + inter_token * chat.answer_tokens[turn], done)

        return sent

    for chat in work.conversations:
        at(chat.start, send(chat, 0, work.first_messages()))
    while events:
        when, _, action = heapq.heappop(events)
        action(when)
    result.ceiling = ceiling.hit_rate
    result.reuse = block_reuse(prompts, work.block)
    return result
