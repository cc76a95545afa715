"""Hostile bodies through a real gateway on a real redis-server: every field of the chat,
Responses, completions and embeddings bodies, given extreme numbers (±1e400, ±10**400 and a
5,000-digit integer, NaN, ±Infinity, -0, the largest and smallest doubles, 2**63, 10**18), wrong
types, deep nesting and huge strings, sent with keys holding every kind of limit (rpm, tpm, a
budget, concurrency, max_tokens, a latency goal and objective, a model list).

After each request, once the gateway has accounted it:

- its status is below 500, and a refusal is OpenAI's error body;
- nothing on the ``llmroute.server`` logger at WARNING or above: no outage, no bug;
- the key's counters agree with what was delivered: the Redis limits' tokens (this minute and
  of the budget) are the key's ``/admin/usage`` tokens, those are the ``usage`` the client
  received (or, for a stream it asked none for, its content chunks), and the requests of the
  minute are the requests admitted.

One gateway and one simulator for the module, 60 examples: 6-8 s on a 2-core machine at a load
average of 12 (``--hypothesis-show-statistics`` shows the paths and statuses they reached).
Found this way: a request estimated at 0 tokens (an empty prompt, no ``max_tokens``) never had
its usage counted in Redis, and a stream without usage counted its finish-reason chunk as a
token.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

DEADLINE = 60.0  # an HTTP client's timeout: a hang guard only
TRIES = 100  # polls of a bounded wait for the gateway's accounting
WINDOW = 55.0  # seconds from the first request in which no count has left the minute yet
SERVES = {"responses": True, "responses_stored": True}
KEYS = {
    name: f"gw-fuzz-{name}-0123456789abcdef"
    for name in ("rpm", "tpm", "budget", "everything", "plain", "admin")
}
TENANTS: dict[str, dict[str, Any]] = {
    "rpm": {"rpm": 100_000},
    "tpm": {"rpm": 100_000, "tpm": 50_000},
    "budget": {"budget_tokens": 10**9, "budget_period": "8760h"},
    "everything": {
        "rpm": 100_000,
        "tpm": 10**7,
        "budget_tokens": 10**9,
        "budget_period": "8760h",
        "max_concurrency": 2,
        "max_tokens": 4096,
        "default_max_tokens": 16,
        "ttft_target_ms": 5000,
        "slo_ttft_ms": 2000,
        "models": ["chat"],
    },
    "plain": {},
    "admin": {"admin": True},
}
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


@dataclass(frozen=True)
class Raw:
    """JSON text sent as it is: what ``json.dumps`` cannot write (``1e400``, a 5,000-digit
    integer, ``-0``) or would recurse too deep to write (nesting thousands of levels)."""

    text: str


def encode(body: dict[str, Any]) -> bytes:
    raws: list[str] = []

    def placeholder(value: object) -> str:
        assert isinstance(value, Raw)
        raws.append(value.text)
        return f"@@RAW{len(raws) - 1}@@"

    text = json.dumps(body, default=placeholder)
    for index, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{index}@@"', raw, 1)
    return text.encode()


# -- values -------------------------------------------------------------------------------------

EXTREME = st.sampled_from(
    [
        Raw("1e400"),
        Raw("-1e400"),
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-Infinity"),
        Raw("-0"),
        Raw("-0.0"),
        Raw("1" + "0" * 400),
        Raw("-1" + "0" * 400),
        Raw("9" * 5000),
        1.7976931348623157e308,
        -1.7976931348623157e308,
        5e-324,
        2**53 + 1,
        2**63,
        -(2**63),
        10**17,
        10**18,
        0,
        -1,
        0.5,
    ]
)
WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
)
DEEP = st.integers(2, 3000).flatmap(
    lambda n: st.sampled_from(
        [Raw("[" * n + "]" * n), Raw('{"a": ' * n + "1" + "}" * n), Raw("[" * n + "NaN" + "]" * n)]
    )
)
HUGE = st.sampled_from([10_000, 10_000, 300_000, 1_500_000]).map(lambda n: "y" * n)  # 1 MiB max
TEXT = st.text(max_size=30)
LIMIT = st.integers(1, 24) | st.sampled_from([10**17, 10**18, 2**63, 10**400])
USER = st.builds(lambda text: {"role": "user", "content": text}, TEXT | HUGE)

_COMMON: dict[str, st.SearchStrategy[Any]] = {
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "n": st.just(1),
    "max_tokens": LIMIT,
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "seed": st.integers(),
    "stop": TEXT | st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "user": TEXT,
    "logit_bias": st.dictionaries(st.just("50256"), st.floats(-100, 100), max_size=1),
    "llmroute": st.fixed_dictionaries({"ttft_target_ms": st.floats(1, 10_000)}),
    "top_k": st.integers(),  # a vendor's own: passed on as it is
}
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "/v1/chat/completions": {
        **_COMMON,
        "messages": st.lists(USER, min_size=1, max_size=3),
        "max_completion_tokens": LIMIT,
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 20),
        "tools": st.just([]),
        "tool_choice": st.sampled_from(["none", "auto"]),
        "parallel_tool_calls": st.booleans(),
        "response_format": st.just({"type": "text"}),
    },
    "/v1/completions": {
        **_COMMON,
        "prompt": TEXT | HUGE | st.lists(st.integers(0, 50_000), min_size=1, max_size=8),
        "logprobs": st.integers(0, 5),
        "echo": st.booleans(),
        "best_of": st.just(1),
        "suffix": TEXT,
    },
    "/v1/embeddings": {
        "input": TEXT | HUGE | st.lists(TEXT, min_size=1, max_size=3),
        "encoding_format": st.sampled_from(["float", "base64"]),
        "dimensions": st.integers(1, 16) | st.sampled_from([10**18, 10**400]),
        "user": TEXT,
    },
    "/v1/responses": {
        "input": TEXT | HUGE | st.lists(USER, min_size=1, max_size=2),
        "instructions": TEXT,
        "stream": st.booleans(),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_output_tokens": LIMIT,
        "top_logprobs": st.integers(0, 20),
        "tools": st.just([]),
        "tool_choice": st.sampled_from(["none", "auto"]),
        "parallel_tool_calls": st.booleans(),
        "text": st.just({"format": {"type": "text"}}),
        "store": st.booleans(),
        "metadata": st.just({}),
        "user": TEXT,
        "include": st.just([]),
        "truncation": st.just("auto"),
        "llmroute": st.fixed_dictionaries({"ttft_target_ms": st.floats(1, 10_000)}),
    },
}
REQUIRED = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/responses": "input",
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """A key, a path and a body: a valid one with a few fields (the model's too) changed to
    valid, extreme, wrongly typed, deeply nested or huge values."""
    key = draw(st.sampled_from([k for k in KEYS if k != "admin"]))
    path = draw(st.sampled_from(PATHS))
    fields = FIELDS[path]
    body: dict[str, Any] = {"model": "chat", REQUIRED[path]: draw(fields[REQUIRED[path]])}
    for name in draw(st.lists(st.sampled_from([*fields, "model"]), max_size=4, unique=True)):
        valid = fields.get(name, st.sampled_from(["chat", "nope"]))
        body[name] = draw(st.one_of(valid, valid, EXTREME, WRONG, DEEP, HUGE))
    return key, path, body


# -- the gateway and what it counted ------------------------------------------------------------


class Alarms(logging.Handler):
    """Records of WARNING and above on the gateway's logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@dataclass
class Ledger:
    """What the test sent and saw, per key, since the module's gateway started."""

    gateway: Gateway
    http: httpx.Client
    alarms: Alarms
    started: float
    calls: dict[str, int]
    usage: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def ledger(redis_url: str) -> Iterator[Ledger]:
    with Simulator(profile=Profile(reply_tokens=8), tls=False) as sim:
        config = {
            "providers": {"sim": {"base_url": sim.base_url, "api_key": "sk-fuzz-up", **SERVES}},
            "models": {"chat": {"targets": ["sim:sim-small"]}, "other": {"targets": ["sim:m"]}},
            "routing": {"explore": 0},
            "cache": {"backend": "off"},  # a replay delivers usage it does not count
            "redis": {"url": redis_url, "prefix": f"fuzz-{uuid.uuid4().hex[:8]}"},
            "gateway": {
                "keys": {name: f"GW_FUZZ_{name.upper()}" for name in KEYS},
                "tenants": TENANTS,
                "limits_backend": "redis",
                "limits_on_redis_error": "refuse",  # an outage would be a 503
                "max_body_bytes": "1MiB",
            },
        }
        environ = {f"GW_FUZZ_{name.upper()}": key for name, key in KEYS.items()}
        alarms = Alarms()
        logger = logging.getLogger("llmroute.server")
        logger.addHandler(alarms)
        try:
            with (
                Gateway(config, environ=environ, max_retries=0) as gateway,
                httpx.Client(
                    base_url=gateway.base_url.removesuffix("/v1"), timeout=DEADLINE
                ) as http,
            ):
                yield Ledger(gateway, http, alarms, time.time(), {}, usage_of(http))
        finally:
            logger.removeHandler(alarms)


def usage_of(http: httpx.Client) -> dict[str, dict[str, Any]]:
    answer = http.get("/admin/usage", headers={"authorization": f"Bearer {KEYS['admin']}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["keys"]


def accounted(ledger: Ledger, key: str) -> dict[str, Any]:
    """The key's usage once the gateway has counted every request sent with it (a request is
    counted after its answer went out and its limits were corrected)."""
    for _ in range(TRIES):
        usage = usage_of(ledger.http)[key]
        if usage["requests"] == ledger.calls[key]:
            return usage
        time.sleep(0.02)
    raise AssertionError(f"{key}: {ledger.calls[key]} requests sent, {usage['requests']} counted")


@dataclass
class Delivered:
    """The tokens an answer shows its client: its ``usage`` if it has one, else (a stream
    asked for none) its chunks with content."""

    prompt: int | None = None
    completion: int | None = None
    chunks: int = 0
    ended: bool = False


def delivered(path: str, answer: httpx.Response) -> Delivered:
    seen = Delivered()
    if not answer.headers.get("content-type", "").startswith("text/event-stream"):
        usage = answer.json().get("usage") or {}
        seen.ended = True
    else:
        usage = {}
        for line in answer.text.splitlines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                seen.ended = True
                continue
            event = json.loads(line[6:])
            if event.get("type") == "response.completed":
                usage, seen.ended = event["response"].get("usage") or {}, True
            elif event.get("usage"):
                usage = event["usage"]
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta", {}).get("content") or choices[0].get("text")):
                seen.chunks += 1
    if usage:
        seen.prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        seen.completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return seen


def admitted(answer: httpx.Response) -> bool:
    """Whether the key's limits counted the request: its answer carries their headers and
    is not their refusal."""
    counted = ("x-ratelimit-limit-requests", "x-ratelimit-limit-tokens", "x-llmroute-budget-reset")
    if not any(name in answer.headers for name in counted):
        return False
    if answer.status_code != 429:
        return True
    return answer.json()["error"]["code"] not in ("rate_limit_exceeded", "insufficient_quota")


# -- the property -------------------------------------------------------------------------------


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=requests())
def test_no_body_is_a_5xx_an_outage_or_a_miscount(
    ledger: Ledger, request: tuple[str, str, dict[str, Any]]
) -> None:
    key, path, body = request
    answer = ledger.http.post(
        path,
        content=encode(body),
        headers={"authorization": f"Bearer {KEYS[key]}", "content-type": "application/json"},
    )
    ledger.calls[key] = ledger.calls.get(key, 0) + 1
    event(f"{path} {answer.status_code}")  # --hypothesis-show-statistics
    # Accounted first, so that a failed example leaves the next one a true starting point.
    before, after = ledger.usage[key], accounted(ledger, key)
    ledger.usage[key] = after
    alarms, ledger.alarms.seen = ledger.alarms.seen, []
    assert answer.status_code < 500, answer.text[:500]
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert isinstance(error["message"], str) and error["message"], error
        assert set(error) >= {"message", "type", "param", "code"}, error
    assert alarms == []

    # The client's tokens are the key's usage...
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    completion = after["completion_tokens"] - before["completion_tokens"]
    if answer.status_code != 200:
        assert (prompt, completion) == (0, 0)  # nothing came back that anyone counted
    else:
        seen = delivered(path, answer)
        assert seen.ended, answer.text[-300:]
        if seen.prompt is not None:
            assert (prompt, completion) == (seen.prompt, seen.completion)
        elif path != "/v1/embeddings":
            assert completion == seen.chunks
    # ... and the usage is what the limits counted, shared in Redis.
    limits, earlier = after.get("limits"), before.get("limits")
    if limits is None or earlier is None:
        return
    used = prompt + completion
    if limits["budget_tokens"] is not None:
        assert limits["budget_spent"] - earlier["budget_spent"] == used
    if time.time() - ledger.started < WINDOW:  # no count has left the minute yet
        assert limits["tokens_this_minute"] - earlier["tokens_this_minute"] == used
        counted = limits["requests_this_minute"] - earlier["requests_this_minute"]
        assert counted == admitted(answer)
