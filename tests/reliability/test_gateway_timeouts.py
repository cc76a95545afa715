"""Item 3 of the gateway's hardening: a slow client holds nothing for long.

A body trickling in is cut with 408 after ``body_timeout`` and never holds its key's slot; an
idle connection, or one whose request headers never end, is closed after ``idle_timeout``; a
TLS handshake that never ends, after ``handshake_timeout``; a client that stops reading is cut
after ``write_timeout`` and its upstream stream cancelled. Assertions count what happened, never
how long it took.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

import llmroute.server._run as gateway_run
from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator
from tests.reliability.gateway_kit import (
    DEADLINE,
    ENVIRON,
    KEYS,
    MESSAGES,
    config,
    tls_gateway,
)


@pytest.fixture(scope="module")
def big() -> Iterator[Simulator]:
    """Answers of about 4 MB, as fast as they are taken."""
    with Simulator(profile=Profile(reply_tokens=16_000, inter_token=0), tls=False) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(sim: Simulator, big: Simulator) -> Iterator[Gateway]:
    cfg = config(
        {"sim": sim, "big": big},
        body_timeout="1s",
        idle_timeout="0.5s",
        write_timeout="0.5s",
        max_concurrency_per_key=1,
    )
    with Gateway(cfg, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as gateway:
        yield gateway


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (reads until EOF, bounded)."""
    sock.settimeout(DEADLINE)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def _wait(predicate: object, seconds: float = DEADLINE) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_trickling_body_is_cut_and_holds_no_slot(gateway: Gateway) -> None:
    # 400 bytes at one per 50 ms would take 20 s; body_timeout is 1 s.
    content = "a body that trickles in, " * 14
    body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": content}]})
    body = body.encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=DEADLINE) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            + f"authorization: Bearer {KEYS['alpha']}\r\n".encode()
            + f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body[:1]
        )
        # The key's only slot (max_concurrency_per_key = 1) is free meanwhile.
        with httpx.Client(timeout=DEADLINE) as client:
            reply = client.post(
                gateway.base_url + "/chat/completions",
                json={"model": "sim", "messages": MESSAGES},
                headers={"authorization": f"Bearer {KEYS['alpha']}"},
            )
        assert reply.status_code == 200
        sent = 1
        while sent < len(body) - 1:  # one byte every 50 ms, until the gateway answers
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                break
            sock.sendall(body[sent : sent + 1])
            sent += 1
        answer = sock.recv(65536)
        for _ in range(20):  # the headers and the chunked body may arrive in separate reads
            if b'"request_timeout"' in answer:
                break
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    assert sent < len(body) - 1
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"request_timeout"' in answer


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"])
def test_idle_connections_and_unfinished_headers_are_closed(gateway: Gateway, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=DEADLINE) as sock:
        sock.sendall(sent)
        assert _closed_by_server(sock)


def test_a_tls_handshake_that_never_ends_is_closed(
    sim: Simulator, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cfg = config({"sim": sim}, handshake_timeout="0.5s")
    with (
        tls_gateway(cfg, tmp_path_factory.mktemp("tls"), verify=sim.ssl_context()) as gateway,
        socket.create_connection(("127.0.0.1", gateway.port), timeout=DEADLINE) as sock,
    ):
        assert _closed_by_server(sock)  # no ClientHello ever sent


@pytest.fixture(scope="module")
def steady() -> Iterator[Simulator]:
    """20,000 tokens 1 ms apart: an answer that cannot end before a stalled client is cut."""
    with Simulator(profile=Profile(reply_tokens=20_000, inter_token=0.001), tls=False) as server:
        yield server


@pytest.fixture(scope="module")
def tight(steady: Simulator) -> Iterator[Gateway]:
    """A gateway whose sockets have small kernel send buffers (accepted sockets inherit the
    listener's), so a client that stops reading blocks its writes within ~100 KB rather than
    after the megabytes loopback autotuning would buffer."""

    def listen(host: str, port: int) -> socket.socket:
        sock = socket.create_server((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)
        return sock

    cfg = config({"steady": steady}, write_timeout="0.5s")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gateway_run, "listen", listen)
        gateway = Gateway(cfg, environ=ENVIRON, max_retries=0).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def test_a_client_that_stops_reading_is_cut_and_its_upstream_cancelled(
    tight: Gateway, steady: Simulator
) -> None:
    gateway, big = tight, steady
    _wait(lambda: big.stats()["in_flight"] == 0)
    cancelled = big.stats()["streams_cancelled"]
    body = json.dumps({"model": "steady", "stream": True, "messages": MESSAGES}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.settimeout(DEADLINE)
        sock.connect(("127.0.0.1", gateway.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            + f"authorization: Bearer {KEYS['beta']}\r\n".encode()
            + f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # Never read: the gateway's writes block, and write_timeout cuts the response.
        assert _wait(lambda: big.stats()["streams_cancelled"] == cancelled + 1)
        assert big.stats()["streams_completed"] == 0
        registry = gateway.app.metrics.registry

        def stalled() -> float | None:
            return registry.get_sample_value(
                "llmroute_gateway_rejections_total", {"key": "beta", "reason": "write_timeout"}
            )

        def in_flight() -> float | None:
            return registry.get_sample_value("llmroute_gateway_in_flight", {"key": "beta"})

        # The gateway counts the cut, closes the upstream stream (the simulator counts that
        # cancel on its own thread) and only then leaves the key's slot: wait for each event.
        assert _wait(lambda: stalled() == 1), stalled()
        assert _wait(lambda: in_flight() == 0), in_flight()
        assert stalled() == 1  # counted once
        assert _closed_by_server(sock)
    finally:
        sock.close()
