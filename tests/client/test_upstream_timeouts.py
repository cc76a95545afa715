"""Upstream timeouts per route and per request (``x-llmroute-timeout-*``), in the SDK and
through ``llmroute serve``'s gateway, against the simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import openai
import pytest

import llmroute
from llmroute._routes import policy_for
from llmroute._timeouts import (
    BETWEEN_TOKENS_HEADER,
    CONNECT_HEADER,
    FIRST_TOKEN_HEADER,
    TOTAL_HEADER,
    RequestTimeouts,
    TimeoutHeaderError,
    request_timeouts,
    with_timeouts,
)
from llmroute.config import RouteConfig, load_config
from llmroute.routing.engine import Route, RouteTarget
from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

from ..settle import settled

UPSTREAM_KEY = "sk-upstream-timeouts-0123456789"
GW_KEY = "gw-timeouts-key-0123456789abcdef"
ENVIRON = {"GW_KEY_CI": GW_KEY}
MESSAGES = [{"role": "user", "content": "Tell me about timeouts."}]
DEADLINE = 20.0  # seconds any request of these tests may take (each expects well under 5)


@pytest.fixture(scope="module")
def slow() -> Iterator[Simulator]:
    """Its own simulator: 300 tokens 10 ms apart (3 s of answer), hangs end after 60 s."""
    with Simulator(profile=Profile(reply_tokens=300, inter_token=0.01, hang_max=60.0)) as server:
        yield server


def config(slow: Simulator, **route: Any) -> dict[str, Any]:
    def provider(fault: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"base_url": slow.base_url, "api_key": UPSTREAM_KEY}
        if fault:
            out["headers"] = {"x-sim-fault": fault}
        return out

    once = {"continue_on_break": False, **route}
    return {
        "providers": {
            "sim": provider(None),
            "stalling": provider("stall-between:3:60"),
            "hanging": provider("hang"),
        },
        "models": {
            "chat": {"targets": ["sim:sim-small"], **once},
            "stalling": {"targets": ["stalling:sim-small"], **once},
            "hanging": {"targets": ["hanging:sim-small"], **once},
        },
        "routing": {"explore": 0},
        "cache": {"backend": "off"},
        "gateway": {"keys": {"ci": "GW_KEY_CI"}},
    }


def events_of(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def post(gateway: Gateway, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(
        headers={"authorization": f"Bearer {GW_KEY}", **headers}, timeout=DEADLINE
    ) as client:
        with anyio.fail_after(DEADLINE):
            return await client.post(gateway.base_url + "/chat/completions", json=body)


# -- the pure parts ---------------------------------------------------------------------------


def test_timeout_headers_are_parsed_and_bad_ones_name_the_header() -> None:
    given = request_timeouts(
        {"X-LLMRoute-Timeout-Connect": "2", FIRST_TOKEN_HEADER: "800ms", TOTAL_HEADER: "1m"}
    )
    assert given == RequestTimeouts(connect=2.0, first_token=0.8, total=60.0)
    assert not request_timeouts({"x-llmroute-cache": "off", "authorization": "x"})
    for name, value in [
        (TOTAL_HEADER, "soon"),
        (FIRST_TOKEN_HEADER, "0"),
        (BETWEEN_TOKENS_HEADER, "-1"),
        (CONNECT_HEADER, "nan"),
        (TOTAL_HEADER, "2h"),  # more than an hour
        ("x-llmroute-timeout-read", "5"),  # not a timeout llmroute knows
    ]:
        with pytest.raises(TimeoutHeaderError) as bad:
            request_timeouts({name: value})
        assert bad.value.header == name and name in str(bad.value)


def test_a_request_s_timeouts_win_over_its_route_s_without_changing_the_route() -> None:
    route = Route(
        name="chat",
        targets=(RouteTarget("sim", "m"),),
        policy=policy_for(RouteConfig(targets=["sim:m"])),
        first_token_timeout=30.0,
        stall_timeout="auto",
        connect_timeout=3.0,
    )
    timeout = httpx.Timeout(600.0, connect=5.0)
    same, http = with_timeouts(route, timeout, RequestTimeouts())
    assert same is route and http.connect == 3.0 and http.read == 600.0  # the route's connect
    own, http = with_timeouts(
        route, timeout, RequestTimeouts(connect=1.0, first_token=2.0, between_tokens=0.5)
    )
    assert (own.first_token_timeout, own.stall_timeout, http.connect) == (2.0, 0.5, 1.0)
    assert own.policy is route.policy and own.budget is route.budget  # shared, not copied
    assert (route.first_token_timeout, route.stall_timeout) == (30.0, "auto")


def test_route_timeouts_are_config_keys_checked_like_the_others() -> None:
    base = {"providers": {"sim": {"base_url": "https://x.invalid/v1"}}}
    loaded = llmroute.Config.model_validate(
        {
            **base,
            "models": {
                "chat": {"targets": ["sim:m"], "connect_timeout": "2s", "total_timeout": "90s"}
            },
        }
    )
    assert (loaded.models["chat"].connect_timeout, loaded.models["chat"].total_timeout) == (2, 90)
    for key in ("connect_timeout", "total_timeout"):
        with pytest.raises(llmroute.ConfigError) as bad:
            load_config({**base, "models": {"chat": {"targets": ["sim:m"], key: "-1s"}}})
        assert key in str(bad.value)


# -- the SDK -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sdk_a_bad_timeout_header_is_a_bad_request_before_anything_is_sent(
    slow: Simulator,
) -> None:
    before = slow.stats()["requests"]
    async with llmroute.AsyncOpenAI(config=config(slow), verify=slow.ssl_context()) as client:
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="chat", messages=MESSAGES, extra_headers={FIRST_TOKEN_HEADER: "later"}
            )
    assert FIRST_TOKEN_HEADER in bad.value.message
    assert (bad.value.body or {}).get("param") == FIRST_TOKEN_HEADER  # type: ignore[union-attr]
    assert slow.stats()["requests"] == before


@pytest.mark.anyio
async def test_sdk_a_request_s_first_token_timeout_ends_a_hanging_target(slow: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        config=config(slow), verify=slow.ssl_context(), max_retries=0
    ) as client:
        with anyio.fail_after(DEADLINE), pytest.raises(openai.APIError) as failed:
            await client.chat.completions.create(
                model="hanging",
                messages=MESSAGES,
                stream=True,
                extra_headers={FIRST_TOKEN_HEADER: "300ms"},
            )
    assert "within 0.3 s" in str(failed.value)  # the request's own deadline, not the route's 30 s


# -- the gateway --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(slow: Simulator) -> Iterator[Gateway]:
    settings = config(slow)
    settings["models"]["bounded"] = {"targets": ["hanging:sim-small"], "total_timeout": "400ms"}
    with Gateway(settings, environ=ENVIRON, verify=slow.ssl_context(), max_retries=0) as server:
        yield server


@pytest.mark.anyio
async def test_gateway_a_bad_timeout_header_is_a_400_naming_it(
    gateway: Gateway, slow: Simulator
) -> None:
    before = slow.stats()["requests"]
    for name, value in [
        (TOTAL_HEADER, "soon"),
        (BETWEEN_TOKENS_HEADER, "0"),
        (CONNECT_HEADER, "1e9"),
    ]:
        answer = await post(gateway, {"model": "chat", "messages": MESSAGES}, {name: value})
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert (error["param"], error["type"]) == (name, "invalid_request_error")
        assert name in error["message"]
    assert slow.stats()["requests"] == before  # nothing went upstream


@pytest.mark.anyio
async def test_gateway_a_stalled_stream_ends_at_the_request_s_between_token_timeout(
    gateway: Gateway,
) -> None:
    """The upstream pauses 60 s before its 3rd token: with a 2 s between-token timeout the
    gateway's stream ends with an error event (no [DONE]) instead of holding the request.
    (2 s, not less: only the 60 s stall may exceed it, never the 10 ms gaps before it, however
    loaded the machine.)"""
    body = {"model": "stalling", "messages": MESSAGES, "stream": True}
    answer = await post(gateway, body, {BETWEEN_TOKENS_HEADER: "2s"})
    assert answer.status_code == 200
    events = events_of(answer.text)
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["code"] == "stream_interrupted" and "2 s" in error["message"]
    assert len(events) >= 3  # the tokens before the stall were passed on first


@pytest.mark.anyio
async def test_gateway_a_hanging_target_ends_at_the_request_s_first_token_timeout(
    gateway: Gateway,
) -> None:
    body = {"model": "hanging", "messages": MESSAGES, "stream": True}
    answer = await post(gateway, body, {FIRST_TOKEN_HEADER: "300ms"})
    assert answer.status_code == 502  # the only target failed before anything was sent
    error = answer.json()["error"]
    assert error["code"] == "all_targets_failed" and "within 0.3 s" in error["message"]


@pytest.mark.anyio
async def test_gateway_total_timeout_cuts_a_stream_and_cancels_its_upstream(
    gateway: Gateway, slow: Simulator
) -> None:
    """An answer that stalls 60 s before its 3rd token, with a 2 s total: the tokens before the
    stall, then an upstream_timeout event, no [DONE], and the upstream stream cancelled. (The
    stall, not a race between the total and the first tokens, decides where the cut falls: a
    3 s answer cut at 500 ms had no chunk at all on a machine slow to start it.)"""
    await settled(slow)  # earlier tests' resets are noticed asynchronously: let them land
    before = slow.stats()["streams_cancelled"]
    body = {"model": "stalling", "messages": MESSAGES, "stream": True}
    answer = await post(gateway, body, {TOTAL_HEADER: "2s"})
    assert answer.status_code == 200
    events = events_of(answer.text)
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert (error["code"], error["type"]) == ("upstream_timeout", "timeout")
    assert "2 s" in error["message"]
    chunks = [json.loads(e) for e in events[:-1]]
    assert 1 <= len(chunks) < 300  # cut mid-way, after tokens had been passed on
    for _ in range(200):  # the simulator notices the reset on its own thread
        if slow.stats()["streams_cancelled"] > before:
            break
        await anyio.sleep(0.05)
    assert slow.stats()["streams_cancelled"] == before + 1


@pytest.mark.anyio
async def test_gateway_a_route_s_total_timeout_answers_504_for_an_unanswered_request(
    gateway: Gateway,
) -> None:
    """Route ``bounded`` has ``total_timeout = "400ms"`` and a target that never answers: a
    non-streamed request gets 504 instead of waiting for the read timeout (600 s)."""
    answer = await post(gateway, {"model": "bounded", "messages": MESSAGES}, {})
    assert answer.status_code == 504
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("upstream_timeout", "timeout")
    assert "0.4 s" in error["message"]
