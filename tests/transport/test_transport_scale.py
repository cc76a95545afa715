"""The HTTP/2 transport with many streams on one connection: work counted, never timed.

Thousands of streams share a handful of connections under load (benchmarks/load.py); what each
new stream or each read costs must not grow with the streams beside it, and streams that each
read a little must not, between them, hold the connection's whole flow-control window.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import h2.connection
import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

import llmroute
from llmroute.transport import _h2, _h2_stream

from ..conftest import KEY
from ..h2script import ScriptedServer, ScriptedStream, client_context, sse_chunk

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


class Barrier:
    """Every handler waits here until ``count`` of them have arrived (on the server's loop)."""

    def __init__(self, count: int, bound: float = 20.0) -> None:
        self.count = count
        self.bound = bound
        self.arrived = 0
        self.gave_up = 0
        """Handlers that went on after ``bound`` seconds without the others all there."""
        self.event: asyncio.Event | None = None

    async def wait(self) -> None:
        self.event = self.event or asyncio.Event()
        self.arrived += 1
        if self.arrived == self.count:
            self.event.set()
        try:
            async with asyncio.timeout(self.bound):
                await self.event.wait()
        except TimeoutError:
            self.gave_up += 1


async def send_when_window(stream: ScriptedStream, data: bytes) -> bool:
    """Send ``data`` on ``stream`` once the client's windows let it go whole (20 s at most)."""
    for _ in range(4000):
        conn = stream.conn
        if conn.local_flow_control_window(stream.stream_id) >= len(data):
            stream.send(data)
            return True
        await asyncio.sleep(0.005)
    return False


def client_for(server: ScriptedServer) -> llmroute.AsyncOpenAI:
    return llmroute.AsyncOpenAI(
        api_key=KEY,
        base_url=server.base_url,
        verify=client_context(),
        max_retries=0,
        timeout=httpx.Timeout(30.0),
    )


def answer(stream: ScriptedStream, text: str) -> None:
    """The whole answer ``text`` in one chunk, then [DONE]."""
    stream.respond()
    stream.send(sse_chunk(text, finish="stop"))
    stream.send(b"data: [DONE]\n\n", end=True)


async def read_all(
    client: llmroute.AsyncOpenAI,
    streams: int,
    messages: list[ChatCompletionMessageParam] = MESSAGES,
    guard: float = 60,
) -> list[str]:
    """``streams`` streamed asks at once, each read to its end: their texts.

    ``guard`` is a hang guard only, far above the seconds the streams take."""
    texts: list[str] = []

    async def one() -> None:
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
        texts.append("".join([c.choices[0].delta.content or "" async for c in stream]))

    with anyio.fail_after(guard):
        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
    return texts


async def test_many_short_streams_cannot_hold_the_connection_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 64 streams each read 6 KB (below the 16 KB a stream reads before returning its window)
    # and then need more: 384 KB against a 256 KB connection window. Returned only per stream
    # or at a stream's close, the window ran out with every stream open and waiting: the
    # server could send nothing more, a deadlock (as 2,000 streams of 8.1 KB on one connection
    # with a 16 MiB window were close to).
    monkeypatch.setattr(_h2, "_CONNECTION_WINDOW", 256 * 1024)
    streams = 64
    first = b"".join(sse_chunk("x" * 100) for _ in range(25))
    assert len(first) * streams > 256 * 1024 and len(first) < _h2_stream._ACK_BATCH
    barrier = Barrier(streams)
    sent: dict[str, int] = {"first": 0}

    async def handler(stream: ScriptedStream) -> None:
        stream.respond()
        if not await send_when_window(stream, first):
            return  # the client kept the window: no end, the client's read times out
        sent["first"] += 1
        await barrier.wait()
        stream.send(sse_chunk("!", finish="stop"))
        stream.send(b"data: [DONE]\n\n", end=True)

    with ScriptedServer(handler, max_concurrent_streams=1000) as server:
        async with client_for(server) as client:
            texts = await read_all(client, streams)
            conns = client._llmroute.transport.connections()
            # All on one connection, every byte read given back once the streams closed.
            assert len(conns) == 1
            window = conns[0]._receive_window
            assert window.unacked_bytes == 0 and not window.unacked
    assert sent["first"] == streams and barrier.gave_up == 0
    assert texts == ["x" * 2500 + "!"] * streams


async def test_opening_a_stream_does_not_walk_the_streams_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # h2 counts a connection's open streams at every new stream by walking all it holds: with
    # n streams open at once that is n^2 / 2 steps (20,000 here, 50 million for 10,000).
    walked = {"streams": 0}
    real = h2.connection.H2Connection._open_streams

    def counting(self: Any, remainder: int) -> int:
        if self.config.client_side:  # the scripted server (same process) counts its own
            walked["streams"] += len(self.streams)
        return real(self, remainder)

    monkeypatch.setattr(h2.connection.H2Connection, "_open_streams", counting)
    streams = 200
    barrier = Barrier(streams)

    async def handler(stream: ScriptedStream) -> None:
        await barrier.wait()  # every stream is open at once before any answer
        answer(stream, "ok")

    with ScriptedServer(handler, max_concurrent_streams=1000) as server:
        async with client_for(server) as client:
            texts = await read_all(client, streams)
            conns = client._llmroute.transport.connections()
            assert len(conns) == 1
            # Closed streams are dropped as they close: h2 holds none of them afterwards.
            assert len(conns[0]._h2.streams) == 0
    assert barrier.arrived == streams and barrier.gave_up == 0  # all open at once
    assert texts == ["ok"] * streams
    assert walked["streams"] <= streams  # at most a step per stream, not one per pair


async def test_request_bodies_wait_for_the_servers_window_without_losing_a_wakeup() -> None:
    # 250 bodies of 1.6 KB against the server's 64 KB connection window: senders wait for its
    # WINDOW_UPDATEs again and again. An update that came while a sender flushed, before it
    # waited, was lost: with a server that answers only once it has every body, nothing else
    # came to wake it (10,000 streams in benchmarks/load.py stalled with 2,611 bodies unsent).
    streams = 250  # one connection (256 streams at most)
    # No answer before every body is in (a lost sender then fails on its 30 s write timeout).
    barrier = Barrier(streams, bound=90)

    async def handler(stream: ScriptedStream) -> None:
        await barrier.wait()
        answer(stream, "ok")

    long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 1600}]
    with ScriptedServer(handler, max_concurrent_streams=1000) as server:
        async with client_for(server) as client:
            texts = await read_all(client, streams, long, guard=120)  # about a second
            assert len(client._llmroute.transport.connections()) == 1
    assert barrier.arrived == streams and barrier.gave_up == 0
    assert texts == ["ok"] * streams
