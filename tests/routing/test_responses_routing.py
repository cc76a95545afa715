"""The Responses API on a route goes through the routing engine, as chat does: hedging, racing,
failover before the first token, deadlines, live stats, the cache and the metrics; and a stream
that breaks after its first token is never taken for a complete one."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import openai
import pytest

import llmroute
from llmroute import AsyncOpenAI, StreamInterrupted
from llmroute.testing import Simulator

from ..conftest import KEY, fault
from ..settle import settled, stored

pytestmark = pytest.mark.anyio

SERVES = {"responses": True, "responses_stored": True}


def config(providers: dict[str, Simulator], targets: list[str], **route: Any) -> dict[str, Any]:
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": KEY, **SERVES}
            for name, sim in providers.items()
        },
        "models": {"chat": {"targets": targets, **route}},
        "routing": {"explore": 0},
    }


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def reference(sim: Simulator, text: str = "Say hello") -> str:
    """The answer the simulator gives without llmroute's routing."""
    http = httpx.AsyncClient(verify=sim.ssl_context())
    async with openai.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, http_client=http) as plain:
        return (await plain.responses.create(model="sim-small", input=text)).output_text


async def test_a_stalled_responses_stream_is_hedged(sim: Simulator, sim_stall: Simulator) -> None:
    cfg = config(
        {"slow": sim_stall, "fast": sim},
        ["slow:sim-small", "fast:sim-small"],
        policy="hedge",
        hedge_after="100ms",
    )
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.responses.create(model="chat", input="Say hello", stream=True)
        assert isinstance(stream, openai.AsyncStream)
        events = [event async for event in stream]
        route = stream.route
        assert route.winner == "fast:sim-small" and route.hedges == 1
        assert [(a.target, a.reason, a.outcome) for a in route.attempts] == [
            ("slow:sim-small", "first", "cancelled"),
            ("fast:sim-small", "hedge", "won"),
        ]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert text_of(events) == events[-1].response.output_text == await reference(sim)
        assert stream.timings.first_token is not None and stream.timings.tokens == 20
        # The winner's TTFT is a live sample, as a chat stream's is; the loser's wait is censored.
        stats = client.stats()
        assert stats["fast:sim-small"].n == 1 and stats["fast:sim-small"].ttft_p50 is not None
        assert stats["slow:sim-small"].outcomes["cancelled"] == 1


async def test_a_race_of_whole_responses_takes_the_first(
    sim: Simulator, sim_stall: Simulator
) -> None:
    cfg = config({"slow": sim_stall, "fast": sim}, ["slow:sim-small", "fast:sim-small"])
    cfg["models"]["chat"]["policy"] = "race"
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        done = await client.responses.create(model="chat", input="Say hello")
        assert isinstance(done, openai.types.responses.Response)
        assert done.route.winner == "fast:sim-small"
        assert {a.reason for a in done.route.attempts} == {"race"}
        assert done.output_text == await reference(sim)
        assert done.timings.tokens == done.usage.output_tokens == 20  # type: ignore[union-attr]
        assert done._request_id  # the winner's x-request-id, as openai sets it


@pytest.mark.parametrize("kind", ["500", "429", "stream-error:0"])
async def test_a_failure_before_the_first_token_fails_over(sim: Simulator, kind: str) -> None:
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
    cfg["providers"]["a"]["headers"] = fault(kind, times=100)
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        stream = await client.responses.create(model="chat", input="Say hello", stream=True)
        events = [event async for event in stream]
        assert stream.route.winner == "b:sim-small"
        assert [a.outcome for a in stream.route.attempts][-1] == "won"
        assert stream.route.attempts[0].outcome in ("error", "rate_limited")
        assert text_of(events) == await reference(sim)


async def test_a_break_after_the_first_token_is_never_a_complete_answer(sim: Simulator) -> None:
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        seen: list[Any] = []
        stream = await client.responses.create(
            model="chat", input="Say hello", stream=True, extra_headers=fault("drop:5")
        )
        with pytest.raises(StreamInterrupted) as caught:
            async for event in stream:
                seen.append(event)
        assert caught.value.partial_text == text_of(seen) != ""
        assert not any(e.type == "response.completed" for e in seen)
        # An in-stream error event reaches the caller as openai gives it, then the stream fails.
        seen = []
        stream = await client.responses.create(
            model="chat", input="Say hello", stream=True, extra_headers=fault("stream-error:3")
        )
        with pytest.raises(StreamInterrupted):
            async for event in stream:
                seen.append(event)
        assert seen[-1].type == "error" and len(text_of(seen).split()) == 3


async def test_a_stall_between_events_ends_within_the_stall_deadline(sim: Simulator) -> None:
    # 2 s: far below the 30 s stall, far above a pause of a loaded machine between events
    # (with 0.3 s, such a pause could end the stream before its 4th token).
    cfg = config({"a": sim}, ["a:sim-small"], stall_timeout=2.0)
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        stream = await client.responses.create(
            model="chat", input="Say hello", stream=True, extra_headers=fault("stall-between:4:30")
        )
        seen: list[Any] = []
        with pytest.raises(StreamInterrupted) as caught:
            async for event in stream:
                seen.append(event)
        assert "StallTimeout" in repr(caught.value.__cause__) or "stall" in str(caught.value)
        assert len(text_of(seen).split()) == 4  # the pause comes before token 4 (from 0)
        assert caught.value.partial_text == text_of(seen)


async def test_responses_are_cached_and_replayed(sim: Simulator) -> None:
    cfg = config({"a": sim}, ["a:sim-small"])
    cfg["cache"] = {"backend": "memory", "min_hits": 1}
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        ask = {"model": "chat", "input": "Cache me", "temperature": 0}
        live = await client.responses.create(**ask, stream=True)
        live_events = [event async for event in live]
        before = sim.stats()["responses_requests"]
        replay = await client.responses.create(**ask, stream=True)
        events = [event async for event in replay]
        assert replay.route.cache_hit and replay.route.winner == "cache"
        assert replay.route.ttft is not None
        assert [e.to_dict() for e in events] == [e.to_dict() for e in live_events]
        # The same answer, not streamed: the stream's final response.
        whole = await client.responses.create(**ask)
        assert whole.route.cache_hit and whole.output_text == text_of(live_events)
        assert whole.id == live_events[-1].response.id
        assert sim.stats()["responses_requests"] == before  # nothing went upstream
        # A chat call with the same words is another API's answer: never this one.
        chat = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Cache me"}], temperature=0
        )
        assert not chat.route.cache_hit
        # A call that continues a stored response depends on the vendor's state: never cached.
        for _ in range(2):
            follow = await client.responses.create(**ask, previous_response_id=whole.id)
            assert not follow.route.cache_hit


async def test_a_responses_hit_is_answered_before_openais_create_transforms(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early cache check (docs/architecture.md, step 0) for ``responses.create``: a call
    with plain JSON arguments is looked up before openai's create() transforms them, a hit
    costs none of openai's request machinery and sends nothing upstream, and a miss is looked
    up once; a call with ``extra_headers`` is looked up at the seam, under the same key."""
    from openai.resources.responses import responses

    cfg = config({"a": sim}, ["a:sim-small"])
    cfg["cache"] = {"backend": "memory", "min_hits": 1}
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        ask: dict[str, Any] = {"model": "chat", "input": "Cache me early", "temperature": 0}
        live = await client.responses.create(**ask, stream=True)
        live_events = [event async for event in live]
        cache = client._cache
        assert cache is not None and not live.route.cache_hit
        await stored(client)
        through_openai = {"n": 0}
        real_transform = responses.async_maybe_transform

        async def counting(*args: Any, **kwargs: Any) -> Any:
            through_openai["n"] += 1
            return await real_transform(*args, **kwargs)

        monkeypatch.setattr(responses, "async_maybe_transform", counting)
        before = sim.stats()["responses_requests"]
        early = await client.responses.create(**ask)
        stream = await client.responses.create(**ask, stream=True)
        events = [event async for event in stream]
        assert early.route.cache_hit and stream.route.cache_hit
        assert early.output_text == text_of(live_events) == text_of(events)
        assert through_openai["n"] == 0
        seam = await client.responses.create(**ask, extra_headers={"x-trace": "1"})
        assert seam.route.cache_hit and through_openai["n"] == 1
        assert sim.stats()["responses_requests"] == before  # nothing went upstream
        misses = cache._misses
        fresh = await client.responses.create(**{**ask, "input": "A new one"})
        assert not fresh.route.cache_hit and through_openai["n"] == 2
        assert cache._misses == misses + 1  # looked up once, not again at the seam
        assert sim.stats()["responses_requests"] == before + 1


async def test_the_stream_helper_and_parse_work_over_the_engine(
    sim: Simulator, sim_stall: Simulator
) -> None:
    cfg = config(
        {"slow": sim_stall, "fast": sim},
        ["slow:sim-small", "fast:sim-small"],
        policy="hedge",
        hedge_after="100ms",
    )
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        async with client.responses.stream(model="chat", input="Say hello") as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
        assert "".join(deltas) == final.output_text == await reference(sim)
        raw = await client.responses.with_raw_response.create(model="chat", input="Say hello")
        assert isinstance(raw.parse(), openai.types.responses.Response)
        assert raw.parse().route.winner == "fast:sim-small"
        assert raw.headers.get("x-request-id")  # the winner's response
        async with client.responses.with_streaming_response.create(
            model="chat", input="Say hello", stream=True
        ) as response:
            stream = await response.parse()
            events = [event async for event in stream]
        assert text_of(events) == final.output_text and stream.route.winner == "fast:sim-small"


async def test_responses_are_counted_in_the_metrics(sim: Simulator) -> None:
    cfg = config({"a": sim}, ["a:sim-small"])
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        await client.responses.create(model="chat", input="Say hello")
        stream = await client.responses.create(model="chat", input="Say hello", stream=True)
        [event async for event in stream]
        text = client.metrics.exposition().decode()
    lines = [line for line in text.splitlines() if line.startswith("llmroute_requests_total{")]
    assert any('route="chat"' in line and line.endswith(" 2.0") for line in lines), lines


def test_the_sync_client_routes_responses(sim: Simulator, sim_stall: Simulator) -> None:
    cfg = config(
        {"slow": sim_stall, "fast": sim},
        ["slow:sim-small", "fast:sim-small"],
        policy="hedge",
        hedge_after="100ms",
    )
    with llmroute.OpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = client.responses.create(model="chat", input="Say hello", stream=True)
        assert isinstance(stream, openai.Stream)
        events = list(stream)
        assert stream.route.winner == "fast:sim-small"
        assert events[-1].type == "response.completed"
        done = client.responses.create(model="chat", input="Say hello")
        assert done.output_text == text_of(events)


# -- the decoder, without a network -----------------------------------------------------------


def _sse(data: dict[str, Any]) -> bytes:
    import json

    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def _wire(*extra: dict[str, Any]) -> bytes:
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": _response("in_progress"),
    }
    deltas = [
        {
            "type": "response.output_text.delta",
            "item_id": "m",
            "output_index": 0,
            "content_index": 0,
            "delta": word,
            "sequence_number": i + 1,
            "logprobs": [],
        }
        for i, word in enumerate(["Hello", " there"])
    ]
    return b"".join(_sse(e) for e in (created, *deltas, *extra))


def _response(status: str) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": status,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def _decoder() -> Any:
    import httpx

    from llmroute.protocols.openai import ResponsesStreamDecoder

    return ResponsesStreamDecoder(
        request=httpx.Request("POST", "https://x/v1/responses"), target="t"
    )


def test_the_decoder_gives_openais_events_whatever_the_framing() -> None:
    completed = {
        "type": "response.completed",
        "sequence_number": 3,
        "response": _response("completed"),
    }
    wire = _wire(completed) + _sse({"type": "response.output_text.delta", "delta": "late"})
    whole = _decoder()
    events = whole.feed(wire) + whole.close()
    assert [type(e).__name__ for e in events] == [
        "ResponseCreatedEvent",
        "ResponseTextDeltaEvent",
        "ResponseTextDeltaEvent",
        "ResponseCompletedEvent",
    ]  # nothing after the end
    assert (whole.tokens, whole.finished, whole.text) == (2, True, "Hello there")
    split = _decoder()
    by_byte = [e for i in range(len(wire)) for e in split.feed(wire[i : i + 1])] + split.close()
    assert [e.to_dict() for e in by_byte] == [e.to_dict() for e in events]


def test_an_error_before_the_first_token_raises_and_after_it_is_passed_on() -> None:
    early = _decoder()
    failed = {"type": "response.failed", "sequence_number": 1, "response": _response("failed")}
    failed["response"]["error"] = {"code": "server_error", "message": "boom"}
    with pytest.raises(openai.APIError, match="boom"):
        early.feed(_sse(failed))
    late = _decoder()
    error = {"type": "error", "code": "server_error", "message": "later", "sequence_number": 3}
    events = late.feed(_wire(error))
    assert events[-1].type == "error" and not late.finished
    with pytest.raises(openai.APIError, match="later"):
        late.close()  # the answer is not whole: the stream fails after the event


def test_a_failed_whole_response_is_an_error() -> None:
    import json

    import httpx

    from llmroute.protocols.openai import parse_response

    body = _response("failed") | {"error": {"code": "server_error", "message": "it broke"}}
    request = httpx.Request("POST", "https://x/v1/responses")
    with pytest.raises(openai.APIError, match="it broke"):
        parse_response(json.dumps(body).encode(), request=request, target="t")
    done = parse_response(json.dumps(_response("completed")).encode(), request=request, target="t")
    assert isinstance(done, openai.types.responses.Response) and done.status == "completed"


async def test_a_responses_stream_left_early_is_reset_upstream(sim_slow: Simulator) -> None:
    cfg = config({"a": sim_slow}, ["a:sim-small"])
    await settled(sim_slow)  # an earlier test's reset lands first
    before = sim_slow.stats()["streams_cancelled"]
    async with AsyncOpenAI(config=cfg, verify=sim_slow.ssl_context()) as client:
        stream = await client.responses.create(model="chat", input="Say hello", stream=True)
        async for event in stream:
            if event.type == "response.output_text.delta":
                break
        await stream.close()
        with anyio.move_on_after(10):  # the simulator notices the reset asynchronously
            while sim_slow.stats()["streams_cancelled"] == before:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert sim_slow.stats()["streams_cancelled"] == before + 1
        assert client.stats()["a:sim-small"].in_flight == 0


async def test_a_latency_goal_applies_to_responses_and_is_checked_first(sim: Simulator) -> None:
    cfg = config({"a": sim}, ["a:sim-small"])
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        before = sim.stats()["responses_requests"]
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="chat", input="hi", extra_body={"llmroute": {"ttft_target_ms": "soon"}}
            )
        assert "ttft_target_ms" in (caught.value.param or "")
        assert sim.stats()["responses_requests"] == before  # nothing was sent
        done = await client.responses.create(
            model="chat", input="Say hello", extra_body={"llmroute": {"ttft_target_ms": 5000}}
        )
        assert done.status == "completed"
        sent = [r for r in sim.last_requests if r["path"] == "/v1/responses"][-1]
        assert sent["json"]["input"] == "Say hello"
        assert "llmroute" not in sent["json"]  # llmroute's options never go upstream


async def test_a_follow_up_of_a_vendor_that_keeps_nothing_is_llmroutes_own_error(
    sim: Simulator,
) -> None:
    """A vendor that does not keep responses (``responses_stored = false``) is not pinned: a
    follow-up of its answer gets llmroute's clear 400 before anything is sent, not the vendor's
    own 400 for an id it never kept."""
    providers = {"stateless": {"base_url": sim.base_url, "api_key": KEY, "responses": True}}
    providers["stateless"]["responses_stored"] = False
    conf = {"providers": providers, "models": {"chat": {"targets": ["stateless:sim-small"]}}}
    async with AsyncOpenAI(config=conf, api_key=KEY, verify=sim.ssl_context()) as client:
        first = await client.responses.create(model="chat", input="What number?")
        sent = len(sim.last_requests)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="chat", input="And?", previous_response_id=first.id)
        assert "no target keeps responses" in refused.value.message
        assert len(sim.last_requests) == sent  # nothing went upstream
