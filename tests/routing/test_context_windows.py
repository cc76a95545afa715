"""Context windows: the plan leaves out targets a request is estimated not to fit, and a
context-length error fails over to a target with a larger declared window, on chat (OpenAI's
and Anthropic's wire formats, streamed and not), Responses, the sync client and the gateway.

The simulator counts a prompt as its words plus 3 a message and refuses, past the window in
header ``x-sim-context-window``, as the vendors do; llmroute's estimate counts characters. So
``"word " * 300`` is estimated far past a 50-token window (left out), while ``"a " * 100`` is
estimated inside it (sent) and refused by the simulator (103 tokens).
"""

from __future__ import annotations

from typing import Any, cast

import httpx
import openai
import pytest

import llmroute
from llmroute import AsyncOpenAI, RouteReport
from llmroute.cli._chat import route_lines
from llmroute.routing.engine import Route, Router, RouteTarget
from llmroute.routing.policies import FailoverPolicy
from llmroute.routing.race import Race
from llmroute.routing.windows import (
    answer_room,
    larger_windows,
    needed_tokens,
    refused_sizes,
    too_long,
)
from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

LONG: Any = [{"role": "user", "content": "word " * 300}]  # ~284 needed (x 3/4), 303 counted
DENSE: Any = [{"role": "user", "content": "a " * 100}]  # ~40 needed (x 3/4), 103 counted
SHORT: Any = [{"role": "user", "content": "Say hello."}]


def config(
    sim: Simulator,
    *,
    small: int | None = 50,
    big: int | None = 1000,
    protocol: str = "openai",
    **route: Any,
) -> dict[str, Any]:
    """Two providers on one simulator: ``small`` refuses past 50 tokens (and declares
    ``small``), ``big`` declares ``big`` and refuses nothing."""
    kind = {"kind": "anthropic"} if protocol == "anthropic" else {}
    serves = {"responses": True} if protocol == "openai" else {}
    providers: dict[str, Any] = {
        "small": {
            **kind,
            **serves,
            "base_url": sim.base_url,
            "api_key": KEY,
            "headers": {"x-sim-context-window": "50"},
        },
        "big": {**kind, **serves, "base_url": sim.base_url, "api_key": KEY},
    }
    if small is not None:
        providers["small"]["context_window"] = small
    if big is not None:
        providers["big"]["context_window"] = big
    return {
        "providers": providers,
        "models": {
            "chat": {"targets": ["small:sim-small", "big:sim-small"], "policy": "failover", **route}
        },
        "routing": {"explore": 0},
    }


def refusals(sim: Simulator) -> int:
    return int(sim.stats()["faults"].get("context-window", 0))


async def read(stream: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def steps(route: Any) -> list[tuple[str, str]]:
    return [(a.target, a.outcome) for a in route.attempts]


# -- the plan filter, pure ----------------------------------------------------------------------


def test_answer_room_reads_the_limit_of_each_api() -> None:
    assert answer_room({"max_tokens": 100}) == 100
    assert answer_room({"max_completion_tokens": 70, "max_tokens": 100}) == 70
    assert answer_room({"max_output_tokens": 64}, "responses") == 64
    assert answer_room({"max_tokens": 100}, "responses") == 0  # not a Responses field
    assert answer_room({}) == 0
    assert answer_room({"max_tokens": True}) == 0  # not a count
    assert answer_room({"max_tokens": -5}) == 0


def test_needed_tokens_count_three_quarters_of_the_estimate() -> None:
    assert needed_tokens(400, 0) == 300
    assert needed_tokens(400, 100) == 400
    assert needed_tokens(0, 0) == 0


def test_too_long_leaves_out_only_declared_windows_below_the_need() -> None:
    windows = {"a": 8000, "b": None, "c": 128000}
    assert too_long(windows, 9000) == {"a": 8000}
    assert too_long(windows, 8000) == {}  # exactly fits
    assert too_long(windows, 500_000) == {"a": 8000, "c": 128000}  # b (unknown) still goes
    assert too_long({}, 10) == {}


def test_when_every_target_is_too_small_the_largest_windows_stay() -> None:
    windows = {"a": 8000, "b": 32000, "c": 32000}
    assert too_long(windows, 100_000) == {"a": 8000}
    assert too_long({"a": 8000}, 100_000) == {}  # one target: the vendor decides


def test_larger_windows_are_those_strictly_above() -> None:
    windows = {"a": 8000, "b": None, "c": 128000, "d": 32000}
    assert larger_windows(windows, 8000) == ["c", "d"]
    assert larger_windows(windows, 128000) == []


def plan_of(windows: list[int | None], body: dict[str, Any], kind: str = "chat") -> Any:
    """The engine's plan for ``body`` on a failover route of targets with these windows."""
    targets = tuple(RouteTarget(f"p{i}", "m", context_window=w) for i, w in enumerate(windows))
    route = Route("chat", targets, FailoverPolicy())
    router = Router({"chat": route}, explore_share=0)
    run = router._begin(route, body, cast(Any, None), stream=True, kind=kind)
    return run.plan(), run.report


def test_the_engines_plan_leaves_out_windows_below_the_request() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 10}
    # needed: (2000 / 4 + 4) * 3/4 + 10 = 388
    plan, report = plan_of([300, None, 388, 100_000], body)
    assert plan.order == ("p1:m", "p2:m", "p3:m")
    assert list(report.left_out) == ["p0:m"] and "~388 tokens" in report.left_out["p0:m"]
    plan, report = plan_of([300, 200], body)  # none fits: the largest still gets it
    assert plan.order == ("p0:m",) and list(report.left_out) == ["p1:m"]
    responses = {"input": "x" * 2000, "max_output_tokens": 100}
    plan, report = plan_of([400, 500], responses, kind="responses")
    assert plan.order == ("p1:m",) and list(report.left_out) == ["p0:m"]
    plan, report = plan_of([None, None], body)
    assert plan.order == ("p0:m", "p1:m") and not report.left_out


def refused(windows: list[int | None], message: str) -> tuple[bool, int | None]:
    """After the first target (p0) refused with ``message``: whether a larger window follows,
    and the bar the next targets' declared windows must pass."""
    body = {"messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 10}  # ~388
    targets = tuple(RouteTarget(f"p{i}", "m", context_window=w) for i, w in enumerate(windows))
    route = Route("chat", targets, FailoverPolicy())
    run = Router({"chat": route}, explore_share=0)._begin(route, body, cast(Any, None), stream=True)
    request = httpx.Request("POST", "https://example.invalid/v1/chat/completions")
    exc = openai.BadRequestError(
        message, response=httpx.Response(400, request=request), body={"message": message}
    )
    state = Race()
    return run.failures.larger_window_follows("p0:m", state, exc), state.refused_at


def test_an_undeclared_window_is_read_from_the_error_else_estimated() -> None:
    said = "This model's maximum context length is 300 tokens. However, you requested 420 tokens"
    assert refused([None, 400, 1000], said) == (True, 419)  # 400 < the 420 needed: not tried
    assert refused([None, 400], said) == (False, 419)
    # A message that says nothing: the request's own estimate (388, low) is the bar.
    assert refused([None, 400], "Input is too long for this model.") == (True, 388)
    assert refused([None, 300], "Input is too long for this model.") == (False, 388)
    assert refused([500, 600], "Input is too long for this model.") == (True, 500)  # declared


def test_show_route_names_the_targets_left_out() -> None:
    why = "context window 50 < ~284 tokens (prompt estimate + answer room)"
    report = RouteReport(route="chat", policy="hedge", winner="big:m", left_out={"small:m": why})
    assert f"  left out: small:m ({why})" in route_lines(report, None, "chat")


# -- the simulator's window -----------------------------------------------------------------------


async def test_the_simulator_refuses_past_its_window_as_openai_does(sim: Simulator) -> None:
    async with AsyncOpenAI(
        api_key=KEY,
        base_url=sim.base_url,
        verify=sim.ssl_context(),
        max_retries=0,
        default_headers={"x-sim-context-window": "50"},
    ) as plain:
        with pytest.raises(openai.BadRequestError) as caught:
            await plain.chat.completions.create(model="sim-small", messages=DENSE)
        done = await plain.chat.completions.create(model="sim-small", messages=SHORT)
    body: Any = caught.value.body
    assert body["code"] == "context_length_exceeded"
    assert "maximum context length is 50 tokens" in body["message"]
    assert done.choices[0].message.content


async def test_a_profile_window_counts_the_answers_room_too() -> None:
    with Simulator(profile=Profile(reply_tokens=5, context_window=20)) as small:
        async with AsyncOpenAI(
            api_key=KEY, base_url=small.base_url, verify=small.ssl_context(), max_retries=0
        ) as plain:
            fits = await plain.chat.completions.create(
                model="sim-small", messages=SHORT, max_completion_tokens=15
            )
            with pytest.raises(openai.BadRequestError) as caught:
                await plain.chat.completions.create(
                    model="sim-small", messages=SHORT, max_completion_tokens=16
                )
        assert small.stats()["faults"] == {"context-window": 1}
    assert fits.choices[0].message.content
    body: Any = caught.value.body
    assert "requested 21 tokens (5 in the messages, 16 in the completion)" in body["message"]


# -- routed: chat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_a_prompt_estimated_too_long_is_not_sent_to_the_small_window(
    sim: Simulator, stream: bool
) -> None:
    before = refusals(sim)
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context(), max_retries=0) as c:
        result: Any = await c.chat.completions.create(model="chat", messages=LONG, stream=stream)
        text = await read(result) if stream else result.choices[0].message.content
    route = result.route
    assert text
    assert steps(route) == [("big:sim-small", "won")]
    assert list(route.left_out) == ["small:sim-small"]
    assert "context window 50" in route.left_out["small:sim-small"]
    assert refusals(sim) == before  # the small target was never asked


async def test_max_tokens_counts_against_the_window(sim: Simulator) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context(), max_retries=0) as c:
        done: Any = await c.chat.completions.create(model="chat", messages=SHORT, max_tokens=60)
        fits: Any = await c.chat.completions.create(model="chat", messages=SHORT, max_tokens=20)
    assert steps(done.route) == [("big:sim-small", "won")] and done.route.left_out
    assert steps(fits.route) == [("small:sim-small", "won")] and not fits.route.left_out


@pytest.mark.parametrize("stream", [True, False])
async def test_a_context_length_error_fails_over_to_a_larger_window(
    sim: Simulator, stream: bool
) -> None:
    before = refusals(sim)
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context(), max_retries=0) as c:
        result: Any = await c.chat.completions.create(model="chat", messages=DENSE, stream=stream)
        text = await read(result) if stream else result.choices[0].message.content
    assert text
    assert steps(result.route) == [("small:sim-small", "error"), ("big:sim-small", "won")]
    assert "maximum context length is 50" in (result.route.attempts[0].error or "")
    assert refusals(sim) == before + 1


def test_a_refusal_says_the_window_and_the_need_in_the_vendors_words() -> None:
    openai_ = (
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages."
    )
    vllm = (
        "This model's maximum context length is 4096 tokens. However, you requested 5000 "
        "tokens (4000 in the messages, 1000 in the completion). Please reduce the length."
    )
    vllm_new = (
        "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum "
        "context length is 4096 tokens and your request has 3500 input tokens (1000 > 4096 - "
        "3500)."
    )
    sglang = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
    anthropic = "prompt is too long: 210000 tokens > 200000 maximum"
    assert refused_sizes(openai_) == (8192, 9000)
    assert refused_sizes(vllm) == (4096, 5000)
    assert refused_sizes(vllm_new) == (4096, None)
    assert refused_sizes(sglang) == (4096, 5000)
    assert refused_sizes(anthropic) == (200000, 210000)
    # Anything else says nothing: another phrasing, or numbers that contradict each other.
    assert refused_sizes("Input is too long for the context window") == (None, None)
    assert refused_sizes("maximum context length is 8192 tokens, you requested 100 tokens") == (
        None,
        None,
    )


@pytest.mark.parametrize("stream", [True, False])
async def test_a_refusal_from_an_undeclared_window_fails_over_by_what_it_says(
    sim: Simulator, stream: bool
) -> None:
    # The small target declares no window; its error says 50 tokens, and the request needs
    # 103: the big target's declared 1000 takes it (the reviewer's case: BadRequestError).
    async with AsyncOpenAI(
        config=config(sim, small=None), verify=sim.ssl_context(), max_retries=0
    ) as c:
        result: Any = await c.chat.completions.create(model="chat", messages=DENSE, stream=stream)
        text = await read(result) if stream else result.choices[0].message.content
    assert text
    assert steps(result.route) == [("small:sim-small", "error"), ("big:sim-small", "won")]
    assert result.route.left_out == {}


async def test_a_refusal_says_its_need_and_a_window_below_it_is_not_tried(
    sim: Simulator,
) -> None:
    # The need the error names (103) is above the next target's declared 60: not tried.
    async with AsyncOpenAI(
        config=config(sim, small=None, big=60), verify=sim.ssl_context(), max_retries=0
    ) as c:
        with pytest.raises(openai.BadRequestError):
            await c.chat.completions.create(model="chat", messages=DENSE)
    assert sim.last_requests[-1]["headers"].get("x-sim-context-window") == "50"


@pytest.mark.parametrize("big", [None, 50])
async def test_without_a_larger_declared_window_the_error_is_the_callers(
    sim: Simulator, big: int | None
) -> None:
    async with AsyncOpenAI(
        config=config(sim, big=big), verify=sim.ssl_context(), max_retries=0
    ) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.chat.completions.create(model="chat", messages=DENSE, stream=True)
    body: Any = caught.value.body
    assert body["code"] == "context_length_exceeded"


async def test_when_every_window_is_too_small_the_largest_is_asked(sim: Simulator) -> None:
    async with AsyncOpenAI(
        config=config(sim, big=60), verify=sim.ssl_context(), max_retries=0
    ) as c:
        stream: Any = await c.chat.completions.create(model="chat", messages=LONG, stream=True)
        text = await read(stream)
    assert text  # the big target has no window in the simulator: it answers
    assert steps(stream.route) == [("big:sim-small", "won")]
    assert list(stream.route.left_out) == ["small:sim-small"]


async def test_a_hedge_policy_fails_over_on_context_length_too(sim: Simulator) -> None:
    cfg = config(sim, policy="hedge")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as c:
        for _ in range(3):  # whichever target the stats rank first
            stream: Any = await c.chat.completions.create(model="chat", messages=DENSE, stream=True)
            assert await read(stream)
            assert stream.route.winner == "big:sim-small"


@pytest.mark.parametrize("stream", [True, False])
async def test_anthropic_targets_fail_over_and_are_left_out_alike(
    sim: Simulator, stream: bool
) -> None:
    cfg = config(sim, protocol="anthropic")
    mid: Any = [{"role": "user", "content": "a " * 30}]  # 33 counted: with 20 to answer, past 50
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as c:
        calls: list[Any] = [
            await c.chat.completions.create(
                model="chat", messages=messages, max_tokens=room, stream=stream
            )
            for messages, room in ((DENSE, 5), (mid, 20), (LONG, 5))
        ]
        if stream:
            for call in calls:
                assert await read(call)
    dense, both, long = (call.route for call in calls)
    for route, said in ((dense, "prompt is too long"), (both, "exceed context limit")):
        assert steps(route) == [("small:sim-small", "error"), ("big:sim-small", "won")]
        assert said in (route.attempts[0].error or "")
    assert steps(long) == [("big:sim-small", "won")] and long.left_out


# -- routed: Responses, the sync client, the gateway ---------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_responses_fail_over_and_are_left_out_alike(sim: Simulator, stream: bool) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context(), max_retries=0) as c:
        dense: Any = await c.responses.create(model="chat", input="a " * 100, stream=stream)
        long: Any = await c.responses.create(model="chat", input="word " * 300, stream=stream)
        if stream:
            async for _ in dense:
                pass
            async for _ in long:
                pass
    assert steps(dense.route) == [("small:sim-small", "error"), ("big:sim-small", "won")]
    assert steps(long.route) == [("big:sim-small", "won")] and long.route.left_out


def test_the_sync_client_fails_over_on_context_length(sim: Simulator) -> None:
    with llmroute.OpenAI(config=config(sim), verify=sim.ssl_context(), max_retries=0) as c:
        done: Any = c.chat.completions.create(model="chat", messages=DENSE)
    assert done.choices[0].message.content
    assert steps(done.route) == [("small:sim-small", "error"), ("big:sim-small", "won")]


async def test_the_gateway_fails_over_on_context_length(sim: Simulator) -> None:
    cfg = {**config(sim), "gateway": {"keys": {"ci": "GW_KEY_CI"}}}
    before = refusals(sim)
    with Gateway(
        cfg, environ={"GW_KEY_CI": "gw-key-0123456789"}, verify=sim.ssl_context(), max_retries=0
    ) as server:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="gw-key-0123456789", max_retries=0
        ) as client:
            done = await client.chat.completions.create(model="chat", messages=DENSE)
            stream = await client.chat.completions.create(model="chat", messages=DENSE, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert done.choices[0].message.content and text
    assert refusals(sim) == before + 2  # each asked the small target first, then the big one
