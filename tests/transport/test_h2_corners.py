"""HTTP/2 corners that real servers produce, driven by a scripted h2 server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import httpx
import openai
import pytest
from h2.errors import ErrorCodes

import llmroute
from llmroute.testing import Simulator

from ..conftest import KEY
from ..h2script import ScriptedServer, ScriptedStream, client_context, sse_chunk

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]
WORDS = [f"w{i} " for i in range(10)]


def client_for(server: ScriptedServer, **kwargs: object) -> llmroute.AsyncOpenAI:
    kwargs.setdefault("max_retries", 0)
    return llmroute.AsyncOpenAI(
        api_key=KEY, base_url=server.base_url, verify=client_context(), **kwargs
    )


async def stream_words(stream: ScriptedStream, *, goaway_at: int | None = None) -> None:
    stream.respond()
    for i, word in enumerate(WORDS):
        if i == goaway_at:
            stream.goaway(last_stream_id=stream.stream_id)
        stream.send(sse_chunk(word, finish="stop" if i == len(WORDS) - 1 else None))
        await asyncio.sleep(0.01)
    stream.send(b"data: [DONE]\n\n", end=True)


async def read_text(client: llmroute.AsyncOpenAI) -> str:
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with anyio.fail_after(10):
        return "".join([c.choices[0].delta.content or "" async for c in stream])


async def test_graceful_goaway_lets_the_stream_in_flight_finish() -> None:
    async def handler(stream: ScriptedStream) -> None:
        await stream_words(stream, goaway_at=3)

    with ScriptedServer(handler) as server:
        async with client_for(server) as client:
            assert await read_text(client) == "".join(WORDS)
            # The connection said goodbye: the next request opens a new one and succeeds.
            assert await read_text(client) == "".join(WORDS)
        assert server.connections == 2


async def test_answer_before_the_whole_upload_is_read() -> None:
    """A 401 with END_STREAM, then RST_STREAM(NO_ERROR), while a big body is still going out."""

    async def handler(stream: ScriptedStream) -> None:
        await asyncio.sleep(0.05)
        body = json.dumps({"error": {"message": "bad key", "type": "invalid_request_error"}})
        stream.respond(401, b"application/json")
        stream.send(body.encode(), end=True)
        stream.conn.reset_stream(stream.stream_id, ErrorCodes.NO_ERROR)
        stream.flush()

    big = "word " * 300_000  # far beyond the server's 64 KiB stream window
    with ScriptedServer(handler, early=True) as server:
        async with client_for(server, timeout=httpx.Timeout(30.0)) as client:
            # The answer, not the 30 s write timeout (that would be an APITimeoutError).
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": big}]
                )


async def test_pool_limit_holds_under_a_burst() -> None:
    async def handler(stream: ScriptedStream) -> None:
        await asyncio.sleep(0.05)
        await stream_words(stream)

    with ScriptedServer(handler, max_concurrent_streams=5) as server:
        transport = llmroute.transport.Transport(verify=client_context(), max_connections=2)
        http_client = httpx.AsyncClient(transport=transport)
        async with llmroute.AsyncOpenAI(
            api_key=KEY, base_url=server.base_url, http_client=http_client, max_retries=0
        ) as client:
            texts: list[str] = []

            async def one() -> None:
                texts.append(await read_text(client))

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(one)
        await http_client.aclose()
        assert texts == ["".join(WORDS)] * 30
        assert server.connections == 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Tag", "a\r\nb"),
        ("X-Tag", "a\nb"),
        ("X-Tag", "a\rb"),
        ("X-Tag", "a\x00b"),
        ("X-Tag", " a"),
        ("X-Tag", "a\t"),
        ("X Tag", "a"),
        ("X-Tag:", "a"),
        ("TE", "gzip"),
    ],
)
async def test_bad_header_value_fails_alone(sim: Simulator, name: str, value: str) -> None:
    """CR/LF in a header would make the server end the connection, with every stream on it:
    such a header is refused before anything is sent (h2's own outbound checks are off)."""
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), max_retries=0
    ) as client:
        other = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, extra_headers={name: value}
            )
        assert isinstance(info.value.__cause__, httpx.LocalProtocolError)
        assert f"invalid http header {name.lower()!r}" in str(info.value.__cause__).lower()
        # Headers h2 would let through pass, and the connection is the same one.
        completion = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            extra_headers={"TE": "trailers", "Cookie": "a=1", "X-Tag": "a b"},
        )
        assert completion.timings.connection_reused is True
        async with other:
            chunks = [c async for c in other]
        assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_cancelled_read_never_looks_like_the_end(sim: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()
    ) as client:
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "stall-between:3:60"},
        )
        await stream.__anext__()
        with anyio.move_on_after(0.5):
            while True:
                await stream.__anext__()
        with pytest.raises(llmroute.StreamInterrupted) as info:
            async for _ in stream:
                pass
        assert info.value.partial_text


def _body_without_docstring(function: object, *, drop_trace: bool) -> str:
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if drop_trace:
        body = [s for s in body if "trace" not in ast.dump(s)]
    # h2 names events and errors through its own modules' imports, llmroute through h2.events.
    return ast.dump(ast.Module(body=body, type_ignores=[])).replace(
        "Attribute(value=Attribute(value=Name(id='h2', ctx=Load()), attr='events', ctx=Load()), "
        "attr='Event', ctx=Load())",
        "Name(id='Event', ctx=Load())",
    )


def test_the_frame_dispatch_is_h2s_own_without_its_trace_log() -> None:
    # llmroute's copy of h2's _receive_frame drops only the eagerly built repr(frame) of the
    # trace log; an h2 release that changes the method must be looked at (and this copy too).
    import h2.connection

    from llmroute.transport._h2_wire import _H2Connection

    theirs = _body_without_docstring(h2.connection.H2Connection._receive_frame, drop_trace=True)
    ours = _body_without_docstring(_H2Connection._receive_frame, drop_trace=False)
    assert "trace" not in ours
    assert ours == theirs


@pytest.mark.parametrize("end_follows", [True, False])
async def test_a_stream_whose_end_is_already_in_is_not_reset(
    end_follows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The [DONE] line and the stream's end in two TLS records, written together: the client
    # finishes at [DONE], when the end is already at hand. A stream that has not ended there
    # (the server holds it open) is still reset, so the server stops.
    from llmroute.transport._h2_wire import _H2Connection

    resets: list[int] = []
    reset_stream = _H2Connection.reset_stream

    def counted(self: _H2Connection, stream_id: int, error_code: int = 0) -> None:
        resets.append(stream_id)
        reset_stream(self, stream_id, error_code)

    monkeypatch.setattr(_H2Connection, "reset_stream", counted)

    written = threading.Semaphore(0)

    async def handler(stream: ScriptedStream) -> None:
        stream.respond()
        # Three TLS records in one segment: the client's TLS has the end at hand when it reads
        # the [DONE] line (written apart, the end's record may come in a later read; then the
        # reset is right, and this test would count it).
        with stream.corked():
            stream.send(sse_chunk("hello ", finish="stop"))
            stream.send(b"data: [DONE]\n\n")
            if end_follows:
                stream.send(b"", end=True)
        written.release()
        await asyncio.sleep(30)

    with ScriptedServer(handler) as server:
        async with client_for(server) as client:
            for _ in range(3):
                stream = await client.chat.completions.create(
                    model="m", messages=MESSAGES, stream=True
                )
                # Everything the server wrote is at the client (in TLS's buffer or the
                # socket's) before it reads on from here.
                assert await anyio.to_thread.run_sync(written.acquire, True, 10)
                with anyio.fail_after(10):
                    chunks = [c.choices[0].delta.content async for c in stream if c.choices]
                assert chunks == ["hello "]
        assert server.requests == 3
    assert len(resets) == (0 if end_follows else 3)


class _SlowSocket(anyio.abc.ByteStream):
    """A socket whose writes take ``steps`` turns of the event loop (forever: ``None``); in the
    middle of one it runs ``during`` (to cancel the writer's scope from outside)."""

    def __init__(self, steps: int | None, during: Callable[[], None] = lambda: None) -> None:
        self.steps = steps
        self.during = during
        self.written = 0

    async def send(self, item: bytes) -> None:
        if self.steps is None:
            await anyio.sleep_forever()
        for step in range(self.steps):
            if step == 1:
                self.during()
            await anyio.lowlevel.checkpoint()
        self.written += 1

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.sleep_forever()
        raise AssertionError

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_a_write_that_never_ends_times_out_and_fails_the_connection() -> None:
    from llmroute.transport._h2 import HTTP2Connection

    conn = HTTP2Connection(_SlowSocket(None), origin="127.0.0.1:1", connect_time=0.0)
    conn._h2.initiate_connection()
    with pytest.raises(httpx.WriteTimeout):
        await conn._flush(0.05)
    assert conn.is_closed()
    with pytest.raises(httpx.WriteTimeout):  # every later use of the connection is refused
        conn._raise_if_failed(_no_stream())


def _no_stream() -> Any:
    from llmroute.transport._h2_stream import _StreamState

    return _StreamState(1)


async def test_a_write_is_never_cut_by_a_cancel_from_outside() -> None:
    from llmroute.transport._h2 import HTTP2Connection

    outer = anyio.CancelScope()
    sock = _SlowSocket(5, during=outer.cancel)
    conn = HTTP2Connection(sock, origin="127.0.0.1:1", connect_time=0.0)
    conn._h2.initiate_connection()
    with outer:
        await conn._flush(10)
        await anyio.lowlevel.checkpoint()
        raise AssertionError("the cancel must come at the next checkpoint")  # pragma: no cover
    assert outer.cancelled_caught
    assert sock.written == 1  # the whole write, then the cancel
    assert not conn.is_closed()
