"""Item 4 of the gateway's hardening: one key's requests cannot change another key's service.

Requests are checked against OpenAI's schema before anything goes upstream; a breaker opens
for everyone only on failures of more than one key; cached answers are per key by default; no
cookie rides from one tenant's request to another's; an upstream's headers reach a client only
as a validated, capped Retry-After.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmroute.server import Gateway
from llmroute.testing import Simulator
from tests.h2script import ScriptedServer, ScriptedStream, client_context, sse_chunk
from tests.reliability.gateway_kit import ENVIRON, KEYS, MESSAGES, config

DEADLINE = 10.0


def _post(gateway: Gateway, key: str, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx.Client(timeout=DEADLINE) as client:
        return client.post(
            gateway.base_url + "/chat/completions",
            content=content,
            headers={"authorization": f"Bearer {key}", **headers},
        )


@pytest.fixture(scope="module")
def plain(sim: Simulator) -> Iterator[Gateway]:
    """A gateway over plain HTTP with a memory cache (answers cached on their first request)."""
    cfg = config(
        {"sim": sim},
        cache={"backend": "memory", "min_hits": 1},
        cache_groups={"shared": ["beta", "gamma"]},
    )
    with Gateway(cfg, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as gateway:
        yield gateway


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": MESSAGES, **fields}


BAD_REQUESTS = [
    (_chat(stream="false"), "stream", "invalid_type"),
    ({"model": "sim", "messages": "hello"}, "messages", "invalid_type"),
    ({"model": "sim", "messages": {"role": "user"}}, "messages", "invalid_type"),
    ({"model": "sim", "messages": []}, "messages", "empty_array"),
    ({"model": "sim", "messages": [{"content": "hi"}]}, "messages[0].role", None),
    ({"model": "sim", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", None),
    ({"model": "sim", "messages": ["hi"]}, "messages[0]", "invalid_type"),
    (_chat(temperature=3), "temperature", "decimal_above_max_value"),
    (_chat(temperature="hot"), "temperature", "invalid_type"),
    (_chat(top_p=-0.1), "top_p", "decimal_below_min_value"),
    (_chat(n=0), "n", "integer_below_min_value"),
    (_chat(n=1.5), "n", "invalid_type"),
    (_chat(max_tokens=True), "max_tokens", "invalid_type"),
    (_chat(stop=["a", "b", "c", "d", "e"]), "stop", "array_above_max_length"),
    (_chat(logit_bias={"50256": 200}), "logit_bias.50256", "decimal_above_max_value"),
    (_chat(stream_options={"include_usage": "yes"}), "stream_options.include_usage", None),
    (_chat(tools="all"), "tools", "invalid_type"),
    ({"model": 5, "messages": MESSAGES}, "model", "invalid_type"),
]


@pytest.mark.parametrize(("body", "param", "code"), BAD_REQUESTS)
def test_a_bad_request_is_a_400_naming_its_field_and_never_goes_upstream(
    plain: Gateway, sim: Simulator, body: dict[str, Any], param: str, code: str | None
) -> None:
    before = sim.stats()["requests"]
    reply = _post(plain, KEYS["alpha"], body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert param in error["message"]
    assert sim.stats()["requests"] == before


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
        b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "seed": -Infinity}',
        b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "top_p": 1e999}',
    ],
)
def test_numbers_json_cannot_carry_are_refused(plain: Gateway, sim: Simulator, raw: bytes) -> None:
    before = sim.stats()["requests"]
    reply = _post(plain, KEYS["alpha"], raw)
    assert reply.status_code == 400
    assert "not valid JSON" in reply.json()["error"]["message"]
    assert sim.stats()["requests"] == before


def test_null_optional_fields_and_vendor_fields_pass(plain: Gateway) -> None:
    body = _chat(temperature=None, stop=None, stream=False, top_k=5, seed=7, n=1)
    assert _post(plain, KEYS["alpha"], body).status_code == 200


def test_cached_answers_are_per_key_by_default(plain: Gateway, sim: Simulator) -> None:
    body = _chat(messages=[{"role": "user", "content": "a prompt only alpha asked"}], temperature=0)
    first = _post(plain, KEYS["alpha"], body)
    again = _post(plain, KEYS["alpha"], body)
    assert (first.headers["x-llmroute-cache"], again.headers["x-llmroute-cache"]) == (
        "miss",
        "hit",
    )
    before = sim.stats()["requests"]
    other = _post(plain, KEYS["beta"], body)
    assert other.headers["x-llmroute-cache"] == "miss"  # beta learns nothing of alpha's prompt
    assert sim.stats()["requests"] == before + 1
    assert other.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]


def test_a_cache_group_shares_answers_between_its_keys(plain: Gateway) -> None:
    body = _chat(
        messages=[{"role": "user", "content": "a prompt of the shared group"}], temperature=0
    )
    assert _post(plain, KEYS["beta"], body).headers["x-llmroute-cache"] == "miss"
    assert _post(plain, KEYS["gamma"], body).headers["x-llmroute-cache"] == "hit"
    assert _post(plain, KEYS["alpha"], body).headers["x-llmroute-cache"] == "miss"


# -- upstream behaviour that one tenant could turn against another -----------------------------


class Upstream:
    """A scripted HTTP/2 upstream: 500 for a prompt containing "poison", a Set-Cookie on every
    answer, a 429 with the Retry-After a prompt asks for; it records each request's headers."""

    def __init__(self) -> None:
        self.seen: list[dict[bytes, bytes]] = []
        self.count = 0

    async def __call__(self, stream: ScriptedStream) -> None:
        self.seen.append(stream.headers)
        self.count += 1
        body = json.loads(stream.body)
        prompt = body["messages"][-1]["content"]
        if "poison" in prompt:
            error = {"error": {"message": "it broke", "type": "server_error"}}
            self._answer(stream, 500, json.dumps(error).encode())
            return
        if prompt.startswith("retry-after"):
            _, name, value = prompt.split("|")
            error = {"error": {"message": "slow down", "type": "rate_limit"}}
            self._answer(stream, 429, json.dumps(error).encode(), [(name.encode(), value.encode())])
            return
        if body.get("stream"):
            stream.conn.send_headers(
                stream.stream_id,
                [
                    (b":status", b"200"),
                    (b"content-type", b"text/event-stream"),
                    (b"set-cookie", f"session=tenant-{self.count}; Path=/".encode()),
                ],
            )
            stream.send(sse_chunk("fine", finish="stop") + b"data: [DONE]\n\n", end=True)
            return
        done = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "fine"},
                    "finish_reason": "stop",
                }
            ],
        }
        cookie = [(b"set-cookie", f"session=tenant-{self.count}; Path=/".encode())]
        self._answer(stream, 200, json.dumps(done).encode(), cookie)

    @staticmethod
    def _answer(
        stream: ScriptedStream,
        status: int,
        data: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        headers = [
            (b":status", str(status).encode()),
            (b"content-type", b"application/json"),
            (b"x-upstream-secret", b"internal-routing-token"),
            *(extra or []),
        ]
        stream.conn.send_headers(stream.stream_id, headers)
        stream.send(data, end=True)


@pytest.fixture
def scripted() -> Iterator[tuple[Gateway, Upstream]]:
    upstream = Upstream()
    with ScriptedServer(upstream) as first, ScriptedServer(upstream) as second:
        cfg = {
            "providers": {
                "one": {"base_url": first.base_url, "api_key": "sk-upstream-one-0123456789"},
                "two": {"base_url": second.base_url, "api_key": "sk-upstream-two-0123456789"},
            },
            "models": {"chat": {"targets": ["one:m", "two:m"], "policy": "failover"}},
            "routing": {"explore": 0, "breaker_failures": 3, "breaker_cooldown": "60s"},
            "gateway": {"keys": {name: f"GW_{name.upper()}" for name in KEYS}},
        }
        with Gateway(cfg, environ=ENVIRON, verify=client_context(), max_retries=0) as gateway:
            yield gateway, upstream


def _say(text: str) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": text}]}


def test_one_keys_failures_do_not_open_the_breakers_for_another(
    scripted: tuple[Gateway, Upstream],
) -> None:
    gateway, upstream = scripted
    for i in range(8):  # far past breaker_failures (3) on both targets
        reply = _post(gateway, KEYS["alpha"], _say(f"poison {i}"))
        assert reply.status_code in (500, 502)
    health = json.loads(httpx.get(gateway.base_url.removesuffix("/v1") + "/health").text)
    assert {t["breaker"] for t in health["targets"].values()} == {"closed"}
    # alpha's own breakers are open: its requests stop reaching the upstream.
    before = upstream.count
    assert _post(gateway, KEYS["alpha"], _say("a fine request")).status_code == 502
    assert upstream.count == before
    # beta is served as if nothing happened: 5 of 5, each reaching the upstream.
    for i in range(5):
        reply = _post(gateway, KEYS["beta"], _say(f"hello {i}"))
        assert reply.status_code == 200, reply.text
    assert upstream.count == before + 5


def test_failures_of_two_keys_open_the_breaker_for_all(
    scripted: tuple[Gateway, Upstream],
) -> None:
    gateway, upstream = scripted
    for i in range(3):
        _post(gateway, KEYS["alpha"], _say(f"poison a{i}"))
        _post(gateway, KEYS["beta"], _say(f"poison b{i}"))
    before = upstream.count
    reply = _post(gateway, KEYS["gamma"], _say("hello"))
    assert reply.status_code == 502
    assert reply.json()["error"]["code"] == "all_targets_failed"
    assert upstream.count == before


def test_no_cookie_rides_from_one_tenant_to_another(scripted: tuple[Gateway, Upstream]) -> None:
    gateway, upstream = scripted
    for i in range(4):
        key = KEYS["alpha"] if i % 2 else KEYS["beta"]
        reply = _post(gateway, key, {**_say(f"hi {i}"), "stream": i >= 2})
        assert reply.status_code == 200
        assert "set-cookie" not in reply.headers
        assert "x-upstream-secret" not in reply.headers
    assert len(upstream.seen) == 4
    assert all(b"cookie" not in headers for headers in upstream.seen)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("retry-after", "7", ("7", "7000")),
        ("retry-after", "99999", ("60", "60000")),  # capped at max_retry_after
        ("retry-after-ms", "1500", ("2", "1500")),
        ("retry-after-ms", "-5", ("0", "0")),
        ("retry-after", "soon, maybe", None),
        ("retry-after", "nan", None),
        ("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT", ("0", "0")),  # a date in the past
    ],
)
def test_an_upstream_retry_after_is_validated_and_capped(
    scripted: tuple[Gateway, Upstream], name: str, value: str, expected: tuple[str, str] | None
) -> None:
    gateway, _ = scripted
    reply = _post(gateway, KEYS["alpha"], _say(f"retry-after|{name}|{value}"))
    assert reply.status_code == 429
    got = (reply.headers.get("retry-after"), reply.headers.get("retry-after-ms"))
    assert got == (expected or (None, None))
    assert "x-upstream-secret" not in reply.headers
