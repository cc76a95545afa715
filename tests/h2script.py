"""A scripted HTTP/2 server over TLS on 127.0.0.1, for protocol corners hypercorn cannot produce.

Each test gives a handler, run as a task per request once its body has arrived (or, with
``early=True``, as soon as its headers have): ``handler(stream: ScriptedStream)``. The handler
writes frames through h2 and may sleep; the server runs in a thread with its own asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import trustme
from hyperframe.frame import GoAwayFrame

_CA = trustme.CA()
_LEAF = _CA.issue_cert("127.0.0.1")


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    _CA.configure_trust(ctx)
    return ctx


def sse_chunk(text: str, *, finish: str | None = None) -> bytes:
    data = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data)}\n\n".encode()


@dataclass
class ScriptedStream:
    conn: h2.connection.H2Connection
    writer: asyncio.StreamWriter
    stream_id: int
    headers: dict[bytes, bytes]
    body: bytes = b""

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    @contextlib.contextmanager
    def corked(self) -> Iterator[None]:
        """Hold what the block writes in the kernel until it ends (TCP_CORK), so the records
        written reach the peer in one segment, and its TLS reads them in one go: frames written
        one after the other are otherwise read in one chunk or two as the peer's loop wakes."""
        sock = self.writer.get_extra_info("socket")
        cork = getattr(socket, "TCP_CORK", None)  # Linux
        if sock is None or cork is None:
            yield
            return
        sock.setsockopt(socket.IPPROTO_TCP, cork, 1)
        try:
            yield
        finally:
            sock.setsockopt(socket.IPPROTO_TCP, cork, 0)

    def respond(self, status: int = 200, content_type: bytes = b"text/event-stream") -> None:
        self.conn.send_headers(
            self.stream_id, [(b":status", str(status).encode()), (b"content-type", content_type)]
        )
        self.flush()

    def send(self, data: bytes, *, end: bool = False) -> None:
        self.conn.send_data(self.stream_id, data, end_stream=end)
        self.flush()

    def goaway(self, last_stream_id: int, error_code: int = 0) -> None:
        """A GOAWAY written by hand: h2 would close its own state machine on sending one."""
        frame = GoAwayFrame(0)
        frame.last_stream_id = last_stream_id
        frame.error_code = error_code
        self.writer.write(frame.serialize())


Handler = Callable[[ScriptedStream], Awaitable[None]]


@dataclass
class ScriptedServer:
    handler: Handler
    early: bool = False
    max_concurrent_streams: int | None = None
    port: int = 0
    connections: int = 0
    requests: int = 0
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def __enter__(self) -> ScriptedServer:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1"

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        _LEAF.configure_cert(ctx)
        ctx.set_alpn_protocols(["h2"])
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        for task in self._tasks:
            task.cancel()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        if self.max_concurrent_streams is not None:
            limit = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
            conn.update_settings({limit: self.max_concurrent_streams})
        writer.write(conn.data_to_send())
        streams: dict[int, ScriptedStream] = {}
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        self.requests += 1
                        stream = ScriptedStream(conn, writer, event.stream_id, dict(event.headers))
                        streams[event.stream_id] = stream
                        if self.early:
                            self._start(stream)
                    elif isinstance(event, h2.events.DataReceived):
                        streams[event.stream_id].body += event.data
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded) and not self.early:
                        self._start(streams[event.stream_id])
                writer.write(conn.data_to_send())
        except (ConnectionError, h2.exceptions.ProtocolError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def _start(self, stream: ScriptedStream) -> None:
        task = asyncio.ensure_future(self.handler(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
