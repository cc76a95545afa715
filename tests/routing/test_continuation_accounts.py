"""A continued stream's accounts: the tokens each attempt delivered, the ``max_tokens`` left for
the continuation, the summed ``usage`` and the vendors' request ids, over the simulator with
several words per streamed delta (one word is one of its tokens)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmroute import AsyncOpenAI, AttemptReport, RouteReport
from llmroute.cli._chat import route_lines
from llmroute.config import Config, resolve
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about continuations."}
]
WORDS_PER_CHUNK = 2


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    """30-word replies, two words per streamed delta (OpenAI's and Anthropic's wire)."""
    profile = Profile(reply_tokens=30, tokens_per_chunk=WORDS_PER_CHUNK)
    with Simulator(profile=profile, tls=True) as server:
        yield server


def config(sim: Simulator, kind: str = "openai") -> dict[str, Any]:
    provider = {"kind": kind, "base_url": sim.base_url, "api_key": KEY, "continuation": {}}
    return {
        "providers": {"a": provider, "b": provider},
        "models": {"chat": {"targets": ["a:sim-small", "b:sim-small"], "policy": "failover"}},
        "routing": {"explore": 0},
    }


def drop_first(chunks: int) -> dict[str, str]:
    """The first request's stream breaks after ``chunks`` deltas; later ones are whole."""
    key = uuid.uuid4().hex
    return {"x-sim-fault": f"drop:{chunks}", "x-sim-fault-times": "1", "x-sim-fault-key": key}


async def whole_reply(sim: Simulator) -> str:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        done = await c.chat.completions.create(model="sim-small", messages=MESSAGES)
    return done.choices[0].message.content or ""


async def routed(sim: Simulator, kind: str = "openai", **kwargs: Any) -> tuple[Any, str, list[Any]]:
    """Stream one routed request; return the stream, its text and its chunks."""
    async with AsyncOpenAI(config=config(sim, kind), verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, **kwargs
            )
            chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return stream, text, chunks


def sent(sim: Simulator, n: int) -> list[dict[str, Any]]:
    """The last ``n`` chat requests the simulator received (OpenAI's or Anthropic's path)."""
    paths = ("/v1/chat/completions", "/v1/messages")
    return [r for r in sim.last_requests if r["path"] in paths][-n:]


async def test_without_the_vendors_count_one_token_a_delta_and_the_answer_is_whole(
    sim: Simulator,
) -> None:
    full = await whole_reply(sim)
    stream, text, chunks = await routed(
        sim,
        max_tokens=60,
        stream_options={"include_usage": True},
        extra_headers=drop_first(3),
    )
    first, second = sent(sim, 2)
    prefix = second["json"]["messages"][-1]["content"]
    # Three deltas of two words each were delivered before the break.
    assert full.startswith(prefix) and prefix.split() == full.split()[: 3 * WORDS_PER_CHUNK]
    # No usage covered the break: one token per delta (routing/tokens.py), a lower bound, so
    # the continuation is asked for at least the rest.
    assert second["json"]["max_completion_tokens"] == 60 - 3  # OpenAI's name (the catalog)
    assert text == full  # the 30-word answer ends with the model's own stop
    assert chunks[-2].choices[0].finish_reason == "stop"
    rest = 30 - 3 * WORDS_PER_CHUNK
    route = stream.route
    estimate = max(3, len(prefix.encode()) // 8)  # uncalibrated: for the report only
    assert [(a.outcome, a.tokens, a.tokens_counted, a.tokens_estimate) for a in route.attempts] == [
        ("interrupted", 3, "deltas", estimate),
        ("won", rest, "usage", None),
    ]
    assert [a.request_id for a in route.attempts] == [first["request_id"], second["request_id"]]
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == 3 + rest  # what both attempts delivered, at least
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert route.usage_estimated == ["completion_tokens"]  # said so in the route report


async def test_a_calibrated_estimate_is_reported_but_never_sizes_the_continuation(
    sim: Simulator,
) -> None:
    # One answer that completed on the primary tells its tokens per delta (2: the simulator
    # here sends two words a delta); a break after 2 deltas is estimated at 4 tokens for the
    # route report, but counted as 2 (one a delta, a lower bound): the continuation is asked
    # for 8, and the answer runs past max_tokens=10 (longer, never shorter).
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):  # a hang guard only
            warm = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            assert not [c async for c in warm if c.usage is not None]  # usage not asked
            counts = client._router.stats.target("a:sim-small").token_counts
            assert counts.per_delta() == (2.0, 2.0)
            stream = await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                stream=True,
                max_tokens=10,
                extra_headers=drop_first(2),
            )
            chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    _, second = sent(sim, 2)
    assert second["json"]["max_completion_tokens"] == 8
    assert second["json"]["stream_options"] == {"include_usage": True}  # llmroute's own ask
    assert len(text.split()) == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.usage is None for c in chunks)  # the caller did not ask for usage
    assert [(a.tokens, a.tokens_counted, a.tokens_estimate) for a in stream.route.attempts] == [
        (2, "deltas", 4),
        (8, "usage", None),
    ]


async def test_a_target_that_packs_fewer_tokens_a_delta_than_calibrated_is_not_cut_short() -> None:
    # The reviewer's case: calibrated at 2 tokens a delta, the target then serves 1 a delta
    # (another language, hidden reasoning tokens in its usage) and breaks after 15 deltas.
    # Counted at 2 a delta the continuation was asked for 10 and the caller got 25 words of
    # 40 ending with "length"; one a delta it gets all 40.
    with Simulator(profile=Profile(reply_tokens=60, tokens_per_chunk=2), tls=True) as server:
        async with AsyncOpenAI(config=config(server), verify=server.ssl_context()) as client:
            with anyio.fail_after(20):  # a hang guard only
                for _ in range(2):
                    warm = await client.chat.completions.create(
                        model="chat", messages=MESSAGES, stream=True
                    )
                    [c async for c in warm]
                counts = client._router.stats.target("a:sim-small").token_counts
                assert counts.per_delta() == (2.0, 2.0)
                url = server.base_url.removesuffix("/v1") + "/_sim/profile"
                async with httpx.AsyncClient(verify=server.ssl_context()) as http:
                    changed = await http.post(url, json={"tokens_per_chunk": 1})
                    assert changed.status_code == 200
                stream = await client.chat.completions.create(
                    model="chat",
                    messages=MESSAGES,
                    stream=True,
                    max_tokens=40,
                    extra_headers=drop_first(15),
                )
                chunks = [c async for c in stream]
        _, second = sent(server, 2)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert second["json"]["max_completion_tokens"] == 25
    assert len(text.split()) == 40
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert [(a.tokens, a.tokens_counted) for a in stream.route.attempts] == [
        (15, "deltas"),
        (25, "usage"),
    ]


async def test_the_vendors_own_count_is_exact_and_the_caller_gets_what_it_asked(
    sim: Simulator,
) -> None:
    # The case: max_tokens=10, a break after 4 words (2 deltas of 2 words); the vendor
    # counts its tokens on every chunk (vLLM's and SGLang's continuous_usage_stats).
    stream, text, chunks = await routed(
        sim,
        max_tokens=10,
        stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        extra_headers=drop_first(2),
    )
    _, second = sent(sim, 2)
    assert second["json"]["max_completion_tokens"] == 6
    assert len(text.split()) == 10  # exactly what was asked, no more
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length"
    route = stream.route
    assert [(a.tokens, a.tokens_counted) for a in route.attempts] == [(4, "usage"), (6, "usage")]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 10


async def test_anthropic_chunks_of_several_words_and_its_request_id(sim: Simulator) -> None:
    stream, text, chunks = await routed(
        sim,
        "anthropic",
        max_tokens=50,
        stream_options={"include_usage": True},
        extra_headers=drop_first(2),
    )
    first, second = sent(sim, 2)
    assert first["path"] == second["path"] == "/v1/messages"
    prefill = second["json"]["messages"][-1]
    assert prefill["role"] == "assistant"
    prefix = (
        prefill["content"] if isinstance(prefill["content"], str) else prefill["content"][0]["text"]
    )
    assert len(prefix.split()) == 2 * WORDS_PER_CHUNK
    assert second["json"]["max_tokens"] == 50 - 2  # Anthropic's own: one token a delta
    route = stream.route
    assert [a.request_id for a in route.attempts] == [first["request_id"], second["request_id"]]
    assert all(
        rid and rid.startswith("req_") for rid in (first["request_id"], second["request_id"])
    )
    rest = len(text.split()) - 2 * WORDS_PER_CHUNK
    assert [(a.tokens, a.tokens_counted) for a in route.attempts] == [
        (2, "deltas"),
        (rest, "usage"),
    ]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 2 + rest


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_whole_answer_carries_its_vendors_request_id(sim: Simulator, kind: str) -> None:
    async with AsyncOpenAI(config=config(sim, kind), verify=sim.ssl_context()) as client:
        done = await client.chat.completions.create(model="chat", messages=MESSAGES)
    (sent_,) = sent(sim, 1)
    assert done._request_id == sent_["request_id"]  # x-request-id, or Anthropic's request-id
    route = getattr(done, "route")  # noqa: B009 - llmroute's attribute on openai's class
    assert route.attempts[0].request_id == sent_["request_id"]
    assert route.attempts[0].tokens is None  # counted for streams only


def vllm_config(sim: Simulator) -> dict[str, Any]:
    """Two vLLM targets: the catalog says they stream their usage on every chunk."""
    provider = {"kind": "vllm", "base_url": sim.base_url, "api_key": KEY}
    return {
        "providers": {"a": provider, "b": provider},
        "models": {"chat": {"targets": ["a:sim-small", "b:sim-small"], "policy": "failover"}},
        "routing": {"explore": 0},
    }


async def test_continuous_usage_counts_exactly_and_stays_out_of_the_callers_chunks(
    sim: Simulator,
) -> None:
    async with AsyncOpenAI(config=vllm_config(sim), verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):  # a hang guard only
            stream = await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                stream=True,
                max_tokens=13,
                stream_options={"include_usage": True},
                extra_headers=drop_first(3),
            )
            chunks = [c async for c in stream]
    first, second = sent(sim, 2)
    options = {"include_usage": True, "continuous_usage_stats": True}
    assert first["json"]["stream_options"] == second["json"]["stream_options"] == options
    assert second["json"]["max_tokens"] == 13 - 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 13
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # The caller asked for the usage at the end only: the chunks with choices carry none.
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 13
    assert [(a.tokens, a.tokens_counted) for a in stream.route.attempts] == [
        (6, "usage"),
        (7, "usage"),
    ]
    # The prompt tokens are the first attempt's, as its vendor streamed them (the
    # continuation's prompt holds the answer so far again), and every figure is a vendor's.
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        whole = await c.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert whole.usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.total_tokens == usage.prompt_tokens + 13
    assert stream.route.usage_estimated == []


async def test_a_break_after_the_limit_ends_the_answer_with_length(sim: Simulator) -> None:
    # The vendor's own count says the 4 words delivered are the 4 tokens asked: nobody is
    # asked to continue, and the answer ends as the model's would have, with "length".
    before = sim.stats()["chat_requests"]
    async with AsyncOpenAI(config=vllm_config(sim), verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):  # a hang guard only
            stream = await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                stream=True,
                max_tokens=4,
                stream_options={"include_usage": True},
                extra_headers=drop_first(2),
            )
            chunks = [c async for c in stream]
    assert sim.stats()["chat_requests"] == before + 1  # nobody was asked to continue
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " ".join((await whole_reply(sim)).split()[:4])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4
    assert usage.total_tokens == usage.prompt_tokens + 4
    assert stream.route.attempts[0].outcome == "interrupted"
    assert stream.route.continued_on == []
    assert stream.route.usage_estimated == []  # the vendor counted the prompt and the answer


async def test_an_answer_ended_at_the_limit_without_the_vendors_count_says_so() -> None:
    # One token a delta, no usage streamed: a break after the 3 deltas of max_tokens=3 ends
    # the answer there (at least 3 tokens delivered). No vendor counted the prompt nor the
    # answer: prompt_tokens are llmroute's estimate, completion_tokens its count of deltas
    # (a lower bound), and the route report says so.
    with Simulator(profile=Profile(reply_tokens=30), tls=True) as server:
        stream, text, chunks = await routed(
            server,
            max_tokens=3,
            stream_options={"include_usage": True},
            extra_headers=drop_first(3),
        )
    assert len(text.split()) == 3 and stream.route.continued_on == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 3
    assert stream.route.usage_estimated == ["completion_tokens", "prompt_tokens"]


async def test_a_continuation_that_sends_more_than_asked_is_cut_at_the_limit(
    sim: Simulator,
) -> None:
    # The continuing target takes no max_tokens (its continuation fields drop it): the caller's
    # limit still holds on the whole answer, counted here by the vendors' usage on every chunk,
    # which ends with "length" at exactly 12 words. (Without such usage the count is low: one
    # token a delta.)
    cfg = vllm_config(sim)
    fields = {"continue_final_message": True, "add_generation_prompt": False, "max_tokens": None}
    cfg["providers"]["b"] = {**cfg["providers"]["b"], "continuation": {"body": fields}}
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):  # a hang guard only
            stream = await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                stream=True,
                max_tokens=12,
                stream_options={"include_usage": True},
                extra_headers=drop_first(2),
            )
            chunks = [c async for c in stream]
    _, second = sent(sim, 2)
    assert second["json"]["max_tokens"] is None  # the target was free to answer all the rest
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == (await whole_reply(sim)).split()[:12]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices and usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1


def test_the_catalog_says_which_targets_stream_their_usage_on_every_chunk() -> None:
    config = Config.model_validate(
        {
            "providers": {
                "v": {"kind": "vllm"},
                "s": {"kind": "sglang"},
                "quiet": {"kind": "sglang", "stream_usage_continuous": False},
                "o": {"kind": "openai", "api_key": KEY},
            },
            "models": {"m": {"targets": ["v:x", "s:x", "quiet:x", "o:x"]}},
        }
    )
    providers = resolve(config, {}).providers
    flags = {name: p.spec.stream_usage_continuous for name, p in providers.items()}
    assert flags == {"v": True, "s": True, "quiet": False, "o": False}


async def test_a_raw_read_gets_no_usage_it_did_not_ask_for(sim: Simulator) -> None:
    # with_streaming_response / with_raw_response hand the caller the vendor's own body: the
    # usage llmroute would ask for its counts would be a line the caller never asked for.
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):  # a hang guard only
            async with client.chat.completions.with_streaming_response.create(
                model="chat", messages=MESSAGES, stream=True
            ) as response:
                lines = [line async for line in response.iter_lines()]
            raw = await client.chat.completions.with_raw_response.create(
                model="chat", messages=MESSAGES, stream=True
            )
            chunks = [chunk async for chunk in raw.parse()]
            plain = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            [chunk async for chunk in plain]
    streamed, raw_sent, plain_sent = sent(sim, 3)
    assert "stream_options" not in streamed["json"] and "stream_options" not in raw_sent["json"]
    assert [line for line in lines if '"usage":{' in line.replace(" ", "")] == []
    assert len(lines) > 10 and chunks and all(c.usage is None for c in chunks)
    # A parsed stream still asks (its count calibrates the target) and hides it.
    assert plain_sent["json"]["stream_options"] == {"include_usage": True}


def test_show_route_marks_the_counts_that_are_llmroutes_own() -> None:
    attempt = AttemptReport(
        target="a:m", started=0.0, reason="first", outcome="interrupted", tokens=2
    )
    attempt.tokens_counted, attempt.tokens_estimate = "deltas", 4
    report = RouteReport(
        route="chat",
        policy="failover",
        winner="a:m",
        attempts=[attempt],
        continued_on=["b:m"],
        usage_estimated=["completion_tokens"],
    )
    lines = route_lines(report, None, "chat")
    assert "  usage counted by llmroute: completion_tokens" in lines
    assert any(">= 2 tokens (~4 estimated)" in line for line in lines)


@pytest.mark.parametrize(
    ("kind", "id_header"), [("deepseek", "x-ds-trace-id"), ("mistral", "mistral-correlation-id")]
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_vendors_own_request_id_header_is_read(
    sim: Simulator, kind: str, id_header: str, stream: bool
) -> None:
    """The catalog entry names the vendor's request-id header; the simulator sends only that."""
    provider = {
        "kind": kind,
        "base_url": sim.base_url,
        "api_key": KEY,
        "headers": {"x-sim-request-id-header": id_header},
    }
    cfg = {
        "providers": {"v": provider},
        "models": {"chat": {"targets": ["v:sim-small"]}},
        "routing": {"explore": 0},
    }
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):
            done: Any
            if stream:
                done = await client.chat.completions.create(
                    model="chat", messages=MESSAGES, stream=True
                )
                _ = [chunk async for chunk in done]
            else:
                done = await client.chat.completions.create(model="chat", messages=MESSAGES)
    (sent_,) = sent(sim, 1)
    route = getattr(done, "route")  # noqa: B009 - llmroute's attribute on openai's class
    assert route.attempts[0].request_id == sent_["request_id"]
    assert sent_["request_id"].startswith("req_")


@pytest.mark.parametrize(("kind", "takes_it"), [("gemini", True), ("zhipu", False)])
async def test_stream_options_reach_only_vendors_that_take_them(
    sim: Simulator, kind: str, takes_it: bool
) -> None:
    """Gemini's compatibility API documents stream_options: the catalog no longer strips it."""
    cfg = {
        "providers": {"v": {"kind": kind, "base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["v:sim-small"]}},
        "routing": {"explore": 0},
    }
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        with anyio.fail_after(20):
            stream = await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
    (sent_,) = sent(sim, 1)
    options = sent_["json"].get("stream_options")
    assert (options is not None and options.get("include_usage") is True) is takes_it
    if takes_it:
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 30
