"""Prefix affinity, least-loaded and round-robin: pure decisions on recorded inputs, the load
signal with an injectable clock, the config, and routed chats end to end."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI
from llmroute._routes import policy_for as _policy
from llmroute._types import Timings
from llmroute.cli._chat import route_lines
from llmroute.config import ConfigError, RouteConfig, load_config
from llmroute.routing.engine import SERVER_METRICS_MAX_AGE, Route, Router, RouteTarget
from llmroute.routing.policies import (
    LeastLoadedPolicy,
    Policy,
    PrefixPolicy,
    RoundRobinPolicy,
    WeightedPolicy,
)
from llmroute.routing.prefix import (
    COMMON_MIN_CONVERSATIONS,
    CommonPrefixes,
    PrefixIndex,
    PrefixTree,
    Prompt,
    prompt_blocks,
    render_prompt,
)
from llmroute.routing.stats import IN_FLIGHT_HISTORY, ServerMetrics
from llmroute.testing import Simulator

from ..clock import FakeClock
from ..conftest import KEY

WORKERS = ["w0", "w1", "w2", "w3"]


def system_prompt(topic: str, chars: int = 2000) -> str:
    """A long system prompt, different from the start for each topic."""
    text = f"You are the {topic} assistant. "
    while len(text) < chars:
        text += f"Answer questions about {topic} precisely, citing the {topic} handbook. "
    return text[:chars]


def chat(topic: str, turns: int) -> list[dict[str, Any]]:
    """A conversation of ``turns`` user turns (with the assistant's answers in between)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(topic)}]
    for turn in range(turns):
        if turn:
            messages.append({"role": "assistant", "content": f"Answer {turn} about {topic}. " * 4})
        messages.append({"role": "user", "content": f"Question {turn} about {topic}?"})
    return messages


class View:
    """A route view with recorded loads, predictions and availability."""

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        loads: Mapping[str, float] | None = None,
        ttft: Mapping[str, float] | None = None,
        down: Sequence[str] = (),
    ) -> None:
        self._messages = messages
        self.loads = dict(loads or {})
        self.ttft = dict(ttft or {})
        self.down = set(down)

    def predict(self, target: str, q: float | None) -> float:
        return self.ttft.get(target, 1.0)

    def available(self, target: str) -> bool:
        return target not in self.down

    def staleness(self, target: str) -> float:
        return math.inf

    def cold(self, target: str) -> bool:
        return False

    def load(self, target: str) -> float:
        return self.loads.get(target, 0.0)

    def messages(self) -> Sequence[Mapping[str, Any]]:
        return self._messages


def first(policy: PrefixPolicy, view: View, targets: Sequence[str] = WORKERS) -> str:
    return policy.plan(targets, view, random.Random(0)).order[0]


# --- blocks and trees -------------------------------------------------------------------------


def test_blocks_name_whole_prefixes() -> None:
    one = [{"role": "user", "content": "a" * 200}]
    two = [{"role": "user", "content": "a" * 150 + "b" * 50}]
    text = render_prompt(one)
    assert len(prompt_blocks(one, 64)) == math.ceil(len(text) / 64)
    assert prompt_blocks(one, 64) == prompt_blocks([dict(one[0])], 64)  # stable in a process
    b1, b2 = prompt_blocks(one, 64), prompt_blocks(two, 64)
    shared = (len("user\x1f") + 150) // 64  # whole blocks before the first difference
    assert b1[:shared] == b2[:shared] and b1[shared] != b2[shared]
    # the same block text at another position, or after another prefix, is another name
    assert prompt_blocks([{"role": "user", "content": "b" * 200}], 64)[1] not in b1
    assert len(prompt_blocks(one, 16, max_blocks=3)) == 3
    assert prompt_blocks([], 64) == ()


def test_rendering_fingerprints_non_text_parts() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    parts = [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]
    text = render_prompt(parts)
    assert "look" in text and len(text) < 100
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "B" * 100_000}}
    assert render_prompt([{"role": "user", "content": [{"type": "text", "text": "look"}, other]}])
    assert text != render_prompt(
        [{"role": "user", "content": [{"type": "text", "text": "look"}, other]}]
    )
    calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}
    assert render_prompt([calls]) != render_prompt([{"role": "assistant", "content": None}])


def test_tree_matches_leading_blocks() -> None:
    tree = PrefixTree(max_blocks=100)
    prompt = (1, 2, 3, 4, 5)
    assert tree.match(prompt) == 0
    tree.insert(prompt)
    assert len(tree) == 5
    assert tree.match(prompt) == 5
    assert tree.match((1, 2, 3, 9, 9, 9)) == 3
    assert tree.match((1, 2, 3)) == 3
    assert tree.match((9, 2, 3)) == 0
    tree.insert((1, 2, 3, 6, 7))  # a shared prefix is stored once
    assert len(tree) == 7


def test_tree_is_bounded_and_evicts_leaves_before_shared_prefixes() -> None:
    tree = PrefixTree(max_blocks=8)
    tree.insert((1, 2, 3, 4, 5))
    tree.insert((1, 2, 30, 40, 50))  # 1, 2 shared: 8 blocks
    assert len(tree) == 8
    tree.insert((100, 200))  # two blocks must go: the oldest leaves, 5 then 4
    assert len(tree) == 8
    assert tree.match((1, 2, 3, 4, 5)) == 3
    assert tree.match((1, 2, 30, 40, 50)) == 5
    assert 1 in tree and 2 in tree
    for n in range(50):  # whatever goes in, what is held of any prompt is a leading run
        tree.insert(tuple(1000 * n + i for i in range(n % 7 + 1)))
        assert len(tree) <= 8
    assert tree.match((1, 2, 30, 40, 50)) == 0
    blocks = tuple(range(5000, 5020))  # longer than the tree: its deepest blocks go first
    tree.insert(blocks)
    assert len(tree) == 8 and tree.match(blocks) == 8
    with pytest.raises(ValueError):
        PrefixTree(0)
    index = PrefixIndex(max_blocks=4)
    index.tree("a").insert((1, 2, 3, 4, 5, 6))
    assert index.sizes() == {"a": 4}


def leading_run(tree: PrefixTree, blocks: Sequence[int]) -> int:
    """What :meth:`PrefixTree.match` must return, counted one block at a time."""
    count = 0
    for block in blocks:
        if block not in tree:
            break
        count += 1
    return count


def test_a_discard_takes_back_only_what_its_insert_alone_added() -> None:
    tree = PrefixTree(max_blocks=100)
    tree.insert((1, 2))  # served: nobody's to take back
    tree.insert((1, 2, 3, 4, 5), owner=7)  # a turn in flight adds 3, 4, 5
    tree.insert((1, 2, 3, 4, 6, 8), owner=8)  # a longer turn in flight touches 3, 4, adds 6, 8
    tree.discard((3, 4, 5), owner=7)  # the first turn was served elsewhere
    assert 5 not in tree
    assert tree.match((1, 2, 3, 4, 6, 8)) == leading_run(tree, (1, 2, 3, 4, 6, 8)) == 6
    tree.discard((3, 4, 6, 8), owner=8)  # and the longer one too
    assert tree.match((1, 2, 3, 4, 6, 8)) == leading_run(tree, (1, 2, 3, 4, 6, 8)) == 4
    tree.insert((1, 2, 9), owner=9)
    tree.insert((1, 2, 9))  # served meanwhile by another request: 9 stays
    tree.discard((9,), owner=9)
    assert 9 in tree


def test_a_prompt_extended_by_an_answer_is_the_next_turns_prefix() -> None:
    messages = chat("billing", 1)
    answer = {"role": "assistant", "content": "An answer about billing. " * 9}
    text = render_prompt(messages)
    settings = [(64, 16384), (7, 16384), (64, 3), (64, 32), (1, 5000), (len(text), 100)]
    for block_chars, max_blocks in settings:
        prompt = Prompt.of(messages, block_chars, max_blocks)
        assert prompt.blocks == prompt_blocks(messages, block_chars, max_blocks)
        assert prompt.chars == min(len(text), block_chars * max_blocks)
        longer = prompt.extend([answer])
        assert longer.blocks == prompt_blocks([*messages, answer], block_chars, max_blocks)
        assert longer.chars == min(
            len(render_prompt([*messages, answer])), block_chars * max_blocks
        )
        assert longer.extend([]).blocks == longer.blocks
    short = Prompt("x" * 100, 64)  # one whole block and 36 characters
    assert (short.share(0), short.share(1), short.share(2)) == (0.0, 0.64, 1.0)
    assert Prompt("", 64).share(0) == 0.0 and Prompt("", 64).blocks == ()


def test_matches_stay_exact_whatever_requests_interleave() -> None:
    """Plans, failovers, answers and evictions in random order: what a tree holds of any
    prompt stays a leading run, so the binary search in match() counts it exactly."""
    rng = random.Random(5)
    policy = PrefixPolicy(block_chars=8, max_blocks=120)
    chats = [[{"role": "system", "content": f"You help with topic {n}."}] for n in range(4)]
    pending: list[tuple[Any, str, list[dict[str, Any]]]] = []
    seen: list[tuple[int, ...]] = []
    for step in range(600):
        if pending and rng.random() < 0.5:
            key, planned, messages = pending.pop(rng.randrange(len(pending)))
            winner = rng.choice([planned, planned, rng.choice(WORKERS), None])
            policy.observe(key, winner)
            if winner is not None and rng.random() < 0.7:
                answer = f"Answer {step}. " * rng.randint(0, 6)
                policy.answered(key, winner, answer)
                messages.append({"role": "assistant", "content": answer})
                seen.append(prompt_blocks(messages, 8, 120))
        else:
            messages = rng.choice(chats)
            messages.append({"role": "user", "content": f"Question {step}?"})
            loads = {w: float(rng.randint(0, 3)) for w in WORKERS}
            plan = policy.plan(WORKERS, View(list(messages), loads=loads), rng)
            seen.append(prompt_blocks(messages, 8, 120))
            pending.append((plan.key, plan.order[0], messages))
        for worker in WORKERS:
            tree = policy.index.tree(worker)
            assert len(tree) <= 120
            for blocks in seen[-40:]:
                assert tree.match(blocks) == leading_run(tree, blocks)


# --- prefix policy ----------------------------------------------------------------------------


def test_a_conversations_turns_stick_to_one_worker() -> None:
    policy = PrefixPolicy()
    loads = dict.fromkeys(WORKERS, 0.0)
    chosen = {first(policy, View(chat("billing", n), loads=loads)) for n in range(1, 8)}
    assert len(chosen) == 1
    # another worker got busier meanwhile (under the imbalance thresholds): it still sticks
    worker = chosen.pop()
    loads[worker] = 40.0
    assert first(policy, View(chat("billing", 8), loads=loads)) == worker


def test_different_system_prompts_spread() -> None:
    policy = PrefixPolicy()
    topics = ["billing", "shipping", "returns", "warranty"]
    firsts = [first(policy, View(chat(topic, 1))) for topic in topics]
    assert sorted(firsts) == WORKERS  # equal loads: the smallest tree takes a new prefix
    for topic, worker in zip(topics, firsts, strict=True):  # and each keeps its own
        assert first(policy, View(chat(topic, 3))) == worker


def test_concurrent_requests_of_a_conversation_stick_before_any_answer() -> None:
    policy = PrefixPolicy()
    one = first(policy, View(chat("billing", 1)))
    # the first request is still in flight (no observe yet): its worker is the busiest
    assert first(policy, View(chat("billing", 1), loads={one: 1.0})) == one


def test_below_the_threshold_the_least_loaded_worker_is_chosen() -> None:
    policy = PrefixPolicy(cache_threshold=0.5)
    short = [{"role": "system", "content": "s" * 640}, {"role": "user", "content": "hi"}]
    assert first(policy, View(short)) == "w0"
    longer = [*short, {"role": "assistant", "content": "x" * 2000}]  # w0 holds about 25%
    loads = {"w0": 3.0, "w1": 5.0, "w2": 1.0, "w3": 2.0}
    plan = policy.plan(WORKERS, View(longer, loads=loads), random.Random(0))
    assert plan.order == ("w2", "w3", "w0", "w1")
    assert policy.index.tree("w2").match(prompt_blocks(longer)) == len(prompt_blocks(longer))
    # above the threshold the holder wins although it is not the least loaded
    assert first(policy, View(longer, loads={"w2": 5.0})) == "w2"
    off = PrefixPolicy(cache_threshold=1.0)  # no share is above 1: affinity is off
    assert first(off, View(short)) == "w0"
    assert first(off, View(short, loads={"w0": 1.0})) == "w1"


def test_least_loaded_ties_go_to_the_smallest_tree_then_ttft() -> None:
    policy = PrefixPolicy()
    policy.index.tree("w0").insert((1, 2, 3))
    view = View(chat("new", 1), ttft={"w1": 2.0, "w2": 0.5, "w3": 1.0})
    assert policy.plan(WORKERS, view, random.Random(0)).order == ("w2", "w3", "w1", "w0")


@pytest.mark.parametrize(
    ("held", "other", "expected"),
    [
        (100.0, 10.0, "w1"),  # 90 apart and 10x: imbalanced, the least-loaded worker
        (70.0, 60.0, "w0"),  # 10 apart: balanced, the worker with the prefix
        (200.0, 150.0, "w0"),  # 50 apart (< 64): balanced
        (300.0, 230.0, "w0"),  # 70 apart but only 1.3x: balanced
        (65.0, 0.0, "w1"),  # 65 apart and an idle worker
    ],
)
def test_the_imbalance_rule(held: float, other: float, expected: str) -> None:
    policy = PrefixPolicy()
    messages = chat("billing", 2)
    assert first(policy, View(messages), ["w0", "w1"]) == "w0"
    view = View(messages, loads={"w0": held, "w1": other})
    assert first(policy, view, ["w0", "w1"]) == expected
    assert PrefixPolicy().imbalanced([100, 10]) and not PrefixPolicy().imbalanced([70, 60])
    assert not PrefixPolicy().imbalanced([1000])


def test_failover_order_and_unavailable_workers() -> None:
    policy = PrefixPolicy()
    messages = chat("billing", 1)
    assert first(policy, View(messages)) == "w0"
    loads = {"w0": 5.0, "w1": 4.0, "w2": 1.0, "w3": 2.0}
    plan = policy.plan(WORKERS, View(messages, loads=loads), random.Random(0))
    assert plan.order == ("w0", "w2", "w3", "w1")  # the holder, then least loaded first
    assert plan.start == 1 and plan.hedge_delays == ()
    plan = policy.plan(WORKERS, View(messages, loads=loads, down=["w0"]), random.Random(0))
    assert plan.order == ("w2", "w3", "w1", "w0")  # an open circuit: last resort
    plan = policy.plan(WORKERS, View(messages, down=WORKERS), random.Random(0))
    assert sorted(plan.order) == WORKERS and plan.key is None


def test_the_serving_worker_takes_over_the_prefix() -> None:
    policy = PrefixPolicy()
    messages = chat("billing", 1)
    plan = policy.plan(WORKERS, View(messages), random.Random(0))
    assert plan.order[0] == "w0" and plan.key is not None
    policy.observe(plan.key, "w2")  # w0 failed, w2 served
    assert policy.index.tree("w0").match(prompt_blocks(messages)) == 0
    assert first(policy, View(chat("billing", 2))) == "w2"
    plan = policy.plan(WORKERS, View(chat("billing", 3)), random.Random(0))
    policy.observe(plan.key, "w2")  # served where planned: nothing moves
    policy.observe(plan.key, None)  # nobody served: the plan's new blocks are forgotten
    assert policy.index.tree("w2").match(prompt_blocks(chat("billing", 3))) > 0
    policy.observe("not a key", "w1")
    assert policy.plan(WORKERS, View([]), random.Random(0)).key is None


def test_a_turn_served_elsewhere_leaves_a_concurrent_longer_turn_whole() -> None:
    policy = PrefixPolicy()
    rng = random.Random(0)
    # an earlier chat on w0 whose system prompt shares the first 1,000 characters
    earlier = [{"role": "system", "content": system_prompt("billing", 1000)}]
    assert first(policy, View([*earlier, {"role": "user", "content": "Hi?"}])) == "w0"
    busy = {"w1": 1.0, "w2": 1.0, "w3": 1.0}
    one = policy.plan(WORKERS, View(chat("billing", 1), loads=busy), rng)  # adds its blocks
    two = policy.plan(WORKERS, View(chat("billing", 2)), rng)  # extends them, still in flight
    assert one.order[0] == two.order[0] == "w0"
    policy.observe(one.key, "w1")  # the first turn failed over to w1
    tree = policy.index.tree("w0")
    blocks = prompt_blocks(chat("billing", 2))
    assert all(block in tree for block in blocks)  # no hole in the longer turn's chain
    assert tree.match(blocks) == leading_run(tree, blocks) == len(blocks)
    assert prompt_blocks(chat("billing", 1))[-1] not in tree  # what the first turn alone added
    assert policy.index.tree("w1").match(prompt_blocks(chat("billing", 1))) == len(
        prompt_blocks(chat("billing", 1))
    )
    policy.observe(two.key, None)  # and the longer turn was not served either
    assert tree.match(blocks) == leading_run(tree, blocks)


def test_a_short_prompt_chat_stays_where_its_answers_are() -> None:
    policy = PrefixPolicy()
    other = [
        {"role": "system", "content": "You are a helpful assistant. Be concise."},
        {"role": "user", "content": "What is the capital of France? Please answer briefly."},
    ]
    assert first(policy, View(other)) == "w0"  # another chat: the trees differ in size
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a haiku about autumn leaves falling."},
    ]
    winners = []
    for turn in range(5):
        plan = policy.plan(WORKERS, View(messages), random.Random(0))
        winner = plan.order[0]
        policy.observe(plan.key, winner)
        answer = f"Crimson leaves drift down, whispering to the cold earth ({turn}). " * 2
        policy.answered(plan.key, winner, answer)  # the server caches the prompt + the answer
        messages = [*messages, {"role": "assistant", "content": answer}]
        held = policy.index.tree(winner).match(prompt_blocks(messages))
        assert held == len(prompt_blocks(messages))
        messages.append({"role": "user", "content": f"Now another one, number {turn}."})
        winners.append(winner)
    assert len(set(winners)) == 1, winners
    assert sum(policy.index.sizes().values()) < 16384  # bounded as before
    sizes = policy.index.sizes()
    policy.answered("not a key", "w1", "text")
    assert policy.index.sizes() == sizes


def test_the_share_is_counted_in_characters() -> None:
    policy = PrefixPolicy()
    one = [{"role": "user", "content": "a" * 80 + "1"}]  # 87 characters: 1 whole block of 2
    two = [{"role": "user", "content": "a" * 80 + "2"}]
    assert first(policy, View(one)) == "w0"
    assert first(policy, View(two)) == "w0"  # 64 of 87 characters held (74%), 1 of 2 blocks
    three = [{"role": "user", "content": "a" * 50 + "b" * 80}]  # 136: 64 held (47%)
    assert first(policy, View(three)) == "w1"


EIGHT = [f"w{i}" for i in range(8)]
SHARED_SYSTEM = {"role": "system", "content": system_prompt("every user's", 4000)}


def serve(policy: PrefixPolicy, messages: list[dict[str, Any]], workers: Sequence[str]) -> str:
    """Plan a request on idle workers, serve it where planned and complete its answer."""
    plan = policy.plan(workers, View(messages), random.Random(0))
    policy.observe(plan.key, plan.order[0])
    policy.answered(plan.key, plan.order[0], f"An answer to {len(messages)} messages.")
    return plan.order[0]


def test_a_system_prompt_every_chat_starts_with_decides_nothing() -> None:
    """Every chat starts with the same 4,000-character system prompt and a short question (the
    prompt is mostly the system prompt). Following the longest prefix put all of them on the
    first worker; the system prompt is common, so new chats spread and each stays put."""
    policy = PrefixPolicy()
    chats = [[SHARED_SYSTEM, {"role": "user", "content": f"Question {i}?"}] for i in range(40)]
    homes = [serve(policy, messages, EIGHT) for messages in chats]
    assert sorted(homes.count(w) for w in EIGHT) == [5] * 8  # the old rule: [0] * 7 + [40]
    plan = policy.plan(EIGHT, View([SHARED_SYSTEM, {"role": "user", "content": "New?"}]), RNG)
    assert plan.reason.startswith("least loaded: the best match")
    assert "common prefix" in plan.reason
    for i, messages in enumerate(chats[:8]):  # each chat's next turn goes where its history is
        answer = f"An answer to {len(messages)} messages."
        later = [*messages, {"role": "assistant", "content": answer}]
        later.append({"role": "user", "content": f"And then {i}?"})
        plan = policy.plan(EIGHT, View(later, loads={homes[i]: 3.0}), RNG)
        assert plan.order[0] == homes[i]
        assert plan.reason.startswith("prefix: holds") and "beyond its common prefix" in plan.reason


RNG = random.Random(0)


def test_a_system_prompt_of_a_few_chats_still_keeps_them_together() -> None:
    """Ten system prompts, four chats each, interleaved, over four workers: each is shared by a
    tenth of the chats, under an even share (a quarter), so its chats stay on one worker."""
    policy = PrefixPolicy()
    homes: dict[str, set[str]] = {}
    for i in range(40):
        topic = f"topic {i % 10}"
        messages = [{"role": "system", "content": system_prompt(topic)}]
        messages.append({"role": "user", "content": f"Question {i}?"})
        homes.setdefault(topic, set()).add(serve(policy, messages, WORKERS))
    assert all(len(workers) == 1 for workers in homes.values()), homes


def test_common_prefixes_count_conversations_not_turns() -> None:
    common = CommonPrefixes()
    system = Prompt(system_prompt("shared", 640) + "x" * 10)  # 10 whole blocks and a tail
    first = Prompt(system_prompt("shared", 640) + "the first chat, turn 1")
    common.record(first, 0)  # nothing held anywhere yet: a new conversation, nothing shared
    assert common.conversations == 1 and common.count(first.blocks[0]) == 1
    turn = first
    for n in range(2, 6):  # its next turns extend it: no new conversation, no count
        answer = turn.extend(({"role": "assistant", "content": f"answer {n}. " * 12},))
        common.answered(turn, answer)
        turn = answer.extend(({"role": "user", "content": f"Question {n}?"},))
        common.record(turn, len(answer.blocks) - 1)  # held: all but the answer's partial block
    assert common.conversations == 1 and common.count(first.blocks[0]) == 1
    for n in range(2, 2 + COMMON_MIN_CONVERSATIONS):  # new chats through the system prompt
        other = Prompt(system_prompt("shared", 640) + f"chat number {n}, a new question")
        assert common.depth(other.blocks, 10, 0.25) == 0  # not common yet
        common.record(other, 10)
        common.answered(other, other.extend(({"role": "assistant", "content": "Sure."},)))
    assert common.count(first.blocks[9]) == pytest.approx(5, rel=0.05)
    assert common.depth(system.blocks, 10, 0.25) == 10  # 5 of 5 conversations, at least 4
    assert common.depth(system.blocks, 4, 0.25) == 4  # no deeper than the match
    assert common.depth(first.blocks, 12, 0.25) == 10  # the chat's own blocks are its own
    assert common.depth(system.blocks, 10, 1.0) == 0  # not more than all of them
    common.record(other, len(other.blocks))  # the same prompt again: counts nothing
    assert common.conversations == pytest.approx(5, rel=0.05)


def test_common_counts_fade_with_newer_conversations() -> None:
    common = CommonPrefixes(half_life=4)
    shared = [Prompt(system_prompt("old", 640) + f"chat {n} " * 20) for n in range(6)]
    common.record(shared[0], 0)
    for prompt in shared[1:]:
        common.record(prompt, 10)
    assert common.depth(shared[0].blocks, 10, 0.5) == 10
    before = common.count(shared[0].blocks[0])
    for n in range(8):  # eight unrelated conversations: two half-lives
        common.record(Prompt(f"unrelated conversation {n} " * 10), 0)
    assert common.count(shared[0].blocks[0]) == pytest.approx(before / 4, rel=0.05)
    assert common.depth(shared[0].blocks, 10, 0.1) == 0  # under the minimum of four now
    with pytest.raises(ValueError):
        CommonPrefixes(half_life=0)


def test_new_chats_go_where_fewer_requests_went_lately() -> None:
    """Idle workers tie on load: a new chat goes to the least of the recent work, its share of
    the trees plus its share of the requests served lately, so the worker of a long chat of
    short turns takes none (by tree size alone it took 5 of 9: its tree is the smallest)."""
    policy = PrefixPolicy()
    for topic in ("big a", "big b", "big c"):  # one long prompt each on w0, w1 and w2
        serve(policy, [{"role": "system", "content": system_prompt(topic, 8000)}], WORKERS)
    short: list[dict[str, Any]] = [{"role": "user", "content": "Hi there, a quick question?"}]
    home = serve(policy, short, WORKERS)
    for turn in range(8):
        short += [
            {"role": "assistant", "content": f"An answer to {len(short)} messages."},
            {"role": "user", "content": f"And {turn}?"},
        ]
        assert serve(policy, short, WORKERS) == home
    assert home == "w3" and len(policy.index.tree("w3")) < len(policy.index.tree("w0"))
    others = [serve(policy, chat(f"short {i}", 1), WORKERS) for i in range(9)]
    assert sorted(others.count(w) for w in WORKERS) == [0, 3, 3, 3] and home not in others


def test_prefix_policy_checks_its_settings() -> None:
    with pytest.raises(ValueError):
        PrefixPolicy(cache_threshold=1.5)
    with pytest.raises(ValueError):
        PrefixPolicy(block_chars=0)
    with pytest.raises(ValueError):
        PrefixPolicy(balance_rel_threshold=0.5)


# --- least-loaded and round-robin -------------------------------------------------------------


def test_least_loaded_order() -> None:
    view = View(loads={"A": 3.0, "B": 1.0, "C": 1.0, "D": 0.0}, ttft={"B": 0.9, "C": 0.4})
    plan = LeastLoadedPolicy().plan(["A", "B", "C", "D"], view, random.Random(0))
    assert plan.order == ("D", "C", "B", "A")
    view.down.add("D")
    assert LeastLoadedPolicy().plan(["A", "B", "C", "D"], view, random.Random(0)).order == (
        "C",
        "B",
        "A",
        "D",
    )
    idle = View()  # all equal: the configured order
    assert LeastLoadedPolicy().plan(["C", "A", "B"], idle, random.Random(0)).order == (
        "C",
        "A",
        "B",
    )


def test_round_robin_order() -> None:
    policy = RoundRobinPolicy()
    view = View()
    orders = [policy.plan(["A", "B", "C"], view, random.Random(0)).order for _ in range(4)]
    assert orders == [("A", "B", "C"), ("B", "C", "A"), ("C", "A", "B"), ("A", "B", "C")]
    view.down.add("B")
    orders = [policy.plan(["A", "B", "C"], view, random.Random(0)).order for _ in range(4)]
    assert orders == [("C", "A", "B"), ("A", "C", "B"), ("C", "A", "B"), ("A", "C", "B")]
    view.down.update("AC")
    assert policy.plan(["A", "B", "C"], view, random.Random(0)).order == ("A", "B", "C")
    assert RoundRobinPolicy().plan([], view, random.Random(0)).order == ()


def test_a_weighted_plan_needs_one_weight_per_target() -> None:
    policy = WeightedPolicy(weights=(1.0, 2.0))
    assert sorted(policy.plan(["A", "B"], View(), random.Random(0)).order) == ["A", "B"]
    with pytest.raises(ValueError, match=r"has 2 weights for 3 targets \(A, B, C\): each target"):
        policy.plan(["A", "B", "C"], View(), random.Random(0))  # say, a target added later
    with pytest.raises(ValueError, match="has 2 weights for 1 target"):
        policy.plan(["A"], View(), random.Random(0))


# --- the load signal --------------------------------------------------------------------------


def test_load_is_local_in_flight_without_server_metrics() -> None:
    router = Router({}, clock=FakeClock())
    assert router.load("a") == 0.0
    router.stats.target("a").load.started()
    router.stats.target("a").load.started()
    assert router.load("a") == 2.0


def test_load_is_the_servers_queue_plus_requests_started_since_the_reading() -> None:
    clock = FakeClock()
    router = Router({}, clock=clock)
    stats = router.stats.target("gpu").load
    stats.started()  # one of ours is running there, and in the reading
    clock.advance(0.01)
    stats.server = ServerMetrics(read_at=clock(), queued=3, running=5)
    clock.advance(0.3)
    assert router.load("gpu") == 8.0
    stats.started()
    stats.started()  # two more since the reading
    assert router.load("gpu") == 10.0
    clock.advance(0.01)
    stats.finished()
    assert router.load("gpu") == 9.0
    stats.server = ServerMetrics(read_at=clock(), queued=0, running=2)  # a new reading
    assert router.load("gpu") == 2.0
    clock.advance(0.01)
    for _ in range(3):
        stats.finished()
    assert router.load("gpu") == 0.0  # never below zero
    clock.advance(SERVER_METRICS_MAX_AGE + 0.1)  # the poller stopped: only our own count
    stats.started()
    assert router.load("gpu") == 1.0


def test_requests_sent_between_a_reading_and_its_first_use_count_once() -> None:
    """The reading is dated when it was taken: requests sent before it arrived (or before the
    router first looked at it) are added, not absorbed into a baseline taken at first use."""
    clock = FakeClock()
    router = Router({}, clock=clock)
    stats = router.stats.target("gpu").load
    taken = clock()  # the scrape goes out: the server is idle
    clock.advance(0.05)
    for _ in range(3):  # a burst while the answer is on its way
        stats.started()
        clock.advance(0.01)
    stats.observe_server(ServerMetrics(read_at=taken, queued=0, running=0))
    assert router.load("gpu") == 3.0
    clock.advance(0.1)
    assert router.load("gpu") == 3.0  # looking again changes nothing
    stats.finished()
    assert router.load("gpu") == 2.0


def test_an_older_reading_arriving_late_does_not_replace_a_newer_one() -> None:
    clock = FakeClock()
    router = Router({}, clock=clock)
    stats = router.stats.target("gpu").load
    old = ServerMetrics(read_at=clock(), queued=9, running=8)
    clock.advance(0.5)
    new = ServerMetrics(read_at=clock(), queued=0, running=1)
    assert stats.observe_server(new)
    assert not stats.observe_server(old)
    assert stats.server is new
    assert router.load("gpu") == 1.0


def test_the_load_of_a_data_parallel_server_is_per_rank() -> None:
    clock = FakeClock()
    router = Router({}, clock=clock)
    stats = router.stats.target("gpu").load
    stats.observe_server(ServerMetrics(read_at=clock(), queued=2, running=4, ranks=(3, 3)))
    clock.advance(0.01)
    stats.started()
    stats.started()
    assert router.load("gpu") == 4.0  # (6 + 2) over two ranks


def test_in_flight_history_is_bounded_in_time() -> None:
    clock = FakeClock()
    stats = Router({}, clock=clock).stats.target("gpu").load
    stats.started()
    at_one = clock()
    clock.advance(IN_FLIGHT_HISTORY + 1)
    stats.started()
    assert stats.in_flight_at(at_one) == 1  # the oldest count remembered
    assert stats.in_flight_at(clock()) == 2
    assert len(stats._flights) == 1


class RouterView(View):
    """A route view whose loads are the router's (its stats and server readings)."""

    def __init__(self, router: Router, messages: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(messages)
        self.router = router

    def load(self, target: str) -> float:
        return self.router.load(target)


@pytest.mark.parametrize("seed", range(5))
def test_a_burst_of_new_families_spreads_with_late_out_of_order_and_missing_readings(
    seed: int,
) -> None:
    """Twenty new long-prefix families arrive 20 ms apart at two idle workers, each request
    holding its worker for a second. Each worker is scraped every 100 ms; an answer arrives
    50-400 ms later (so answers overtake each other), and one in five never arrives. With each
    request counted once, whether in a reading or sent since, the families split 10 / 10
    (counting the requests sent since a reading from when it was first used, rather than taken,
    put up to 12 on one worker)."""
    rng = random.Random(seed)
    clock = FakeClock()
    router = Router({}, clock=clock)
    policy = PrefixPolicy()
    workers = ["w0", "w1"]
    ends: list[tuple[float, str]] = []  # when each request leaves its worker
    starts: list[tuple[float, str]] = []  # when it reached it (what a scrape sees)
    readings: list[tuple[float, str, ServerMetrics]] = []  # (arrives at, worker, reading)
    families: dict[str, int] = dict.fromkeys(workers, 0)
    t0 = clock()
    next_scrape = t0
    for family in range(20):
        arrive = t0 + 0.02 * family
        # everything that happens before this request, in time order
        while True:
            due = [(when, "end", w) for when, w in ends if when <= arrive]
            due += [(at, "reading", i) for i, (at, _, _) in enumerate(readings) if at <= arrive]
            if next_scrape <= arrive:
                due.append((next_scrape, "scrape", ""))
            if not due:
                break
            when, kind, what = min(due, key=lambda event: event[0])
            clock.now = when
            if kind == "end":
                ends.remove((when, str(what)))
                router.stats.target(str(what)).load.finished()
            elif kind == "reading":
                _, worker, metrics = readings.pop(int(what))
                router.stats.target(worker).load.observe_server(metrics)
            else:
                for worker in workers:
                    busy = sum(1 for s, w in starts if w == worker and s <= when < s + 1.0)
                    if rng.random() < 0.2:
                        continue  # lost
                    metrics = ServerMetrics(read_at=when, queued=0, running=busy)
                    readings.append((when + rng.uniform(0.05, 0.4), worker, metrics))
                next_scrape += 0.1
        clock.now = arrive
        view = RouterView(router, chat(f"family {family}", 1))
        choice = policy.plan(workers, view, rng).order[0]
        router.stats.target(choice).load.started()
        starts.append((arrive, choice))
        ends.append((arrive + 1.0, choice))
        families[choice] += 1
    assert families == {"w0": 10, "w1": 10}


# --- config -----------------------------------------------------------------------------------


def route_config(**settings: Any) -> dict[str, Any]:
    return {
        "providers": {"a": {"base_url": "http://127.0.0.1:1/v1"}},
        "models": {"chat": {"targets": ["a:x", "a:y"], **settings}},
    }


def test_config_maps_the_new_policies() -> None:
    config = load_config(
        route_config(
            policy="prefix",
            prefix_block_chars=32,
            prefix_max_blocks=1000,
            cache_threshold=0.3,
            balance_abs_threshold=16,
            balance_rel_threshold=2,
        )
    )
    assert config is not None
    policy = _policy(config.models["chat"])
    assert isinstance(policy, PrefixPolicy)
    assert (policy.block_chars, policy.index.max_blocks, policy.cache_threshold) == (32, 1000, 0.3)
    assert (policy.balance_abs_threshold, policy.balance_rel_threshold) == (16, 2.0)
    assert isinstance(
        _policy(RouteConfig(targets=["a:x"], policy="least-loaded")), LeastLoadedPolicy
    )
    assert isinstance(_policy(RouteConfig(targets=["a:x"], policy="round-robin")), RoundRobinPolicy)
    defaults = RouteConfig(targets=["a:x"])
    assert (defaults.prefix_block_chars, defaults.prefix_max_blocks) == (64, 16384)
    assert (defaults.cache_threshold, defaults.balance_abs_threshold) == (0.5, 64)
    assert defaults.balance_rel_threshold == 1.5


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"cache_threshold": 1.5}, "models.chat.cache_threshold: expected a number at most 1"),
        ({"cache_threshold": -0.1}, "models.chat.cache_threshold: expected a number at least 0"),
        ({"prefix_block_chars": 0}, "models.chat.prefix_block_chars: expected a number at least"),
        ({"prefix_max_blocks": 0}, "models.chat.prefix_max_blocks: expected a number at least 1"),
        ({"balance_abs_threshold": -1}, "models.chat.balance_abs_threshold: expected a number"),
        ({"balance_rel_threshold": 0.9}, "models.chat.balance_rel_threshold: expected a number"),
        ({"policy": "prefx"}, "(did you mean 'prefix'?)"),
        ({"policy": "least_loaded"}, "(did you mean 'least-loaded'?)"),
        ({"prefix_blocks": 3}, "models.chat.prefix_blocks: unknown key"),
    ],
)
def test_config_validation(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(route_config(**settings))
    assert message in str(info.value)


# --- end to end -------------------------------------------------------------------------------


def sim_config(targets: dict[str, str], **route: Any) -> dict[str, Any]:
    return {
        "providers": {name: {"base_url": url, "api_key": KEY} for name, url in targets.items()},
        "models": {"chat": {"targets": [f"{name}:sim-small" for name in targets], **route}},
        "routing": {"explore": 0},
    }


async def ask(client: AsyncOpenAI, messages: list[dict[str, Any]]) -> tuple[str, Any]:
    stream = await client.chat.completions.create(model="chat", messages=messages, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert stream.route is not None
    return text, stream.route


@pytest.mark.anyio
async def test_multi_turn_chats_stick_to_one_target(sim: Simulator) -> None:
    cfg = sim_config({name: sim.base_url for name in "abcd"}, policy="prefix")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        winners: dict[str, list[str]] = {}
        conversations = {t: chat(t, 1)[:1] for t in ("billing", "shipping", "returns")}
        for turn in range(4):
            for topic, messages in conversations.items():
                messages.append({"role": "user", "content": f"Question {turn} on {topic}?"})
                text, route = await ask(client, messages)
                messages.append({"role": "assistant", "content": text})
                winners.setdefault(topic, []).append(route.winner)
                assert route.policy == "prefix" and len(route.attempts) == 1
                # the report says why: a new chat's prompt is held nowhere, a later turn's is
                why = "least loaded: the best match" if turn == 0 else "prefix: holds"
                assert route.reason.startswith(why), route.reason
                assert f"  why: {route.reason}" in route_lines(route, None, "chat")
    assert all(len(set(w)) == 1 for w in winners.values()), winners
    assert len({w[0] for w in winners.values()}) == 3  # each conversation on its own target


@pytest.mark.anyio
async def test_concurrent_turns_stick_and_other_chats_go_elsewhere(sim_slow: Simulator) -> None:
    cfg = sim_config({name: sim_slow.base_url for name in "ab"}, policy="prefix")
    async with AsyncOpenAI(config=cfg, verify=sim_slow.ssl_context(), max_retries=0) as client:
        first = await client.chat.completions.create(
            model="chat", messages=chat("billing", 1), stream=True
        )
        second = await client.chat.completions.create(
            model="chat", messages=chat("billing", 2), stream=True
        )
        other = await client.chat.completions.create(
            model="chat", messages=chat("shipping", 1), stream=True
        )
        winners = [s.route.winner for s in (first, second, other) if s.route is not None]
        for stream in (first, second, other):
            await stream.close()
    assert winners[0] == winners[1] != winners[2]  # a busy target: the new chat goes elsewhere


@pytest.mark.anyio
async def test_an_erroring_target_fails_over_and_the_chat_moves(sim: Simulator) -> None:
    with Simulator(tls=True) as gone:
        dead = gone.base_url
    cfg = sim_config({"dead": dead, "b": sim.base_url, "c": sim.base_url}, policy="prefix")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        messages = chat("billing", 1)
        text, route = await ask(client, messages)
        assert text
        assert [(a.target, a.outcome) for a in route.attempts] == [
            ("dead:sim-small", "error"),
            ("b:sim-small", "won"),
        ]
        for turn in range(2):
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"And {turn}?"},
            ]
            completion = await client.chat.completions.create(model="chat", messages=messages)
            route = completion.route  # type: ignore[attr-defined]
            assert [(a.target, a.outcome) for a in route.attempts] == [("b:sim-small", "won")]
        _, route = await ask(client, chat("shipping", 1))  # a new chat tries dead again
        assert [(a.target, a.outcome) for a in route.attempts] == [
            ("dead:sim-small", "error"),
            ("c:sim-small", "won"),  # the smaller tree of the two
        ]


# --- the engine's hooks, with a scripted sender -----------------------------------------------


class ScriptedSender:
    """Answers requests that are not streamed like a provider would: per target, the outcomes
    of its next requests (a status code, an answer's text, or an assistant message); then
    ``"An answer."``."""

    def __init__(self, script: Mapping[str, Sequence[Any]] | None = None) -> None:
        self.script = {target: list(outcomes) for target, outcomes in (script or {}).items()}
        self.calls: list[str] = []

    async def __call__(
        self, target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
    ) -> tuple[httpx.Response, Timings]:
        assert not stream
        self.calls.append(target.name)
        request = httpx.Request("POST", "https://provider.test/v1/chat/completions")
        outcomes = self.script.get(target.name)
        outcome = outcomes.pop(0) if outcomes else "An answer."
        if isinstance(outcome, int):
            response = httpx.Response(outcome, headers={"retry-after": "0.01"}, request=request)
            error = openai.BadRequestError if outcome == 400 else openai.InternalServerError
            raise error(f"status {outcome}", response=response, body=None)
        message = {"role": "assistant", "content": outcome} if isinstance(outcome, str) else outcome
        data = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": target.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        return httpx.Response(200, json=data, request=request), Timings(started_at=0.0)


def scripted_route(policy: Policy, workers: Sequence[str], **router: Any) -> tuple[Router, Route]:
    route = Route("chat", tuple(RouteTarget(w, "m") for w in workers), policy)
    return Router({"chat": route}, rng=random.Random(0), **router), route


SHORT_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a haiku about autumn leaves falling."},
]


@pytest.mark.anyio
async def test_a_retried_round_follows_the_first_plan() -> None:
    router, route = scripted_route(RoundRobinPolicy(), ["a", "b"], max_retries=1)
    send = ScriptedSender({"a:m": [503], "b:m": [503]})
    done = await router.complete(route, {"messages": SHORT_CHAT}, send)
    assert [(a.target, a.reason, a.outcome) for a in done.report.attempts] == [
        ("a:m", "first", "error"),
        ("b:m", "failover", "error"),
        ("a:m", "retry", "won"),
    ]
    done = await router.complete(route, {"messages": SHORT_CHAT}, send)
    assert done.report.winner == "b:m"  # round-robin moved on once per request, not twice


@pytest.mark.anyio
async def test_a_failed_retry_leaves_no_prompt_in_any_tree() -> None:
    policy = PrefixPolicy()
    router, route = scripted_route(policy, ["w0", "w1"], max_retries=1, breaker_failures=1)
    # w0 is down (its circuit opens), w1 is rate limited (a 429: its circuit stays closed)
    send = ScriptedSender({"w0:m": [503, 503], "w1:m": [429, 429]})
    with pytest.raises(AllTargetsFailed):
        await router.complete(route, {"messages": SHORT_CHAT}, send)
    # The retry starts with what is available; once w1 cools down again, w0's open circuit
    # alone keeps it out, so it is asked once more (failing open, docs/routing.md).
    assert send.calls == ["w0:m", "w1:m", "w1:m", "w0:m"]
    assert policy.index.sizes() == {"w0:m": 0, "w1:m": 0}


@pytest.mark.anyio
async def test_waiting_for_a_cooling_target_ends_even_when_the_routers_clock_stands_still(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import llmroute.routing.coordinator as coordinator

    monkeypatch.setattr(coordinator, "MAX_WAIT_UNAVAILABLE", 0.3)
    clock = FakeClock()
    router, route = scripted_route(RoundRobinPolicy(), ["a"], clock=clock)
    router.health("a:m").cool_down(0.05)  # on a clock that never moves: cooling for ever
    send = ScriptedSender()
    with anyio.fail_after(5), pytest.raises(AllTargetsFailed, match="cooling down"):
        await router.complete(route, {"messages": SHORT_CHAT}, send)
    assert send.calls == []
    clock.advance(0.1)  # once it has cooled down, the same request is served
    done = await router.complete(route, {"messages": SHORT_CHAT}, send)
    assert done.report.winner == "a:m"


@pytest.mark.anyio
async def test_a_completed_answer_goes_into_the_winners_tree() -> None:
    policy = PrefixPolicy()
    router, route = scripted_route(policy, WORKERS)
    done = await router.complete(route, {"messages": SHORT_CHAT}, ScriptedSender())
    assert done.report.winner == "w0:m"
    answered = prompt_blocks([*SHORT_CHAT, {"role": "assistant", "content": "An answer."}])
    assert policy.index.tree("w0:m").match(answered) == len(answered)
    # an answer that is not plain text is sent back in a shape the client cannot know: only
    # the prompt is remembered
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    send = ScriptedSender({"w1:m": [{"role": "assistant", "content": None, "tool_calls": [call]}]})
    other = [{"role": "user", "content": "Call f, please, with no arguments at all."}]
    done = await router.complete(route, {"messages": other}, send)
    assert done.report.winner == "w1:m"
    assert len(policy.index.tree("w1:m")) == len(prompt_blocks(other))


@pytest.mark.anyio
async def test_short_prompt_chats_stick_once_their_answers_are_in(sim: Simulator) -> None:
    cfg = sim_config({name: sim.base_url for name in "abcd"}, policy="prefix")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        assert client._router is not None
        policy = client._router.routes["chat"].policy
        assert isinstance(policy, PrefixPolicy)
        winners: dict[str, list[str]] = {}
        conversations = {
            topic: [{"role": "system", "content": f"You help with {topic}."}]
            for topic in ("billing", "shipping", "returns")
        }
        for turn in range(4):
            for topic, messages in conversations.items():
                messages.append({"role": "user", "content": f"Question {turn} on {topic}?"})
                if turn % 2:  # streamed and not streamed turns alike
                    text, route = await ask(client, messages)
                else:
                    completion = await client.chat.completions.create(
                        model="chat", messages=messages
                    )
                    text = completion.choices[0].message.content or ""
                    route = completion.route  # type: ignore[attr-defined]
                messages.append({"role": "assistant", "content": text})
                blocks = prompt_blocks(messages)  # the next turn's prefix, answer included
                assert policy.index.tree(route.winner).match(blocks) == len(blocks)
                winners.setdefault(topic, []).append(route.winner)
    assert all(len(set(w)) == 1 for w in winners.values()), winners
    assert len({w[0] for w in winners.values()}) == 3
