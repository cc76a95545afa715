"""One set of scenarios, run against every protocol adapter.

Each test is parametrized over the adapters (``openai``, ``anthropic``): a routed
``llmroute.AsyncOpenAI`` whose only target's provider speaks that protocol to the session
simulator (OpenAI on ``/v1/chat/completions``, Anthropic on ``/v1/messages``). The caller sees
the same openai objects, finish reasons, usage, exceptions and routing behaviour whichever
protocol is on the wire. Where an adapter legitimately differs, the test says so.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import openai
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI, RouteReport, StreamInterrupted
from llmroute.testing import Profile, Simulator

from ..conftest import KEY, fault

pytestmark = pytest.mark.anyio

PROTOCOLS = ["openai", "anthropic"]
MODEL = {"openai": "sim-small", "anthropic": "claude-sim"}
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about conformance."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def sim_busy() -> Iterator[Simulator]:
    """Tokens every 10 ms: a stream is still running when the client leaves it."""
    with Simulator(profile=Profile(reply_tokens=200, inter_token=0.01), tls=True) as server:
        yield server


def provider(protocol: str, sim: Simulator, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"base_url": sim.base_url, "api_key": KEY, **extra}
    if protocol == "anthropic":
        spec["kind"] = "anthropic"
    return spec


def target(protocol: str) -> str:
    return f"p:{MODEL[protocol]}"


def config(protocol: str, sim: Simulator, **provider_extra: Any) -> dict[str, Any]:
    return {
        "providers": {"p": provider(protocol, sim, **provider_extra)},
        "models": {"chat": {"targets": [target(protocol)]}},
        "routing": {"explore": 0},
    }


def client(protocol: str, sim: Simulator, **kwargs: Any) -> AsyncOpenAI:
    provider_extra = kwargs.pop("provider_extra", {})
    return AsyncOpenAI(
        api_key=KEY,
        verify=sim.ssl_context(),
        config=config(protocol, sim, **provider_extra),
        **kwargs,
    )


async def read(stream: Any) -> tuple[str, list[Any]]:
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def route_of(result: Any) -> RouteReport | None:
    """The route report llmroute attaches to a completion or a stream."""
    return result.route


def finishes(chunks: list[Any]) -> list[str]:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


async def wait_for(predicate: Any, seconds: float = 10.0) -> None:
    """Poll ``predicate`` (bounded in time); the assertion after it decides the test."""
    with anyio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 - the simulator's counters have no event
            await anyio.sleep(0.02)


# -- text ---------------------------------------------------------------------------------------


async def test_text_is_the_same_streamed_and_whole(protocol: str, sim: Simulator) -> None:
    async with client(protocol, sim) as c:
        whole = await c.chat.completions.create(model="chat", messages=MESSAGES)
        stream = await c.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        text, chunks = await read(stream)
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content and choice.message.content == text
    assert choice.finish_reason == "stop"
    assert (report := route_of(whole)) is not None and report.winner == target(protocol)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert finishes(chunks) == ["stop"]
    assert len({c.id for c in chunks}) == 1  # one answer, one id
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert stream.route is not None and stream.route.winner == target(protocol)


# -- tools --------------------------------------------------------------------------------------


async def test_tool_calls_streamed_and_whole(protocol: str, sim: Simulator) -> None:
    async with client(protocol, sim) as c:
        whole = await c.chat.completions.create(
            model="chat", messages=MESSAGES, tools=TOOLS, tool_choice="required"
        )
        stream = await c.chat.completions.create(
            model="chat", messages=MESSAGES, tools=TOOLS, tool_choice="required", stream=True
        )
        _, chunks = await read(stream)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert isinstance(arguments, dict) and isinstance(arguments.get("city"), str)

    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas and deltas[0].id and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"
    assert {d.index for d in deltas} == {0}
    streamed = "".join((d.function.arguments or "") for d in deltas if d.function is not None)
    assert json.loads(streamed) == arguments
    assert finishes(chunks) == ["tool_calls"]


# -- usage --------------------------------------------------------------------------------------


async def test_usage_streamed_and_whole(protocol: str, sim: Simulator) -> None:
    async with client(protocol, sim) as c:
        whole = await c.chat.completions.create(model="chat", messages=MESSAGES)
        stream = await c.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        _, chunks = await read(stream)
        plain = await c.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        _, plain_chunks = await read(plain)
    usage = whole.usage
    assert usage is not None
    assert usage.prompt_tokens > 0 and usage.completion_tokens == 20
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None  # openai's usage chunk, last
    assert last.usage.completion_tokens == usage.completion_tokens
    assert last.usage.prompt_tokens == usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # Without include_usage no chunk carries usage, whatever the wire protocol reported.
    assert all(c.usage is None for c in plain_chunks)


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("429", openai.RateLimitError),
        ("500", openai.InternalServerError),
        # OpenAI's simulator answers 503; Anthropic's answers 529 (overloaded_error). Both are
        # server errors to the caller.
        ("503", openai.InternalServerError),
    ],
)
async def test_a_status_fault_raises_the_openai_exception(
    protocol: str, sim: Simulator, kind: str, error: type[Exception]
) -> None:
    for stream in (False, True):  # a client each: a 429 makes the target cool down
        async with client(protocol, sim, max_retries=0) as c:
            with pytest.raises(openai.APIError) as info:
                await c.chat.completions.create(
                    model="chat",
                    messages=MESSAGES,
                    stream=stream,
                    extra_headers=fault(kind),
                )
        exc = info.value
        assert isinstance(exc, AllTargetsFailed)  # a route: every target failed
        cause = exc.errors[target(protocol)]
        assert isinstance(cause, error), cause


async def test_an_error_in_the_stream_after_tokens_interrupts_it(
    protocol: str, sim: Simulator
) -> None:
    async with client(protocol, sim) as c:
        clean = await c.chat.completions.create(model="chat", messages=MESSAGES)
        expected = clean.choices[0].message.content or ""
        stream = await c.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("stream-error:5")
        )
        seen: list[str] = []
        with pytest.raises(StreamInterrupted) as info:
            async for chunk in stream:
                if chunk.choices:
                    seen.append(chunk.choices[0].delta.content or "")
    exc = info.value
    assert isinstance(exc, openai.APIError)
    assert exc.partial_text == "".join(seen) and exc.partial_text
    assert expected.startswith(exc.partial_text) and exc.partial_text != expected
    cause = exc.__cause__
    assert isinstance(cause, openai.APIError) and cause.message in str(exc)
    if protocol == "openai":
        # As openai raises it: a plain APIError with the event's message and error body.
        assert not isinstance(cause, openai.APIStatusError)
        assert isinstance(cause.body, dict) and cause.body["type"] == "server_error"
    else:
        # Documented difference: an Anthropic ``error`` event names its type, which maps to
        # the status Anthropic sends it with (overloaded_error: 529, a server error).
        assert isinstance(cause, openai.InternalServerError) and cause.status_code == 529
        assert "Overloaded" in cause.message


async def test_an_error_in_a_whole_answer(protocol: str, sim: Simulator) -> None:
    """``stream-error`` on a request that is not streamed: each simulator answers it with a
    server error status (OpenAI 500, Anthropic 529 overloaded), which raises the same way."""
    async with client(protocol, sim, max_retries=0) as c:
        with pytest.raises(AllTargetsFailed) as info:
            await c.chat.completions.create(
                model="chat", messages=MESSAGES, extra_headers=fault("stream-error:5")
            )
    assert isinstance(info.value.errors[target(protocol)], openai.InternalServerError)


# -- cancel -------------------------------------------------------------------------------------


async def test_leaving_a_stream_early_resets_it(protocol: str, sim_busy: Simulator) -> None:
    async with client(protocol, sim_busy) as c:
        await wait_for(lambda: sim_busy.stats()["in_flight"] == 0)
        before = sim_busy.stats()
        stream = await c.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                break
        assert c.stats()[target(protocol)].in_flight == 0
        await wait_for(
            lambda: sim_busy.stats()["streams_cancelled"] == before["streams_cancelled"] + 1
        )
        after = sim_busy.stats()
    assert after["streams_cancelled"] == before["streams_cancelled"] + 1
    assert after["chat_requests"] == before["chat_requests"] + 1
    assert after["streams_completed"] == before["streams_completed"]


# -- continuation -------------------------------------------------------------------------------


async def test_a_broken_stream_continues_on_the_same_target(protocol: str, sim: Simulator) -> None:
    async with client(protocol, sim, provider_extra={"continuation": {}}) as c:
        clean = await c.chat.completions.create(model="chat", messages=MESSAGES)
        expected = clean.choices[0].message.content or ""
        stream = await c.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("drop:5")
        )
        text, chunks = await read(stream)
        sent = sim.last_requests[-1]["json"]
    assert text == expected  # nothing repeated, nothing lost
    assert finishes(chunks) == ["stop"]
    assert len({c.id for c in chunks}) == 1
    route = stream.route
    assert route is not None and route.continued_on == [target(protocol)]
    assert [(a.target, a.outcome) for a in route.attempts] == [
        (target(protocol), "interrupted"),
        (target(protocol), "won"),
    ]
    # The continuation asks with the text so far as an assistant prefill (Anthropic's native
    # prefill; a trailing assistant message for the OpenAI simulator's prefix continuation).
    last = sent["messages"][-1]
    assert last["role"] == "assistant"
    prefill = last["content"] if isinstance(last["content"], str) else last["content"][0]["text"]
    assert prefill and expected.startswith(prefill) and len(prefill) < len(expected)


async def test_a_broken_stream_continues_on_the_other_protocol(
    protocol: str, sim: Simulator
) -> None:
    """The broken target speaks ``protocol``; the continuation goes to the other one."""
    other = "anthropic" if protocol == "openai" else "openai"
    cfg = {
        "providers": {
            "a": provider(protocol, sim, continuation={}),
            "b": provider(other, sim, continuation={}),
        },
        "models": {
            "chat": {
                "targets": [f"a:{MODEL[protocol]}", f"b:{MODEL[other]}"],
                "policy": "failover",
            }
        },
        "routing": {"explore": 0},
    }
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=cfg) as c:
        # One fault for the whole server: it hits the first target's request only.
        stream = await c.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("drop:5")
        )
        text, chunks = await read(stream)
    route = stream.route
    assert route is not None and route.continued_on == [f"b:{MODEL[other]}"]
    # Different models answer differently: the text is the broken target's first tokens
    # followed by the other target's continuation of them, one answer with one id.
    assert text and finishes(chunks) == ["stop"]
    assert len({c.id for c in chunks}) == 1


# -- what a protocol cannot express --------------------------------------------------------------


@pytest.mark.parametrize(
    "params", [{"presence_penalty": 0.5}, {"logit_bias": {"50256": -100}}, {"n": 2}]
)
async def test_a_parameter_one_target_cannot_express_goes_to_another(
    sim: Simulator, params: dict[str, Any]
) -> None:
    """The Anthropic target is left out (not tried, not penalised); the OpenAI one serves.
    The OpenAI simulator itself answers only ``n=1`` (a 400): for ``n=2`` the test checks that
    the request reached the OpenAI target and that no Messages request was sent."""
    cfg = {
        "providers": {
            "claude": provider("anthropic", sim),
            "oai": provider("openai", sim),
        },
        "models": {"chat": {"targets": ["claude:claude-sim", "oai:sim-small"]}},
        "routing": {"explore": 0},
    }
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=cfg, max_retries=0) as c:
        mark = uuid.uuid4().hex
        headers = {"x-conformance": mark}
        if "n" in params:
            with pytest.raises(AllTargetsFailed) as info:
                await c.chat.completions.create(
                    model="chat", messages=MESSAGES, extra_headers=headers, **params
                )
            assert list(info.value.errors) == ["oai:sim-small"]
            assert "only n=1" in str(info.value)
        else:
            answer = await c.chat.completions.create(
                model="chat", messages=MESSAGES, extra_headers=headers, **params
            )
            report = route_of(answer)
            assert report is not None and report.winner == "oai:sim-small"
            assert [a.target for a in report.attempts] == ["oai:sim-small"]
            assert answer.choices[0].message.content
        claude = c.stats().get("claude:claude-sim")
    sent = [r for r in sim.last_requests if r["headers"].get("x-conformance") == mark]
    assert [r["path"] for r in sent] == ["/v1/chat/completions"]
    assert all(sent[0]["json"][k] == v for k, v in params.items())
    # The refused target was not tried, so nothing was recorded against it.
    assert claude is None or sum(claude.to_dict()["outcomes"].values()) == 0


@pytest.mark.parametrize(
    "route",
    [
        {"policy": "failover"},
        {"policy": "race"},
        {"policy": "weighted", "weights": [5, 1]},
    ],
    ids=["failover", "race", "weighted"],
)
async def test_every_policy_leaves_a_refused_target_out(
    sim: Simulator, route: dict[str, Any]
) -> None:
    cfg = {
        "providers": {"claude": provider("anthropic", sim), "oai": provider("openai", sim)},
        "models": {"chat": {"targets": ["claude:claude-sim", "oai:sim-small"], **route}},
        "routing": {"explore": 0},
    }
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=cfg) as c:
        for stream in (False, True):
            answer = await c.chat.completions.create(
                model="chat", messages=MESSAGES, presence_penalty=0.5, stream=stream
            )
            report = route_of(answer)
            assert report is not None and report.winner == "oai:sim-small"
            assert [a.target for a in report.attempts] == ["oai:sim-small"]


async def test_a_parameter_no_target_can_express_is_refused_before_sending(
    sim: Simulator,
) -> None:
    async with client("anthropic", sim, max_retries=0) as c:
        before = sim.stats()["chat_requests"]
        with pytest.raises(openai.BadRequestError) as info:
            await c.chat.completions.create(model="chat", messages=MESSAGES, n=2)
        assert sim.stats()["chat_requests"] == before
    message = str(info.value)
    assert "n" in message and target("anthropic") in message
