"""HTTP/2 back-pressure of the gateway (hypercorn 0.18's StreamBuffer, fixed in server/_h2.py).

A raw ``h2`` client that stops acknowledging DATA must stop the gateway: the bytes it takes from
the upstream and hands to hypercorn stay bounded, and the stream completes once the client reads.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from hypercorn.asyncio.worker_context import EventWrapper
from hypercorn.protocol.h2 import BUFFER_HIGH_WATER

from llmroute.server import Gateway
from llmroute.server._exchange import Exchange
from llmroute.server._h2 import BoundedStreamBuffer
from llmroute.testing import Profile, Simulator

GW_KEY = "gw-h2-key-0123456789abcdef"
BOUND = 2**20  # bytes the gateway may hold for a stalled client (it holds ~100 KB)
DEADLINE = 30.0  # seconds any bounded wait may take: a hang guard (5 s failed with two CPU burners)


@pytest.fixture(scope="module")
def big() -> Iterator[Simulator]:
    """Answers of about 4 MB, as fast as the gateway takes them."""
    with Simulator(profile=Profile(reply_tokens=16_000, inter_token=0), tls=False) as server:
        yield server


def _events(sock: socket.socket, conn: h2.connection.H2Connection) -> list[h2.events.Event]:
    data = sock.recv(65536)
    if not data:
        raise ConnectionError("the gateway closed the connection")
    events = conn.receive_data(data)
    out = conn.data_to_send()
    if out:
        sock.sendall(out)
    return events


def test_a_stalled_http2_client_holds_the_gateway_back(
    big: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = [0]  # bytes of answer the gateway handed to hypercorn (sent or buffered)
    body = Exchange.body
    chunk = Exchange.chunk

    async def counting(self: Any, data: bytes, *, more: bool = False) -> None:
        handed[0] += len(data)
        await body(self, data, more=more)

    async def counting_chunk(self: Any, data: bytes) -> None:
        handed[0] += len(data)
        await chunk(self, data)

    monkeypatch.setattr(Exchange, "body", counting)
    monkeypatch.setattr(Exchange, "chunk", counting_chunk)
    config = {
        "providers": {"big": {"base_url": big.base_url, "api_key": "sk-upstream-h2-test"}},
        "models": {"chat": {"targets": ["big:sim-small"]}},
        "routing": {"explore": 0},
        "gateway": {"keys": {"ci": "GW"}},
    }
    with (
        Gateway(config, environ={"GW": GW_KEY}, max_retries=0) as gateway,
        socket.create_connection(("127.0.0.1", gateway.port), timeout=DEADLINE) as sock,
    ):
        # h2c with prior knowledge; the client's windows stay at 65,535 bytes until it reads.
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        request = json.dumps(
            {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        conn.send_headers(
            1,
            [
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":scheme", "http"),
                (":authority", "127.0.0.1"),
                ("authorization", f"Bearer {GW_KEY}"),
                ("content-type", "application/json"),
            ],
        )
        conn.send_data(1, request, end_stream=True)
        sock.sendall(conn.data_to_send())

        # Take DATA until the stream's window is used up, acknowledging none of it.
        received = bytearray()
        status = None
        deadline = time.monotonic() + DEADLINE
        while len(received) < 65_535 and time.monotonic() < deadline:
            for event in _events(sock, conn):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers).get(b":status")
                elif isinstance(event, h2.events.DataReceived):
                    received += event.data
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    pytest.fail(f"the stream ended while the client stalled: {event}")
        assert status == b"200"
        assert len(received) == 65_535  # the client's window, all the server may send

        # Stalled: the gateway must stop taking the answer from the upstream (before the fix
        # it buffered all of it, ~4 MB, within a second).
        stalled_until = time.monotonic() + 1.0
        while time.monotonic() < stalled_until and handed[0] < BOUND:
            time.sleep(0.05)
        assert handed[0] < BOUND

        # Reading again (acknowledging every DATA frame) completes the stream.
        ended = False
        deadline = time.monotonic() + DEADLINE
        conn.acknowledge_received_data(len(received), 1)
        conn.increment_flow_control_window(16 * 2**20)
        conn.increment_flow_control_window(16 * 2**20, stream_id=1)
        sock.sendall(conn.data_to_send())
        while not ended and time.monotonic() < deadline:
            for event in _events(sock, conn):
                if isinstance(event, h2.events.DataReceived):
                    received += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
                elif isinstance(event, h2.events.StreamReset):
                    pytest.fail(f"the stream was reset: {event}")
            out = conn.data_to_send()
            if out:
                sock.sendall(out)
        assert ended
        assert received.rstrip().endswith(b"data: [DONE]")
        assert len(received) > 2**20 * 2  # the whole answer, a few MB
        assert handed[0] == len(received)


def test_the_bounded_buffer_holds_its_writer_until_it_drains() -> None:
    """The two bugs of hypercorn 0.18.0's StreamBuffer: ``pop(0)`` (a zero flow-control window)
    released the writer, and the writer waited once only, however full the buffer."""

    async def main() -> None:
        buffer = BoundedStreamBuffer(EventWrapper)
        chunk = b"x" * BUFFER_HIGH_WATER
        writer = asyncio.ensure_future(buffer.push(chunk))
        await asyncio.sleep(0.01)
        assert not writer.done()  # full: the writer waits
        assert await buffer.pop(0) == b""  # a zero window: nothing sent
        await asyncio.sleep(0.01)
        assert not writer.done()  # still full: still waiting
        await buffer.pop(1000)  # a small window: still above the low-water mark
        await asyncio.sleep(0.01)
        assert not writer.done()
        await buffer.pop(BUFFER_HIGH_WATER)  # drained
        await asyncio.wait_for(writer, DEADLINE)
        # An event left set by an earlier pop must not let a full buffer's writer through.
        await buffer.pop(0)
        writer = asyncio.ensure_future(buffer.push(chunk + chunk))
        await asyncio.sleep(0.01)
        assert not writer.done()
        await buffer.close()  # a closed stream releases the writer
        await asyncio.wait_for(writer, DEADLINE)

    asyncio.run(main())


def test_the_gateway_s_send_order_takes_ready_streams_in_turn() -> None:
    """The gateway's stand-in for hypercorn's priority tree: the same calls and errors."""
    from priority.priority import (
        DeadlockError,
        DuplicateStreamError,
        MissingStreamError,
        TooManyStreamsError,
    )

    from llmroute.server._h2 import _ReadyStreams  # pyright: ignore[reportPrivateUsage]

    ready = _ReadyStreams()
    with pytest.raises(DeadlockError):
        next(ready)
    for stream_id in (1, 3, 5):
        ready.insert_stream(stream_id)
        ready.block(stream_id)  # as hypercorn does for a new stream: no data yet
    with pytest.raises(DeadlockError):
        next(ready)
    ready.unblock(3)
    ready.unblock(1)
    assert [next(ready) for _ in range(4)] == [3, 1, 3, 1]  # in turn, in the order they came
    ready.block(3)
    assert [next(ready) for _ in range(2)] == [1, 1]
    ready.reprioritize(5, depends_on=1, weight=200)  # accepted, not kept
    ready.remove_stream(1)
    with pytest.raises(DeadlockError):
        next(ready)
    with pytest.raises(MissingStreamError):
        ready.unblock(1)
    with pytest.raises(DuplicateStreamError):
        ready.insert_stream(5)
    for stream_id in range(7, 7 + 2 * 998, 2):
        ready.insert_stream(stream_id)
    with pytest.raises(TooManyStreamsError):  # 1,000 known at once, as priority's tree
        ready.insert_stream(9999)
