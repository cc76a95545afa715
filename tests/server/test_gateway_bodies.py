"""A ``/v1`` body's parse and checks: on the event loop for a small body, in a bounded worker
thread for a large one, with the same answer either way. Where the work ran is recorded (the
thread's id), never timed: a loaded machine cannot fail these tests. benchmarks/
gateway_loop_stall.py, which times the loop's stalls, runs once on small bodies."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

from llmroute import _upstream as upstream
from llmroute._call import Received
from llmroute._upstream import OFF_LOOP_BYTES as UPSTREAM_OFF_LOOP_BYTES
from llmroute.routing import engine, estimate, estimate_request, failover
from llmroute.server import LOOPS, Gateway
from llmroute.server import _checks as checks
from llmroute.server._checks import OFF_LOOP_BYTES, OFF_LOOP_THREADS
from llmroute.server._validate import check
from llmroute.testing import Simulator
from tests.reliability.gateway_kit import ENVIRON, KEYS, MESSAGES, config

DEADLINE = 10.0
CHAT = "/chat/completions"


@pytest.fixture(scope="module", params=LOOPS)
def gateway(sim: Simulator, request: pytest.FixtureRequest) -> Iterator[Gateway]:
    """A gateway on each event loop it runs on (asyncio's, uvloop's)."""
    cfg = config({"sim": sim})
    with Gateway(cfg, environ=ENVIRON, verify=sim.ssl_context(), loop=request.param) as gateway:
        yield gateway


def _on_loop_each(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, module: Any, name: str
) -> list[bool]:
    """For each call of ``module.name`` from now on: whether it ran on the gateway's loop."""
    loop_thread = gateway._thread
    assert loop_thread is not None
    seen: list[bool] = []
    original = getattr(module, name)

    def recorded(*args: Any) -> Any:
        seen.append(threading.get_ident() == loop_thread.ident)
        return original(*args)

    monkeypatch.setattr(module, name, recorded)
    return seen


@pytest.fixture
def parses(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each body parsed from now on: whether it was parsed on the gateway's event loop."""
    return _on_loop_each(gateway, monkeypatch, checks, "parse_json")


@pytest.fixture
def encodes(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each attempt's body encoded from now on: whether on the gateway's event loop."""
    return _on_loop_each(gateway, monkeypatch, upstream, "encode_body")


def _post(gateway: Gateway, content: bytes, path: str = CHAT) -> httpx.Response:
    with httpx.Client(timeout=DEADLINE) as client:
        return client.post(
            gateway.base_url + path,
            content=content,
            headers={"authorization": f"Bearer {KEYS['alpha']}"},
        )


def _chat(parts: int) -> dict[str, Any]:
    """A chat request of ``parts`` content parts (about 32 bytes each)."""
    content = [{"type": "text", "text": "a"}] * parts
    return {"model": "sim", "messages": [{"role": "user", "content": content}]}


def test_a_large_body_is_parsed_and_checked_off_the_event_loop(
    gateway: Gateway, parses: list[bool]
) -> None:
    """The parse and the checks are linear passes over the body: on the loop, a 4 MiB chat
    body of 130,000 content parts held every other key's stream about 0.4 s. A small body
    stays on the loop (a thread's hand-off would cost it more than its parse)."""
    large = json.dumps(_chat(2 * OFF_LOOP_BYTES // 32)).encode()
    small = json.dumps({"model": "sim", "messages": MESSAGES}).encode()
    assert len(large) >= OFF_LOOP_BYTES > len(small)
    for content in (large, small):
        reply = _post(gateway, content)
        assert reply.status_code == 200, reply.text[:300]
    assert parses == [False, True]


def test_a_large_body_is_encoded_for_its_target_off_the_event_loop(
    gateway: Gateway, encodes: list[bool]
) -> None:
    """The JSON sent upstream is encoded once per attempt: for a 4 MiB body about 50 ms of
    CPU, which on the loop every other key's stream waited for. A large body's is encoded in
    a worker thread (the SDK's, a routed call's ``body_bytes``), a small one's on the loop."""
    large = json.dumps(_chat(2 * UPSTREAM_OFF_LOOP_BYTES // 32)).encode()
    small = json.dumps({"model": "sim", "messages": MESSAGES}).encode()
    assert len(large) >= UPSTREAM_OFF_LOOP_BYTES > len(small)
    for content in (large, small):
        reply = _post(gateway, content)
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["choices"][0]["message"]["content"]
    assert encodes == [False, True]


@pytest.mark.parametrize(
    ("path", "field", "item"),
    [("/completions", "prompt", [1] * 20), ("/embeddings", "input", "forty bytes of text " * 2)],
)
def test_a_large_completion_or_embedding_is_encoded_off_the_loop_and_counted_once(
    gateway: Gateway,
    encodes: list[bool],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    field: str,
    item: object,
) -> None:
    """A legacy completion or an embedding goes through openai's ``post()``, which has no
    argument for the body's size: the gateway notes it for that body (``RECEIVED``), so a
    large one is encoded off the loop too, and its prompt counted once, where it was parsed."""
    counted: list[int] = []
    for module in (checks, failover):
        original = module.prompt_tokens

        def counting(body: Any, kind: str, original: Callable[..., int] = original) -> int:
            counted.append(tokens := original(body, kind))
            return tokens

        monkeypatch.setattr(module, "prompt_tokens", counting)
    large = json.dumps({"model": "sim", field: [item] * 2000}).encode()  # at most 2,048 inputs
    small = json.dumps({"model": "sim", field: [item] * 3}).encode()
    assert len(large) >= UPSTREAM_OFF_LOOP_BYTES > len(small)
    for content in (large, small):
        reply = _post(gateway, content, path)
        assert reply.status_code == 200, reply.text[:300]
    assert encodes == [False, True]
    assert len(counted) == 2  # once a body


def test_a_server_s_note_of_a_body_is_taken_by_that_body_s_call_only() -> None:
    """openai copies a posted body's dict, not its values: the note matches that copy, and
    neither another body nor one holding an equal copy of a value."""
    body = {"model": "sim", "input": ["a"] * 3}
    note = Received(body, 100_000, 3)
    assert note.of(dict(body))
    assert not note.of({**body, "user": "u"})
    assert not note.of({"model": "sim"})
    assert not note.of({"model": "sim", "input": list(body["input"])})  # equal, not the same
    assert not note.of(None)


def test_a_prompt_is_counted_once_for_the_key_s_limits_and_the_routing(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting a prompt's tokens is another pass over the body: it is counted where the body
    was parsed (in a worker thread for a large one), and that count serves the key's token
    limit and the routing, which each counted it again on the event loop before."""
    large = json.dumps(_chat(2 * OFF_LOOP_BYTES // 32)).encode()
    expected = estimate_request(json.loads(large)).prompt_tokens
    counted: list[int] = []
    for module in (estimate, engine):
        original = module.estimate_prompt_tokens

        def counting(messages: Any, original: Callable[[Any], int] = original) -> int:
            counted.append(tokens := original(messages))
            return tokens

        monkeypatch.setattr(module, "estimate_prompt_tokens", counting)
    cfg = config({"sim": sim}, tenants={"alpha": {"tpm": 10**8}})
    with Gateway(cfg, environ=ENVIRON, verify=sim.ssl_context()) as gateway:
        reply = _post(gateway, large)
    assert reply.status_code == 200, reply.text[:300]
    assert counted == [expected]


_BAD = [  # (body, param or None, the start of the message)
    (b"{not json", None, "The request body is not valid JSON."),
    (b"[1, 2]", None, "The request body must be a JSON object."),
    (b"[" * 100_000 + b"]" * 100_000, None, "The request body is nested too deeply."),
    (b'{"model": "sim", "messages": []}', "messages", "Invalid 'messages': empty array."),
    (b'{"messages": []}', "model", "Missing required parameter: 'model'."),
    (b'{"model": "sim"}', "messages", "Missing required parameter: 'messages'."),
    (b'{"model": "sim", "temperature": NaN, "messages": []}', "temperature", "Invalid"),
    (b'{"model": "\\ud800", "messages": [{"role": "user"}]}', "model", "Invalid 'model'"),
    (
        json.dumps(
            {"model": "sim", "messages": [*[{"role": "user", "content": "a"}] * 5000, {}]}
        ).encode(),
        "messages[5000].role",
        "Missing required parameter: 'messages[5000].role'.",
    ),
    (
        json.dumps({"model": "sim", "messages": [{"role": "user", "content": ["a"] * 3}]}).encode(),
        "messages[0].content[0]",
        "Invalid type for 'messages[0].content[0]'",
    ),
    (json.dumps({**_chat(3), "temperature": 3}).encode(), "temperature", "Invalid"),
]


@pytest.mark.parametrize(("content", "param", "message"), _BAD)
def test_a_bad_body_gets_the_same_400_off_the_loop_as_on_it(
    gateway: Gateway, parses: list[bool], content: bytes, param: str | None, message: str
) -> None:
    answers = []
    for off_loop_bytes in (len(content) + 1, 0):  # on the loop, then in a worker thread
        gateway.app.bodies.off_loop_bytes = off_loop_bytes
        try:
            reply = _post(gateway, content)
        finally:
            gateway.app.bodies.off_loop_bytes = OFF_LOOP_BYTES
        answers.append((reply.status_code, reply.json()))
    assert parses == [True, False]
    assert answers[0] == answers[1]
    status, body = answers[0]
    assert status == 400, body
    error = body["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert error["message"].startswith(message), error["message"]


def test_large_bodies_take_at_most_a_few_worker_threads(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many large bodies at once wait for one of the checks' threads: they cannot take every
    worker thread of the loop (anyio's 40) from the other work that needs one."""
    release = threading.Event()
    running = 0
    lock = threading.Lock()
    parse = checks.parse_json

    def held(data: bytes, reject: Any) -> dict[str, Any]:
        nonlocal running
        with lock:
            running += 1
        release.wait(DEADLINE)
        return parse(data, reject)

    monkeypatch.setattr(checks, "parse_json", held)
    content = json.dumps(_chat(2 * OFF_LOOP_BYTES // 32)).encode()
    limiter = gateway.app.bodies.limiter
    waiting = OFF_LOOP_THREADS + 2
    with ThreadPoolExecutor(waiting) as pool:
        replies = [pool.submit(_post, gateway, content) for _ in range(waiting)]
        try:
            for _ in range(int(DEADLINE / 0.01)):  # bounded: until every body is in
                if limiter.statistics().tasks_waiting == waiting - OFF_LOOP_THREADS:
                    break
                time.sleep(0.01)
            stats = limiter.statistics()
            assert (stats.borrowed_tokens, stats.tasks_waiting) == (OFF_LOOP_THREADS, 2)
            assert running == OFF_LOOP_THREADS
        finally:
            release.set()
        statuses = [reply.result().status_code for reply in replies]
    assert statuses == [200] * waiting
    assert running == waiting


def _python_calls(work: Callable[[], object]) -> int:
    """The Python functions ``work()`` calls (itself not counted), whatever the machine's load."""
    calls = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls - 1


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "text", "text": "a"}] * 10_000}],
        [{"role": "user", "content": "hi", "name": "n"}] * 10_000,
    ],
)
def test_the_checks_of_a_valid_chat_body_call_nothing_per_message_or_part(
    messages: list[dict[str, Any]],
) -> None:
    """A field's name (``messages[7].content[3]``) is built only for a field at fault: built
    for each, with a call per part, the checks of 130,000 parts took 33 ms of CPU (3 ms now)."""
    body = {"model": "sim", "messages": messages}
    assert _python_calls(lambda: check("chat", body)) < 20
    bad = {"model": "sim", "messages": [*messages, {"role": "user", "content": [1]}]}
    with pytest.raises(ValueError, match=r"messages\[\d+\]\.content\[0\]"):
        check("chat", bad)


def test_the_loop_stall_benchmark_measures_every_body() -> None:
    """benchmarks/gateway_loop_stall.py on small bodies: each answered, its stall measured."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gateway_loop_stall.py"
    spec = importlib.util.spec_from_file_location("gateway_loop_stall", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.measure(reps=1, scale=0.01)
    assert list(result) == list(bench.bodies())
    assert all(r["bytes"] > 0 and r["cpu_ms"] >= 0 and r["wall_s"] > 0 for r in result.values())
    assert "| chat, 130,000 parts |" in bench._table({"this": result})
