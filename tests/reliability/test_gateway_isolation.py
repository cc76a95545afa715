"""Item 4 of the gateway's hardening: one key's requests cannot change another key's service.

Requests are checked against OpenAI's schema before anything goes upstream; a breaker opens
for everyone only on failures of more than one key; cached answers are per key by default; no
cookie rides from one tenant's request to another's; an upstream's headers reach a client only
as a validated, capped Retry-After.
"""

from __future__ import annotations

import json
import logging
import time
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


# Every number the body checks read, by endpoint; "up" fields have no upper bound (a huge
# positive value is theirs to take: the vendor decides, and the limits count it clamped).
_CHECKED = {
    "/chat/completions": (
        "temperature top_p n presence_penalty frequency_penalty top_logprobs logit_bias.50256",
        "max_tokens max_completion_tokens",
    ),
    "/completions": (
        "temperature top_p n presence_penalty frequency_penalty logprobs best_of",
        "max_tokens",
    ),
    "/responses": ("temperature top_p top_logprobs", "max_output_tokens"),
    "/embeddings": ("", "dimensions"),
}
_REQUIRED = {
    "/chat/completions": {"messages": MESSAGES},
    "/completions": {"prompt": "hi"},
    "/responses": {"input": "hi"},
    "/embeddings": {"input": "hi"},
}
_HUGE = {
    "10**400": "1" + "0" * 400,
    "-10**400": "-1" + "0" * 400,
    "1e400": "1e400",
    "-1e400": "-1e400",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "10**5000": "9" * 5000,  # beyond Python's 4,300 digits: json.loads alone raises
}
_CASES = [
    (path, field, name)
    for path, (bounded, up) in _CHECKED.items()
    for field in bounded.split() + up.split()
    for name in _HUGE
    if not (field in up.split() and name in ("10**400", "10**5000"))
]


def _raw(path: str, field: str, literal: str) -> bytes:
    """The body of ``path`` with ``literal`` as the value of ``field`` (``a.b``: nested)."""
    head, _, leaf = field.rpartition(".")
    body: dict[str, Any] = {"model": "sim", **_REQUIRED[path]}
    (body.setdefault(head, {}) if head else body)[leaf] = "@NUMBER@"
    return json.dumps(body).replace('"@NUMBER@"', literal).encode()


@pytest.mark.parametrize(("path", "field", "name"), _CASES)
def test_a_number_of_any_size_in_a_checked_field_is_a_400_naming_it(
    plain: Gateway, sim: Simulator, path: str, field: str, name: str
) -> None:
    """±10**400, ±1e400, NaN, ±Infinity, 10**5000: OpenAI's 400 naming the field (a number
    was once formatted before it was range-checked: 10**400 raised OverflowError, a 500
    with an empty body that the access log counted as 499)."""
    before = sim.stats()["requests"]
    with httpx.Client(timeout=DEADLINE) as client:
        reply = client.post(
            plain.base_url + path,
            content=_raw(path, field, _HUGE[name]),
            headers={"authorization": f"Bearer {KEYS['alpha']}"},
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", field)
    assert field in error["message"] and len(error["message"]) < 300
    assert sim.stats()["requests"] == before


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ('"temperature": NaN', "temperature"),
        ('"top_p": Infinity', "top_p"),
        ('"seed": -Infinity', "seed"),
        ('"top_p": 1e999', "top_p"),
        ('"vendor_option": [1, {"depth": -1e400}]', "vendor_option[1].depth"),
        (
            '"tools": [{"type": "function", "function": {"parameters": {"maximum": NaN}}}]',
            "tools[0].function.parameters.maximum",
        ),
        ('"seed": ' + "1" * 5000, "seed"),
    ],
)
def test_numbers_json_cannot_carry_are_refused_naming_where(
    plain: Gateway, sim: Simulator, fields: str, param: str
) -> None:
    """Anywhere in the body, checked field or a vendor's own: no JSON encoder could send it on."""
    before = sim.stats()["requests"]
    raw = b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], ' + fields.encode()
    reply = _post(plain, KEYS["alpha"], raw + b"}")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert "not a number JSON can carry" in error["message"]
    assert sim.stats()["requests"] == before


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        (
            "/chat/completions",
            '"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]',
            "model",
        ),
        (
            "/chat/completions",
            '"model": "sim", "messages": [{"role": "user", "content": "a \\udfff"}]',
            "messages[0].content",
        ),
        (
            "/chat/completions",
            '"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\uDC00"]',
            "stop[0]",
        ),
        (
            "/chat/completions",
            '"model": "sim", "messages": [{"role": "user", "content": "hi"}], "user": "\\ud83d"',
            "user",
        ),
        (
            "/chat/completions",
            '"model": "sim", "messages": [{"role": "user", "content": "hi"}], "\\ud800": 1',
            "\\ud800",
        ),
        ("/responses", '"model": "sim", "input": "hi \\ud800"', "input"),
        ("/completions", '"model": "\\udc00", "prompt": "hi"', "model"),
        ("/embeddings", '"model": "sim", "input": ["ok", "\\ud800"]', "input[1]"),
    ],
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_it(
    plain: Gateway, sim: Simulator, path: str, fields: str, param: str
) -> None:
    """JSON's \\ud800 escape without its pair reads as a string no UTF-8 encoder writes: it
    was a 500 wherever the gateway encoded it (the cache key, an error echoing the model name,
    the price estimate), with an empty body for an unknown model."""
    before = sim.stats()["requests"]
    with httpx.Client(timeout=DEADLINE) as client:
        reply = client.post(
            plain.base_url + path,
            content=b"{" + fields.encode() + b"}",
            headers={"authorization": f"Bearer {KEYS['alpha']}"},
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert "lone UTF-16 surrogate" in error["message"]
    assert sim.stats()["requests"] == before


def test_a_surrogate_pair_is_text_and_passes(plain: Gateway) -> None:
    """An escaped pair is one character (an emoji here): it goes upstream as UTF-8."""
    body = b'{"model": "sim", "messages": [{"role": "user", "content": "hi \\ud83d\\ude00"}]}'
    assert _post(plain, KEYS["alpha"], body).status_code == 200


def test_embeddings_take_openai_s_2048_inputs_and_no_more(plain: Gateway, sim: Simulator) -> None:
    """100,000 inputs (a 500 KB body) held the gateway's event loop about 3 s while openai's
    types were built for them, every other key's request waiting; OpenAI refuses past 2,048."""
    before = sim.stats()["requests"]
    with httpx.Client(timeout=DEADLINE) as client:

        def embed(inputs: int) -> httpx.Response:
            return client.post(
                plain.base_url + "/embeddings",
                json={"model": "sim", "input": ["a"] * inputs},
                headers={"authorization": f"Bearer {KEYS['alpha']}"},
            )

        refused = embed(100_000)
        assert refused.status_code == 400, refused.text[:300]
        error = refused.json()["error"]
        assert (error["param"], error["code"]) == ("input", "array_above_max_length")
        assert "at most 2048 items, but got 100000" in error["message"]
        assert sim.stats()["requests"] == before
        answered = embed(2048)
    assert answered.status_code == 200, answered.text[:300]
    assert len(answered.json()["data"]) == 2048


def test_a_huge_max_tokens_is_passed_on_not_refused(plain: Gateway) -> None:
    """No upper bound of OpenAI's own: the route's target decides (the simulator answers)."""
    assert (
        _post(plain, KEYS["alpha"], _chat(max_tokens=10**400, seed=-(10**400))).status_code == 200
    )


def test_a_latency_goal_beyond_a_double_is_a_400_naming_it(plain: Gateway) -> None:
    reply = _post(plain, KEYS["alpha"], _chat(llmroute={"ttft_target_ms": 10**400}))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "llmroute.ttft_target_ms"


def test_a_bug_is_a_500_with_a_sentence_and_logged_as_one(
    plain: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever raises unexpectedly: OpenAI's error body, the access log's 500 (not an empty
    answer logged as 499)."""

    def broken() -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(plain.app, "_health", broken)
    with caplog.at_level(logging.INFO, logger="llmroute.server"):
        reply = httpx.get(plain.base_url.removesuffix("/v1") + "/health", timeout=DEADLINE)
        for _ in range(200):  # the access line is written once the answer went out
            if any(" /health " in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.02)
    assert reply.status_code == 500
    assert reply.json()["error"] == {
        "message": "The gateway failed to answer.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    lines = [r.getMessage() for r in caplog.records]
    assert any("unexpected error answering GET /health: OverflowError" in m for m in lines)
    assert any(m.startswith("GET /health 500 ") for m in lines), lines


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
    # alpha's own breakers are open on both targets: its next request still goes to one of
    # them, once (failing open: refusing it could not answer it), and is answered.
    before = upstream.count
    assert _post(gateway, KEYS["alpha"], _say("a fine request")).status_code == 200
    assert upstream.count == before + 1
    # beta is served as if nothing happened: 5 of 5, each reaching the upstream.
    for i in range(5):
        reply = _post(gateway, KEYS["beta"], _say(f"hello {i}"))
        assert reply.status_code == 200, reply.text
    assert upstream.count == before + 1 + 5


def test_failures_of_two_keys_open_the_breaker_for_all(
    scripted: tuple[Gateway, Upstream],
) -> None:
    gateway, upstream = scripted
    for i in range(3):
        _post(gateway, KEYS["alpha"], _say(f"poison a{i}"))
        _post(gateway, KEYS["beta"], _say(f"poison b{i}"))
    health = json.loads(httpx.get(gateway.base_url.removesuffix("/v1") + "/health").text)
    assert {t["breaker"] for t in health["targets"].values()} == {"open"}
    # Every circuit is open: a third key's request is not refused, it goes to the first
    # target once (failing open) and its answer closes that circuit.
    before = upstream.count
    reply = _post(gateway, KEYS["gamma"], _say("hello"))
    assert reply.status_code == 200, reply.text
    assert upstream.count == before + 1
    health = json.loads(httpx.get(gateway.base_url.removesuffix("/v1") + "/health").text)
    assert health["targets"]["one:m"]["breaker"] == "closed"


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


class _LoopGaps:
    """A ticker on the gateway's event loop: the longest time between two of its ticks, i.e.
    the longest any other key's request would have waited for the loop."""

    def __init__(self, gateway: Gateway) -> None:
        self.loop = gateway._loop
        assert self.loop is not None
        self.longest = 0.0
        self._last: float | None = None
        self._on = True

    def _tick(self) -> None:
        now = time.monotonic()
        if self._last is not None:
            self.longest = max(self.longest, now - self._last)
        self._last = now
        if self._on:
            self.loop.call_later(0.002, self._tick)

    def __enter__(self) -> _LoopGaps:
        self.loop.call_soon_threadsafe(self._tick)
        return self

    def __exit__(self, *exc: object) -> None:
        self._on = False


_HEAVY = {  # just under max_body_bytes (4 MiB) each, every item a separate one
    "/completions": {"model": "sim", "prompt": [1] * 1_300_000},
    "/chat/completions": {
        "model": "sim",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 130_000}],
    },
}


@pytest.mark.parametrize("path", list(_HEAVY))
@pytest.mark.parametrize("stream", [False, True])
def test_a_huge_body_never_walks_through_openai_s_params_transform(
    plain: Gateway, monkeypatch: pytest.MonkeyPatch, path: str, stream: bool
) -> None:
    """The gateway posts its checked JSON as it is: a legacy completion's prompt of 100,000
    token ids held the event loop 2.2 s in openai's TypedDict transform (py-spy:
    openai/_utils/_transform), every other key's request waiting. The transform's calls are
    counted (0), and the loop's longest stall is bounded generously: for these 4 MiB bodies it
    was about 45 s (1.3 million ids through the transform); it is now the routing's linear
    passes over the body (its parse and checks run in a worker thread), about 0.2 s on a
    loaded 2-core machine."""
    import openai._utils._transform as transform

    walked = 0
    inner = transform._async_transform_recursive

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal walked
        walked += 1
        return await inner(*args, **kwargs)

    monkeypatch.setattr(transform, "_async_transform_recursive", counted)
    content = json.dumps({**_HEAVY[path], "stream": stream}).encode()
    assert len(content) < 4 * 1024 * 1024
    with httpx.Client(timeout=60) as client, _LoopGaps(plain) as gaps:
        reply = client.post(
            plain.base_url + path,
            content=content,
            headers={"authorization": f"Bearer {KEYS['alpha']}"},
        )
    assert reply.status_code == 200, reply.text[:300]
    assert walked == 0
    assert gaps.longest < 5.0, f"the event loop stalled {gaps.longest:.2f} s"


_LONG = "x" * 20_000
_ECHOES = [  # (method, path, body, headers): each a client's input an error could echo
    ("GET", "/" + _LONG, None, {}),
    ("GET", "/v1/" + _LONG, None, {}),
    ("POST", "/v1/" + _LONG, _chat(), {}),
    ("GET", "/admin/" + _LONG, None, {}),
    ("POST", "/v1/chat/completions", {"model": _LONG, "messages": MESSAGES}, {}),
    ("POST", "/v1/chat/completions", _chat(logit_bias={_LONG: 500}), {}),
    ("POST", "/v1/chat/completions", _chat(**{_LONG: {"deep": float("nan")}}), {}),
    ("POST", "/v1/chat/completions", _chat(), {"x-llmroute-timeout-total": _LONG}),
    ("POST", "/v1/chat/completions", _chat(), {"x-llmroute-ttft-target-ms": _LONG}),
    ("POST", "/v1/chat/completions", _chat(), {"x-llmroute-cache": _LONG}),
]


@pytest.mark.parametrize(("method", "path", "body", "headers"), _ECHOES)
def test_no_error_echoes_a_client_s_input_unbounded(
    plain: Gateway, method: str, path: str, body: Any, headers: dict[str, str]
) -> None:
    """An unknown URL of 20,000 characters was echoed whole in its 404; a model name, an
    object key, a header value are each shown cut too."""
    root = plain.base_url.removesuffix("/v1")
    with httpx.Client(timeout=DEADLINE) as client:
        reply = client.request(
            method,
            root + path,
            content=None if body is None else json.dumps(body).encode(),
            headers={"authorization": f"Bearer {KEYS['alpha']}", **headers},
        )
    assert 400 <= reply.status_code < 500 or reply.status_code == 200, reply.text[:300]
    if reply.status_code != 200:  # a header the gateway ignores is not an error
        error = reply.json()["error"]
        assert len(error["message"]) < 400, error["message"][:300]
        assert error["param"] is None or len(error["param"]) <= 200
    assert len(reply.content) < 2_000
