"""Hundreds of streams cut at random points, each continued on another target: the answers are
counted as exact, shortened or raised (and longer, past the caller's limit), and printed.

Two targets of one model on one simulator, continuation declared on both, ``failover`` so the
cutter serves first: its provider's headers carry ``x-sim-fault: drop:A-B``, so the simulator
resets every stream it sends (RST_STREAM) after a number of tokens it draws per request. An
answer is *exact* when it equals, text and finish reason, the uncut answer of the same request
from the continuing target (the simulator's answers are deterministic per model and prompt).
Shortened answers returned as whole must be none; raised only what no target could continue
(here: none, the second target always can). The simulator's tokens are words, one per delta
unless a group says otherwise.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import anyio
import openai
import pytest

import llmroute
from llmroute import AsyncOpenAI, StreamInterrupted
from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

REPLY_WORDS = 120
"""Longer than 40 (those answers end with "length"), shorter than 200 (those end with "stop")."""
STREAMS = 50
"""Cut streams per group (wire format x max_tokens): 6 groups, 300 streams."""
CONCURRENCY = 16
SYNC: list[Any] = [{"role": "user", "content": "Continue me from a thread."}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the same engine runs on trio in tests/routing/test_continuation_accounts.py


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=REPLY_WORDS, seed=26), tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def batching() -> Iterator[Simulator]:
    """Three words a delta, as Anthropic and some others send several tokens a delta."""
    profile = Profile(reply_tokens=REPLY_WORDS, tokens_per_chunk=3, seed=27)
    with Simulator(profile=profile, tls=True) as server:
        yield server


def config(sim: Simulator, kind: str, cut: str) -> dict[str, Any]:
    """Route ``chat``: the cutter, then the whole target; route ``ref``: the whole one alone.
    ``kind``: ``openai``, ``vllm`` (usage on every chunk) or ``anthropic`` (Messages API)."""
    whole: dict[str, Any] = {"kind": kind, "base_url": sim.base_url, "api_key": KEY}
    if kind != "vllm":  # the catalog's vllm entry has its own continuation fields
        whole["continuation"] = {}
    return {
        "providers": {"cutter": {**whole, "headers": {"x-sim-fault": cut}}, "whole": whole},
        "models": {
            "chat": {"targets": ["cutter:sim-small", "whole:sim-small"], "policy": "failover"},
            "ref": {"targets": ["whole:sim-small"]},
        },
        # Every stream of the cutter breaks, and it keeps serving first: its circuit stays shut.
        "routing": {"explore": 0, "breaker_failures": 1_000_000},
    }


async def read(stream: Any) -> tuple[str, str | None, Any]:
    """The text, the last finish reason and the usage of a stream."""
    text: list[str] = []
    finish = usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish, usage


async def ask(
    client: AsyncOpenAI, model: str, prompt: str, limit: int, *, completion: bool, usage: bool
) -> tuple[Any, tuple[str, str | None, Any]]:
    key = "max_completion_tokens" if completion else "max_tokens"
    options: dict[str, Any] = {key: limit}
    if usage:
        options["stream_options"] = {"include_usage": True}
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        **options,
    )
    return stream, await read(stream)


async def cut_group(
    sim: Simulator, kind: str, limit: int, cut: str, counts: collections.Counter[str]
) -> None:
    """``STREAMS`` requests with ``max_tokens=limit`` (every other one as
    ``max_completion_tokens``, every third asking for usage), each cut by the cutter."""
    gate = anyio.CapacityLimiter(CONCURRENCY)

    async def one(i: int) -> None:
        async with gate:
            prompt = f"Tell me about cut streams, {kind} {limit} {i}."
            odd, usage = i % 2 == 1, i % 3 == 0
            _, (want, want_finish, _) = await ask(
                client, "ref", prompt, limit, completion=odd, usage=False
            )
            try:
                stream, (text, finish, seen) = await ask(
                    client, "chat", prompt, limit, completion=odd, usage=usage
                )
            except StreamInterrupted:
                counts["raised"] += 1
                return
        if stream.route.continued_on:
            counts["continued"] += 1
        if text == want and finish == want_finish:
            counts["exact"] += 1
        elif want.startswith(text):
            counts["shortened"] += 1
        elif text.startswith(want):
            counts["longer"] += 1
        else:
            counts["wrong"] += 1
        if usage and (seen is None or seen.completion_tokens != len(text.split())):
            counts["usage off"] += 1  # the summed usage is not the answer's own count

    async with AsyncOpenAI(config=config(sim, kind, cut), verify=sim.ssl_context()) as client:
        with anyio.fail_after(300):  # a hang guard only
            async with anyio.create_task_group() as tg:
                for i in range(STREAMS):
                    tg.start_soon(one, i)


def report(
    capsys: pytest.CaptureFixture[str], label: str, counts: collections.Counter[str]
) -> None:
    with capsys.disabled():
        kinds = ("exact", "shortened", "longer", "wrong", "raised", "continued", "usage off")
        print(f"\n  {label}: " + ", ".join(f"{k} {counts[k]}" for k in kinds), end="")


@pytest.mark.parametrize("kind", ["openai", "vllm", "anthropic"])
async def test_streams_cut_at_random_points_continue_to_the_exact_answer(
    sim: Simulator, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The cutter's answers never complete, so its tokens are never calibrated from its own
    # usage: "openai" and "anthropic" count them low (one per delta, exact here), "vllm" by
    # the usage it streams on every chunk (exact anywhere).
    groups = {40: "drop:1-39", 200: "drop:1-150"}  # 200: some cuts after the answer's last word
    counts = {limit: collections.Counter[str]() for limit in groups}
    async with anyio.create_task_group() as tg:
        for limit, cut in groups.items():
            tg.start_soon(cut_group, sim, kind, limit, cut, counts[limit])
    for limit in groups:
        report(capsys, f"{kind} max_tokens={limit}, {STREAMS} cut streams", counts[limit])
    for limit in groups:
        assert counts[limit]["continued"] == STREAMS  # every stream was cut and continued
        assert counts[limit]["exact"] == STREAMS, counts[limit]
        assert counts[limit]["usage off"] == 0


async def test_several_tokens_a_delta_are_never_shortened(
    batching: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three words a delta and no usage from the cutter: its deltas count one token each (the
    # only count that is never more than the vendor's), so the continuation is asked for more
    # than the rest and an answer cut at max_tokens=40 runs past it. Not shortened, and
    # nothing raised.
    groups = {40: "drop:1-12", 200: "drop:1-39"}
    counts = {limit: collections.Counter[str]() for limit in groups}
    async with anyio.create_task_group() as tg:
        for limit, cut in groups.items():
            tg.start_soon(cut_group, batching, "anthropic", limit, cut, counts[limit])
    for limit in groups:
        report(capsys, f"anthropic, 3 words a delta, max_tokens={limit}", counts[limit])
    for limit in groups:
        got = counts[limit]
        assert got["continued"] == STREAMS
        assert got["shortened"] == got["wrong"] == got["raised"] == 0, got
        assert got["exact"] + got["longer"] == STREAMS
    assert counts[200]["exact"] == STREAMS  # those answers end with the model's stop


@pytest.mark.parametrize("kind", ["openai", "vllm", "anthropic"])
@pytest.mark.parametrize("limit", [40, 200])
async def test_the_issues_reproduction_continues_to_the_full_answer(
    sim: Simulator, kind: str, limit: int
) -> None:
    # Issue 26: the first target cuts every stream after 10 words; 17 words of 40 came back,
    # and 85 of 200, each ending with the second target's own finish reason.
    async with AsyncOpenAI(config=config(sim, kind, "drop:10"), verify=sim.ssl_context()) as c:
        with anyio.fail_after(30):  # a hang guard only
            for i in range(3):
                prompt = f"Reproduce issue 26, {i}."
                _, (want, want_finish, _) = await ask(
                    c, "ref", prompt, limit, completion=False, usage=False
                )
                stream, (text, finish, _) = await ask(
                    c, "chat", prompt, limit, completion=False, usage=False
                )
                assert stream.route.continued_on == ["whole:sim-small"]
                assert (text, finish) == (want, want_finish)
                assert len(text.split()) == min(limit, REPLY_WORDS)


def test_the_sync_client_continues_to_the_full_answer(sim: Simulator) -> None:
    cfg = config(sim, "openai", "drop:10")
    with llmroute.OpenAI(config=cfg, verify=sim.ssl_context()) as client:
        ref = client.chat.completions.create(model="ref", messages=SYNC, max_tokens=40)
        stream = client.chat.completions.create(
            model="chat", messages=SYNC, max_tokens=40, stream=True
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.choices[0].message.content and len(text.split()) == 40
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert stream.route.continued_on == ["whole:sim-small"]


def test_the_gateway_continues_to_the_full_answer(sim: Simulator) -> None:
    cfg = config(sim, "openai", "drop:10")
    cfg["gateway"] = {"keys": {"ci": "GW_KEY_CI"}}
    environ = {"GW_KEY_CI": "gw-ci-key-0123456789abcdef"}
    messages = [{"role": "user", "content": "Continue me through the gateway."}]
    with Gateway(cfg, environ=environ, verify=sim.ssl_context(), max_retries=0) as gateway:
        client = openai.OpenAI(base_url=gateway.base_url, api_key=environ["GW_KEY_CI"])
        with client:
            ref = client.chat.completions.create(model="ref", messages=messages, max_tokens=40)
            stream = client.chat.completions.create(
                model="chat",
                messages=messages,
                max_tokens=40,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.choices[0].message.content and len(text.split()) == 40
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 40
    # The gateway's upstream requests: the cut one, then the continuation of its prefix.
    sent = [r for r in sim.last_requests if r["path"] == "/v1/chat/completions"][-2:]
    assert sent[0]["headers"].get("x-sim-fault") == "drop:10"
    assert sent[1]["json"]["messages"][-1]["role"] == "assistant"
