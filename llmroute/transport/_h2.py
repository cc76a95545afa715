"""One client HTTP/2 connection on ``h2``, shared by many concurrent streams.

Two things httpx's own HTTP/2 layer does not do, and llmroute needs:

* Closing a response before its end sends ``RST_STREAM(CANCEL)``, so the server stops generating
  (a losing hedge is not paid in full) while the connection stays open for the next request.
* Every wait of a stream (for its headers, for its next chunk) has its own deadline. A stalled
  stream times out even when other streams on the same connection are busy.

``HTTP2Connection`` is the connection's life (open, availability, GOAWAY's effect, close) and its
requests (a stream opened, its body sent, its chunks read, its close or reset); beneath it,
``_h2_mux.py`` reads and writes the frames of every stream, ``_h2_stream.py`` holds a stream's
state and the receive window, and ``_h2_wire.py`` what goes on the wire (h2, the header block).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.abc
import h2.connection
import h2.exceptions
import httpx
from h2.errors import ErrorCodes

from ._events import EventDeadline
from ._h2_mux import _READ_SIZE, MAX_STREAMS, _Multiplexer
from ._h2_stream import ConnectionNotAvailable, _fresh, _ReceiveWindow, _StreamState
from ._h2_wire import peer_closed, request_headers, start_h2

__all__ = ["MAX_STREAMS", "ConnectionNotAvailable", "HTTP2Connection"]

_CONNECTION_WINDOW = 16 * 1024 * 1024
_STREAM_WINDOW = 4 * 1024 * 1024
_CLOSE_GRACE = 1.0


class HTTP2Connection(_Multiplexer):
    """A client HTTP/2 connection over an already-connected byte stream (TLS with ALPN h2)."""

    def __init__(self, stream: anyio.abc.ByteStream, *, origin: str, connect_time: float) -> None:
        super().__init__(stream)
        self.origin = origin
        self.connect_time = connect_time
        self.requests_served = 0
        self._reserved = 0
        self._abandoned: list[_StreamState] = []  # responses dropped unclosed (see __del__)
        # Read bytes go back to the connection's window together once they reach a sixteenth
        # of it, so streams that each stay below their batch cannot hold the whole window.
        self._receive_window = _ReceiveWindow(self._h2, max(1, _CONNECTION_WINDOW // 16))
        self.last_used = time.monotonic()
        self.on_stream_closed: Callable[[HTTP2Connection], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Send the connection preface and wait for the server's SETTINGS."""
        start_h2(self._h2, stream_window=_STREAM_WINDOW, window=_CONNECTION_WINDOW)
        await self._flush()
        while not self._settings_received:
            await self._read_once()
            if self._error is not None:
                raise _fresh(self._error)

    def is_available(self) -> bool:
        """Whether a new stream may be opened here now."""
        return (
            not self._closed
            and not self._goaway
            and self._error is None
            and len(self._streams) + self._reserved < self.max_streams
        )

    def is_closed(self) -> bool:
        return self._closed or self._error is not None or (self._goaway and not self._streams)

    def is_idle(self) -> bool:
        return not self._streams and not self._reserved

    def has_expired(self) -> bool:
        """An idle connection whose peer has shut the socket down (end of file or reset).

        Frames still to be read (late DATA of a reset stream, a PING, a GOAWAY) do not count: a
        GOAWAY, or a close that comes just after this check, makes the next request go to a new
        connection all the same (see ``sent_on_idle``).
        """
        if not self.is_idle() or self._reading:
            return False
        return peer_closed(self._sock)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def reserve(self) -> None:
        """Hold a stream slot for a request about to be sent (``handle_request`` takes it)."""
        self._reserved += 1

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_GRACE):
            try:
                self._h2.close_connection()
                async with self._write_lock:
                    await self._send_pending(_CLOSE_GRACE)
            except Exception:
                pass
        with anyio.CancelScope(shield=True):
            await self._sock.aclose()
        self._fail_all(httpx.ReadError("connection closed"))

    # -- one request -----------------------------------------------------------------------

    async def handle_request(self, request: httpx.Request, *, reused: bool) -> httpx.Response:
        """Send ``request`` on a new stream (a reservation must be held) and await its headers."""
        timeouts = request.extensions.get("timeout", {})
        read_timeout = timeouts.get("read")
        write_timeout = timeouts.get("write")
        if self._abandoned:
            await self._close_abandoned()
        self._reserved -= 1
        if not self.is_available_for_reserved():
            raise ConnectionNotAvailable()
        try:
            stream_id = self._h2.get_next_available_stream_id()
        except h2.exceptions.NoAvailableStreamIDError as exc:
            self._goaway = True
            raise ConnectionNotAvailable() from exc
        state = _StreamState(stream_id)
        # A server may close an idle connection just as a request goes out on it; such a stream
        # is retried on a new connection if the connection dies before it gets an answer.
        state.sent_on_idle = reused and not self._streams
        self._streams[stream_id] = state
        self.requests_served += 1
        self.last_used = time.monotonic()
        try:
            end_stream = request.method in ("GET", "HEAD") and not request.headers.get(
                "content-length"
            )
            headers = request_headers(request)
            with self._h2_errors(state):
                self._h2.send_headers(stream_id, headers, end_stream=end_stream)
            state.local_ended = end_stream
            if end_stream:
                await self._flush(write_timeout)
            else:  # the headers leave with the body's first write
                await self._send_body(state, request, write_timeout)
            await self._wait(state, read_timeout, lambda: state.status is not None)
        except httpx.TransportError as exc:
            await self.close_stream(state)
            if state.sent_on_idle and state.status is None and self._error is not None:
                raise ConnectionNotAvailable() from exc
            raise
        except BaseException:
            await self.close_stream(state)
            raise
        body = _ResponseStream(self, state, read_timeout)
        extensions = {
            "http_version": b"HTTP/2",
            "stream_id": stream_id,
            "llmroute.connection_reused": reused,
            "llmroute.connect_time": 0.0 if reused else self.connect_time,
            "llmroute.body": body,
        }
        return httpx.Response(
            status_code=state.status or 0,
            headers=state.headers,
            stream=body,
            extensions=extensions,
            request=request,
        )

    def is_available_for_reserved(self) -> bool:
        return not self._closed and not self._goaway and self._error is None

    async def _send_body(
        self, state: _StreamState, request: httpx.Request, write_timeout: float | None
    ) -> None:
        stream_id = state.id
        # A body known in full (httpx's JSON and bytes bodies) leaves with its headers and its
        # end in one write; a streamed one is sent as each chunk comes.
        whole = isinstance(request.stream, httpx.ByteStream)
        # The body is iterated to its end even when the server answered early (then nothing more
        # is sent): leaving the iterator half-run would leave an unfinished async generator.
        async for chunk in request.stream:  # type: ignore[union-attr]
            view = memoryview(chunk)
            while view and not state.ended:
                self._raise_if_failed(state)
                with self._h2_errors(state):
                    window = min(
                        self._h2.local_flow_control_window(stream_id),
                        self._h2.max_outbound_frame_size,
                    )
                if window <= 0:
                    await self._flush(write_timeout)
                    await self._wait_for_window(state, write_timeout)
                    continue
                with self._h2_errors(state):
                    self._h2.send_data(stream_id, bytes(view[:window]))
                view = view[window:]
                if not whole or len(self._h2._data_to_send) >= _READ_SIZE:
                    await self._flush(write_timeout)
        if state.ended:
            return  # the server answered before reading it all (RFC 9113 8.1)
        self._raise_if_failed(state)
        with self._h2_errors(state):
            self._h2.end_stream(stream_id)
        state.local_ended = True
        await self._flush(write_timeout)

    # -- the stream's side -----------------------------------------------------------------

    async def next_chunk(self, state: _StreamState, timeout: float | None) -> bytes | None:
        """The stream's next body chunk, or ``None`` at its end."""
        if self._abandoned:
            await self._close_abandoned()
        if not state.chunks and not state.ended and state.error is None:
            await self._wait(state, timeout, lambda: bool(state.chunks))
        if state.chunks:
            data, flow = state.chunks[0]
            if flow:
                # Return the window first: a cancel during the flush must not lose the chunk.
                state.chunks[0] = (data, 0)
                try:  # the hot path: no context manager per frame
                    returned = self._receive_window.took(state, flow)
                except h2.exceptions.H2Error as exc:
                    self._refused(state, exc)
                if returned and self._h2_has_output():
                    await self._flush()
            state.chunks.popleft()
            return data
        if state.error is not None:
            raise _fresh(state.error)
        return None

    async def _close_abandoned(self) -> None:
        """Reset the streams of responses that were garbage-collected without being closed."""
        while self._abandoned:
            await self.close_stream(self._abandoned.pop())

    async def close_stream(self, state: _StreamState) -> None:
        """Forget a stream; if it has not ended, reset it so the server stops sending."""
        if state.id not in self._streams:
            return
        took = False
        if not state.ended and state.error is None and state.local_ended:
            # A stream's end often comes just behind its last event (the [DONE] line): take what
            # TLS already holds, so that a stream which has in fact ended is not reset (the
            # reset was a write, a wake-up and two cancel scopes per request).
            while not state.ended and state.error is None and self._read_buffered():
                took = True
        del self._streams[state.id]
        self._waiting.pop(state.id, None)
        self._receive_window.forget(state)
        unfinished = not (state.ended and state.local_ended) and not state.remote_reset
        reset = unfinished and state.error is None and not self._closed and self._error is None
        if reset:
            try:
                self._h2.reset_stream(state.id, ErrorCodes.CANCEL)
            except h2.exceptions.ProtocolError:
                pass
        self._h2._forget(state.id)
        if reset or (took and self._h2_has_output()):
            with anyio.CancelScope(shield=True):
                try:
                    await self._flush(_CLOSE_GRACE)
                except Exception:
                    pass
        state.chunks.clear()
        self._hand_over_reading()
        if self.on_stream_closed is not None:
            self.on_stream_closed(self)


class _Chunks:
    """A response body's chunks as a plain async iterator: a reader that stops early (openai's
    own stream decoding does) leaves no half-run async generator behind."""

    __slots__ = ("_stream",)

    def __init__(self, stream: _ResponseStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        stream = self._stream
        chunk = await stream._conn.next_chunk(stream._state, stream._timeout)
        if chunk is None:
            raise StopAsyncIteration
        return chunk


class _ResponseStream(httpx.AsyncByteStream):
    """The body of one HTTP/2 response; closing it early resets only this stream."""

    def __init__(self, conn: HTTP2Connection, state: _StreamState, timeout: float | None) -> None:
        self._conn = conn
        self._state = state
        self._timeout = timeout
        self._closed = False
        self.events: EventDeadline | None = None
        """Set by :func:`~llmroute.transport.body_receiver` to bound the time between events."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Chunks(self)

    def bound_wait(self, seconds: float) -> float | None:
        """Wait at most ``seconds`` for each next chunk from now on (``httpx.ReadTimeout``
        after that); returns the bound it had (the read timeout), ``None`` if none."""
        before = self._timeout
        self._timeout = seconds if before is None else min(before, seconds)
        return before

    async def receive(self) -> bytes | None:
        """The next chunk, or ``None`` at the end: iteration without an async generator, so
        leaving early leaves no half-run generator behind (trio warns about those)."""
        events = self.events
        if events is None:
            return await self._conn.next_chunk(self._state, self._timeout)
        started = time.monotonic()
        data = await self._conn.next_chunk(self._state, self._timeout)
        if data:
            events.check(data, time.monotonic() - started)
        return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._conn.close_stream(self._state)

    def __del__(self) -> None:
        # Dropped without a close (a stream never read): nothing may be awaited here, so the
        # connection resets the stream at its next request or read. `_closed` stays as it is:
        # an object in a reference cycle may be finalized and still get its aclose() (an async
        # generator's finalizer resurrects it), and closing a stream twice is harmless.
        if not self._closed:
            self._conn._abandoned.append(self._state)
