"""The simulated provider (llmroute.testing): wire format, determinism, faults, cancellation."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest

from llmroute.testing import Profile, Simulator, SimulatorProcess, _stream, _wire

AUTH = {"authorization": "Bearer sk-sim-test"}
MESSAGES = [{"role": "user", "content": "Tell me about fast tokens"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
]
TIMEOUT = httpx.Timeout(5.0)


# -- helpers -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def h2sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=12)) as server:
        yield server


@pytest.fixture(scope="module")
def h1sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=12), tls=False) as server:
        yield server


@pytest.fixture(params=["h2", "h1"])
def anysim(request: pytest.FixtureRequest) -> Simulator:
    return request.getfixturevalue(f"{request.param}sim")


def client(sim: Simulator, **kwargs: Any) -> httpx.Client:
    kwargs.setdefault("timeout", TIMEOUT)
    if sim.tls:
        kwargs.setdefault("verify", sim.ssl_context())
        kwargs.setdefault("http2", True)
    return httpx.Client(base_url=sim.base_url, headers=AUTH, **kwargs)


def body(**kwargs: Any) -> dict[str, Any]:
    return {"model": "sim-small", "messages": MESSAGES, **kwargs}


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every delay the simulator asks for (TTFT, between tokens, stalls), in order; it still
    sleeps them. Its timing is checked by what it was asked to wait, not by a clock."""
    asked: list[float] = []
    real = _stream.pause

    async def recording(seconds: float, gone: asyncio.Event) -> bool:
        asked.append(seconds)
        return await real(seconds, gone)

    monkeypatch.setattr(_stream, "pause", recording)  # the TTFT (the streamed answer)
    monkeypatch.setattr(_wire, "pause", recording)  # between tokens, and a whole answer's wait
    return asked


def stop_ends_the_server(sim: Simulator) -> bool:
    """Stop ``sim`` (``stop()`` itself gives up after 10 s: the hang guard); whether its server
    thread ended, every connection and stream with it."""
    thread = sim._thread  # pyright: ignore[reportPrivateUsage]
    sim.stop()
    return thread is not None and not thread.is_alive()


def events(sim: Simulator, payload: dict[str, Any], **headers: str) -> list[Any]:
    """POST a streamed request; the decoded `data:` payloads ("[DONE]" stays a string)."""
    out: list[Any] = []
    with (
        client(sim) as c,
        c.stream("POST", "/chat/completions", json=payload, headers=headers) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
            else:
                assert line == ""
    return out


def text_of(chunks: list[Any]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if isinstance(c, dict) and c["choices"]
    )


def wait_for(predicate: Any, timeout: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds; its value then (a hang guard: generous, since the
    simulator's own thread may be slow to run on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class RawH2:
    """A bare HTTP/2 client over TLS, to send what httpx cannot (RST_STREAM)."""

    def __init__(self, sim: Simulator) -> None:
        ctx = sim.ssl_context()
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", sim.port), timeout=5)
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.port = sim.port
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def post(self, payload: dict[str, Any], **headers: str) -> int:
        sid = self.conn.get_next_available_stream_id()
        data = json.dumps(payload).encode()
        request = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":scheme", "https"),
            (":authority", f"127.0.0.1:{self.port}"),
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            *AUTH.items(),
            *headers.items(),
        ]
        self.conn.send_headers(sid, request)
        self.conn.send_data(sid, data, end_stream=True)
        self.flush()
        return sid

    def read_events(self) -> list[h2.events.Event]:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        out = self.conn.receive_data(data)
        for ev in out:
            if isinstance(ev, h2.events.DataReceived):
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        self.flush()
        return out

    def read_stream(self, sid: int, until: Any) -> tuple[bytes, h2.events.Event | None]:
        """Read stream `sid` until `until(event)` is true; its body and that event."""
        got = b""
        deadline = time.monotonic() + 30  # a hang guard only
        while time.monotonic() < deadline:
            for ev in self.read_events():
                if getattr(ev, "stream_id", None) != sid:
                    continue
                if isinstance(ev, h2.events.DataReceived):
                    got += ev.data
                if until(ev, got):
                    return got, ev
        raise TimeoutError(f"stream {sid} did not reach the expected state")

    def close(self) -> None:
        self.conn.close_connection()
        try:
            self.flush()
        except OSError:
            pass
        self.sock.close()


# -- server basics -----------------------------------------------------------------------------
def test_starts_and_stops() -> None:
    sim = Simulator().start()  # raises if it is not serving within 30 s (a hang guard)
    try:
        with client(sim) as c:
            assert c.get("/models").status_code == 200
    finally:
        assert stop_ends_the_server(sim)
    assert sim.startup_seconds is not None


def test_http2_negotiated_over_tls(h2sim: Simulator) -> None:
    with client(h2sim) as c:
        r = c.post("/chat/completions", json=body())
    assert r.status_code == 200
    assert r.http_version == "HTTP/2"
    assert h2sim.base_url.startswith("https://127.0.0.1:")


def test_http11_on_plain_and_on_tls_without_h2(h1sim: Simulator) -> None:
    with client(h1sim) as c:
        r = c.post("/chat/completions", json=body())
    assert (r.status_code, r.http_version) == (200, "HTTP/1.1")
    assert h1sim.base_url.startswith("http://127.0.0.1:")
    with Simulator(http2=False) as sim, client(sim) as c:
        r = c.post("/chat/completions", json=body())
        assert (r.status_code, r.http_version) == (200, "HTTP/1.1")


def test_localhost_name_is_in_the_certificate(h2sim: Simulator) -> None:
    url = f"https://localhost:{h2sim.port}/v1/models"
    with httpx.Client(verify=h2sim.ssl_context(), timeout=TIMEOUT) as c:
        assert c.get(url, headers=AUTH).status_code == 200
    ctx = ssl.create_default_context(cafile=h2sim.ca_pem_path)
    with httpx.Client(verify=ctx, timeout=TIMEOUT) as c:
        assert c.get(url, headers=AUTH).status_code == 200


def test_auth_required_and_request_ids(anysim: Simulator) -> None:
    with client(anysim) as c:
        for headers in (
            {"authorization": ""},
            {"authorization": "Bearer"},
            {"authorization": "Basic a"},
        ):
            r = c.post("/chat/completions", json=body(), headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert r.headers["x-request-id"].startswith("req_")
        ok = c.post("/chat/completions", json=body())
        other = c.get("/models")
        assert ok.headers["x-request-id"] != other.headers["x-request-id"]
        assert c.get("/nope").status_code == 404


def test_models_lists_known_and_requested_models(h2sim: Simulator) -> None:
    with client(h2sim) as c:
        c.post("/chat/completions", json=body(model="my-odd-model"))
        data = c.get("/models").json()
    assert data["object"] == "list"
    ids = [m["id"] for m in data["data"]]
    assert "sim-small" in ids and "my-odd-model" in ids


def test_last_requests_keep_headers_query_and_body(h2sim: Simulator) -> None:
    with client(h2sim) as c:
        c.post(
            "/chat/completions",
            params={"api-version": "2024-10"},
            headers={"x-extra": "yes"},
            json=body(extra_field={"a": 1}),
        )
    last = h2sim.last_requests[-1]
    assert last["path"] == "/v1/chat/completions" and last["method"] == "POST"
    assert last["headers"]["x-extra"] == "yes"
    assert last["headers"]["authorization"] == AUTH["authorization"]
    assert last["query"] == {"api-version": "2024-10"}
    assert last["json"]["extra_field"] == {"a": 1}
    assert last["http_version"] == "2"


def test_bad_requests_get_400(h2sim: Simulator) -> None:
    with client(h2sim) as c:
        assert c.post("/chat/completions", content=b"{nope").status_code == 400
        assert c.post("/chat/completions", json={"model": "m"}).status_code == 400
        assert c.post("/chat/completions", json=body(n=2)).status_code == 400
        r = c.post("/chat/completions", json=body(), headers={"x-sim-fault": "bogus"})
        assert r.status_code == 400


# -- wire format -------------------------------------------------------------------------------
def test_stream_format_with_usage(anysim: Simulator) -> None:
    payload = body(stream=True, stream_options={"include_usage": True})
    chunks = events(anysim, payload)
    assert chunks[-1] == "[DONE]"
    objs = chunks[:-1]
    assert len({c["id"] for c in objs}) == 1 and objs[0]["id"].startswith("chatcmpl-")
    for c in objs:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == "sim-small"
        assert isinstance(c["created"], int) and c["system_fingerprint"]
        assert "usage" in c
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = objs[1:-2]
    assert len(content) == 12  # one chunk per token
    assert all(c["usage"] is None and c["choices"][0]["finish_reason"] is None for c in content)
    final, usage = objs[-2], objs[-1]
    assert final["choices"][0]["finish_reason"] == "stop" and final["usage"] is None
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 12
    u = usage["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    words = text_of(objs).split(" ")
    assert len(words) == 12 and all(words)


def test_stream_without_usage_has_no_usage_key(h2sim: Simulator) -> None:
    chunks = events(h2sim, body(stream=True))
    assert all("usage" not in c for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_non_stream_matches_stream(anysim: Simulator) -> None:
    with client(anysim) as c:
        r = c.post("/chat/completions", json=body())
    data = r.json()
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == text_of(events(anysim, body(stream=True)))
    assert data["usage"]["completion_tokens"] == 12
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 12


def test_max_tokens_cuts_with_length(h2sim: Simulator) -> None:
    for key in ("max_tokens", "max_completion_tokens"):
        chunks = events(h2sim, body(stream=True, **{key: 5}))
        assert len(text_of(chunks).split(" ")) == 5
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_replies_are_deterministic(h2sim: Simulator) -> None:
    first = text_of(events(h2sim, body(stream=True)))
    assert text_of(events(h2sim, body(stream=True))) == first
    with Simulator(profile=Profile(reply_tokens=12), tls=False) as other:
        assert text_of(events(other, body(stream=True))) == first
    assert text_of(events(h2sim, body(stream=True, model="sim-large"))) != first
    other_msgs = [{"role": "user", "content": "Something else"}]
    assert text_of(events(h2sim, body(stream=True, messages=other_msgs))) != first


def test_assistant_prefix_is_continued(h2sim: Simulator) -> None:
    full = text_of(events(h2sim, body(stream=True)))
    for cut in (0, 3, len(full) // 2, len(full) - 1, len(full)):
        prefix = full[:cut]
        msgs = [*MESSAGES, {"role": "assistant", "content": prefix}]
        rest = text_of(events(h2sim, body(stream=True, messages=msgs)))
        assert prefix + rest == full
    msgs = [*MESSAGES, {"role": "assistant", "content": "not the reply at all"}]
    assert text_of(events(h2sim, body(stream=True, messages=msgs))) == full


def test_tool_call_stream(h2sim: Simulator) -> None:
    chunks = events(h2sim, body(stream=True, tools=TOOLS))[:-1]
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "assistant"
    call = first["tool_calls"][0]
    assert call["index"] == 0 and call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": ""}
    fragments = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:-1]]
    assert len(fragments) >= 3
    assert all(f["index"] == 0 and set(f) == {"index", "function"} for f in fragments)
    args = json.loads("".join(f["function"]["arguments"] for f in fragments))
    assert set(args) == {"city", "days", "unit"} and args["unit"] in ("c", "f")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    again = events(h2sim, body(stream=True, tools=TOOLS))[:-1]
    assert [c["choices"] for c in again] == [c["choices"] for c in chunks]


def test_tool_choice_named_none_and_non_stream(h2sim: Simulator) -> None:
    choice = {"type": "function", "function": {"name": "search"}}
    with client(h2sim) as c:
        data = c.post("/chat/completions", json=body(tools=TOOLS, tool_choice=choice)).json()
        calls = data["choices"][0]["message"]["tool_calls"]
        assert calls[0]["function"]["name"] == "search"
        assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict)
        assert data["choices"][0]["finish_reason"] == "tool_calls"
        data = c.post("/chat/completions", json=body(tools=TOOLS, tool_choice="none")).json()
        assert data["choices"][0]["message"]["content"]
        assert data["choices"][0]["finish_reason"] == "stop"


@pytest.mark.anyio
async def test_async_clients_on_asyncio_and_trio(h2sim: Simulator) -> None:
    async with httpx.AsyncClient(
        base_url=h2sim.base_url, headers=AUTH, http2=True, verify=h2sim.ssl_context()
    ) as c:
        with anyio.fail_after(30):  # a hang guard only
            r = await c.post("/chat/completions", json=body())
    assert r.http_version == "HTTP/2" and r.json()["choices"][0]["message"]["content"]


# -- faults ------------------------------------------------------------------------------------
def test_status_faults(anysim: Simulator) -> None:
    with client(anysim) as c:
        r = c.post("/chat/completions", json=body(), headers={"x-sim-fault": "429"})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["retry-after"] == "1" and r.headers["retry-after-ms"] == "1000"
        r = c.post(
            "/chat/completions",
            json=body(),
            headers={"x-sim-fault": "429", "x-sim-retry-after": "2.5"},
        )
        assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == ("3", "2500")
        r = c.post("/chat/completions", json=body(), headers={"x-sim-fault": "500"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        r = c.post("/chat/completions", json=body(stream=True), headers={"x-sim-fault": "503"})
        assert r.status_code == 503 and "retry-after" in r.headers
        r = c.post("/chat/completions", json=body(), headers={"x-sim-fault": "html502"})
        assert r.status_code == 502 and r.headers["content-type"].startswith("text/html")
        assert "<html>" in r.text


def test_faults_are_counted() -> None:
    with Simulator(tls=False) as sim, client(sim) as c:
        for fault in ("429", "429", "500", "slow:0"):
            c.post("/chat/completions", json=body(), headers={"x-sim-fault": fault})
        assert wait_for(lambda: sim.stats()["in_flight"] == 0)
        stats = sim.stats()
        assert stats["faults"] == {"429": 2, "500": 1, "slow": 1}
        assert stats["chat_requests"] == 4
        sim.reset_stats()
        assert sim.stats()["faults"] == {} and sim.stats()["requests"] == 0


def test_malformed_line(anysim: Simulator) -> None:
    with (
        client(anysim) as c,
        c.stream(
            "POST",
            "/chat/completions",
            json=body(stream=True),
            headers={"x-sim-fault": "malformed:2"},
        ) as r,
    ):
        lines = [line for line in r.iter_lines() if line]
    bad = lines.index("data: {not json")
    assert bad == 3  # role chunk, two tokens, then the bad line
    assert lines[-1] == "data: [DONE]"


def test_in_stream_error_event(anysim: Simulator) -> None:
    headers = {"x-sim-fault": "stream-error:4"}
    with (
        client(anysim) as c,
        c.stream("POST", "/chat/completions", json=body(stream=True), headers=headers) as r,
    ):
        lines = [line for line in r.iter_lines() if line]
    assert len(lines) == 1 + 4 + 1
    err = json.loads(lines[-1][6:])
    assert err["error"]["type"] == "server_error" and err["error"]["message"]
    with client(anysim) as c:
        r = c.post("/chat/completions", json=body(), headers=headers)
    assert r.status_code == 500


def test_slow_and_stall_between(pauses: list[float]) -> None:
    profile = Profile(ttft_median=0.01, inter_token=0.001, reply_tokens=6)
    with Simulator(profile=profile, tls=True, http2=True) as sim:
        chunks = events(sim, body(stream=True), **{"x-sim-fault": "slow:0.3"})
        assert pauses == [0.3] + [0.001] * 5  # the first token waits 0.3 s, not the TTFT
        content = [
            c for c in chunks[:-1] if c["choices"] and c["choices"][0]["delta"].get("content")
        ]
        assert len(content) == 6
        pauses.clear()
        events(sim, body(stream=True), **{"x-sim-fault": "stall-between:3:0.3"})
    # The TTFT, then a pause before each of tokens 2-6: the stall is between token 3 and 4.
    assert pauses == [0.01, 0.001, 0.001, 0.3, 0.001, 0.001]


def test_profile_latency(pauses: list[float]) -> None:
    profile = Profile(ttft_median=0.15, inter_token=0.02, reply_tokens=5)
    with Simulator(profile=profile, tls=False) as sim, client(sim) as c:
        with c.stream("POST", "/chat/completions", json=body(stream=True)) as r:
            tokens = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert len(tokens) >= 5
    assert pauses == [0.15, 0.02, 0.02, 0.02, 0.02]  # the TTFT, then one per later token


def test_profile_fault_rates_repeat_with_seed() -> None:
    def outcomes(seed: int) -> list[int]:
        profile = Profile(rate_429=0.3, rate_500=0.2, seed=seed)
        with Simulator(profile=profile, tls=False) as sim, client(sim) as c:
            return [c.post("/chat/completions", json=body()).status_code for _ in range(30)]

    first = outcomes(7)
    assert first == outcomes(7)
    assert {200, 429, 500} <= set(first)
    assert first != outcomes(8)


def test_drop_mid_stream_is_a_client_error(anysim: Simulator) -> None:
    """A dropped stream ends in an error (RST_STREAM on h2, a closed connection on h1)."""
    got: list[str] = []
    # A stream left hanging would end in a ReadTimeout after 60 s, not in this error.
    timeout = httpx.Timeout(5.0, read=60.0)
    with pytest.raises(httpx.RemoteProtocolError), client(anysim, timeout=timeout) as c:
        with c.stream(
            "POST", "/chat/completions", json=body(stream=True), headers={"x-sim-fault": "drop:3"}
        ) as r:
            got.extend(line for line in r.iter_lines() if line)
    assert len(got) == 1 + 3 and "[DONE]" not in got[-1]
    with client(anysim) as c:  # the server is fine afterwards
        assert c.post("/chat/completions", json=body()).status_code == 200


def test_drop_non_stream_is_a_client_error(anysim: Simulator) -> None:
    with client(anysim) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            c.post("/chat/completions", json=body(), headers={"x-sim-fault": "drop:1"})
        assert c.post("/chat/completions", json=body()).status_code == 200


def test_drop_resets_only_that_h2_stream(h2sim: Simulator) -> None:
    raw = RawH2(h2sim)
    try:
        sid = raw.post(body(stream=True), **{"x-sim-fault": "drop:2"})
        data, ev = raw.read_stream(
            sid,
            lambda e, _: isinstance(e, h2.events.StreamReset | h2.events.StreamEnded),
        )
        assert isinstance(ev, h2.events.StreamReset)
        assert ev.error_code == h2.errors.ErrorCodes.INTERNAL_ERROR
        assert data.count(b"data: ") == 3  # role chunk and two tokens got out first
        sid = raw.post(body())  # same connection, next stream
        data, ev = raw.read_stream(sid, lambda e, _: isinstance(e, h2.events.StreamEnded))
        assert json.loads(data)["object"] == "chat.completion"
    finally:
        raw.close()


def test_hang_never_sends_a_token_and_stop_is_quick() -> None:
    sim = Simulator().start()
    try:
        with client(sim, timeout=httpx.Timeout(5.0, read=0.3)) as c:
            with pytest.raises(httpx.ReadTimeout):
                with c.stream(
                    "POST",
                    "/chat/completions",
                    json=body(stream=True),
                    headers={"x-sim-fault": "hang"},
                ) as r:
                    assert r.status_code == 200
                    for _ in r.iter_lines():
                        pass
            assert sim.stats()["faults"] == {"hang": 1}
    finally:
        assert stop_ends_the_server(sim)  # not after the 300 s hang (hang_max)


def test_stop_while_streaming_ends_the_stream() -> None:
    # A 1000 s answer: a stop that waited for the stream would not end the server.
    sim = Simulator(profile=Profile(reply_tokens=100_000, inter_token=0.01)).start()
    ended: list[bool] = []
    stopper = threading.Thread(target=lambda: ended.append(stop_ends_the_server(sim)))
    try:
        with pytest.raises(httpx.RemoteProtocolError), client(sim) as c:
            with c.stream("POST", "/chat/completions", json=body(stream=True)) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i == 2:  # the stream is under way: stop the server now
                        stopper.start()
                    if ended:  # stop() returned and the stream goes on: it was not ended
                        break
    finally:
        if stopper.ident is not None:
            stopper.join(30)  # a hang guard only: stop() gives up after 10 s by itself
        sim.stop()
    assert ended == [True]
    assert sim.stats()["streams_completed"] == 0


def test_openai_sdk_reads_the_wire_format(h2sim: Simulator) -> None:
    openai = pytest.importorskip("openai")
    httpx2 = pytest.importorskip("httpx2")
    with httpx2.Client(verify=h2sim.ssl_context(), http2=True, timeout=5) as http:
        sdk = openai.OpenAI(
            base_url=h2sim.base_url, api_key="sk-sim", http_client=http, max_retries=0
        )
        stream = sdk.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-extra": "1"},
            extra_query={"q": "2"},
            extra_body={"b": 3},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
        last = h2sim.last_requests[-1]
        assert (last["headers"]["x-extra"], last["query"], last["json"]["b"]) == (
            "1",
            {"q": "2"},
            3,
        )
        with pytest.raises(openai.RateLimitError):
            sdk.chat.completions.create(
                model="sim-small", messages=MESSAGES, extra_headers={"x-sim-fault": "429"}
            )


# -- cancellation ------------------------------------------------------------------------------
def test_h2_rst_stream_is_seen_as_a_cancel() -> None:
    with Simulator(profile=Profile(reply_tokens=400, inter_token=0.02)) as sim:
        raw = RawH2(sim)
        try:
            sid = raw.post(body(stream=True))
            raw.read_stream(sid, lambda _, got: got.count(b"data: ") >= 3)
            assert sim.stats()["in_flight"] == 1
            raw.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            raw.flush()
            assert wait_for(lambda: sim.stats()["streams_cancelled"] == 1)
            assert wait_for(lambda: sim.stats()["in_flight"] == 0)
            assert sim.stats()["streams_completed"] == 0
            sid = raw.post(body(max_tokens=2))  # the connection stays usable
            data, _ = raw.read_stream(sid, lambda e, _: isinstance(e, h2.events.StreamEnded))
            assert json.loads(data)["usage"]["completion_tokens"] == 2
        finally:
            raw.close()


def test_h1_connection_close_is_seen_as_a_cancel() -> None:
    profile = Profile(reply_tokens=400, inter_token=0.02)
    with Simulator(profile=profile, tls=False) as sim, client(sim) as c:
        with c.stream("POST", "/chat/completions", json=body(stream=True)) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n > 4:
                    break
        assert wait_for(lambda: sim.stats()["streams_cancelled"] == 1)
        assert wait_for(lambda: sim.stats()["in_flight"] == 0)


def test_hang_cancel_is_counted_over_h1() -> None:
    with Simulator(tls=False) as sim:
        with (
            client(sim, timeout=httpx.Timeout(5.0, read=0.2)) as c,
            pytest.raises(httpx.ReadTimeout),
        ):
            c.post("/chat/completions", json=body(stream=True), headers={"x-sim-fault": "hang"})
        assert wait_for(lambda: sim.stats()["streams_cancelled"] == 1)


# -- stats and subprocess ----------------------------------------------------------------------
def test_stats_endpoint_and_counters() -> None:
    with Simulator() as sim, client(sim) as c:
        events(sim, body(stream=True))
        c.post("/chat/completions", json=body())
        assert wait_for(lambda: sim.stats()["in_flight"] == 0)
        stats = c.get(sim.base_url.removesuffix("/v1") + "/_sim/stats").json()
        assert stats == sim.stats()
        assert stats["chat_requests"] == 2
        assert stats["streams_started"] == stats["streams_completed"] == 1
        assert stats["streams_cancelled"] == 0 and stats["in_flight"] == 0
        assert set(stats) >= {"requests", "faults"}


def test_simulator_process() -> None:
    profile = Profile(reply_tokens=7)
    with SimulatorProcess(profile=profile) as proc:
        assert proc.base_url.startswith("https://127.0.0.1:") and proc.ca_pem_path
        with httpx.Client(
            base_url=proc.base_url,
            headers=AUTH,
            http2=True,
            verify=proc.ssl_context(),
            timeout=TIMEOUT,
        ) as c:
            r = c.post("/chat/completions", json=body())
            assert r.http_version == "HTTP/2"
            assert r.json()["usage"]["completion_tokens"] == 7
        assert proc.stats()["chat_requests"] == 1
        pid = proc.pid
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_every_simulator_of_a_run_has_one_ca() -> None:
    """A child process's simulator signs with its parent's CA (it made its own before), so the
    one file ``ca_pem_path()`` names trusts in-process and child simulators alike."""
    import ssl

    from llmroute.testing import ca_pem_path

    trust = ssl.create_default_context(cafile=ca_pem_path())
    with (
        Simulator() as here,
        SimulatorProcess() as child,
        SimulatorProcess(profile=Profile(reply_tokens=3)) as other,
    ):
        assert here.ca_pem_path == child.ca_pem_path == other.ca_pem_path == ca_pem_path()
        for server in (here, child, other):
            with httpx.Client(base_url=server.base_url, headers=AUTH, verify=trust) as c:
                assert c.post("/chat/completions", json=body()).status_code == 200


def test_held_streams_wait_for_their_first_token_until_released() -> None:
    profile = Profile(reply_tokens=5, hold_first_token=True, hang_max=60)
    with (
        SimulatorProcess(profile=profile) as proc,
        httpx.Client(
            base_url=proc.base_url, headers=AUTH, http2=True, verify=proc.ssl_context()
        ) as c,
    ):
        texts: list[str] = []

        def one() -> None:
            with c.stream("POST", "/chat/completions", json=body(stream=True)) as r:
                texts.append("".join(r.iter_text()))

        threads = [threading.Thread(target=one) for _ in range(3)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: proc.stats()["held"] == 3, timeout=30)
        assert proc.stats()["streams_completed"] == 0 and not texts
        assert proc.release() == 3
        for thread in threads:
            thread.join(30)
        stats = proc.stats()
        assert stats["streams_completed"] == 3 and stats["held"] == 0
        assert len(texts) == 3 and all(t.rstrip().endswith("data: [DONE]") for t in texts)
        # Later streams are held again until the next release.
        thread = threading.Thread(target=one)
        thread.start()
        assert wait_for(lambda: proc.stats()["held"] == 1, timeout=30)
        assert proc.release() == 1
        thread.join(30)
        assert len(texts) == 4


def test_ssl_context_is_a_client_context(h2sim: Simulator) -> None:
    ctx = h2sim.ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_a_profile_changes_mid_run() -> None:
    with Simulator(profile=Profile(reply_tokens=3), tls=True) as sim:
        root = sim.base_url.removesuffix("/v1")
        with httpx.Client(verify=sim.ssl_context()) as client:
            answer = client.post(f"{root}/_sim/profile", json={"ttft_median": 0.25})
            assert answer.status_code == 200
            assert sim.app.profile.ttft_median == 0.25
            assert sim.app.profile.reply_tokens == 3  # the other fields are kept
            answer = client.post(f"{root}/_sim/profile", json={"no_such_field": 1})
            assert answer.status_code == 400
            assert sim.app.profile.ttft_median == 0.25
