"""One client HTTP/2 connection on ``h2``, shared by many concurrent streams.

Two things httpx's own HTTP/2 layer does not do, and llmroute needs:

* Closing a response before its end sends ``RST_STREAM(CANCEL)``, so the server stops generating
  (a losing hedge is not paid in full) while the connection stays open for the next request.
* Every wait of a stream (for its headers, for its next chunk) has its own deadline. A stalled
  stream times out even when other streams on the same connection are busy.

There is no background task: whichever stream needs data becomes the connection's reader, reads
from the socket and hands every frame to the stream it belongs to; when it has what it wanted it
passes the reader's role to another waiting stream. This works the same on asyncio and trio.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import NoReturn

import anyio
import anyio.abc
import h2.connection
import h2.events
import h2.exceptions
import httpx
from h2.errors import ErrorCodes

from ._events import EventDeadline
from ._h2_stream import ConnectionNotAvailable, _deadline, _fresh, _ReceiveWindow, _StreamState
from ._h2_wire import buffered_reader, error_name, new_h2, peer_closed, request_headers, start_h2

__all__ = ["ConnectionNotAvailable", "HTTP2Connection"]

_READ_SIZE = 65536
_CONNECTION_WINDOW = 16 * 1024 * 1024
_STREAM_WINDOW = 4 * 1024 * 1024
_CLOSE_GRACE = 1.0
_WRITE_LIMIT = 30.0  # a shielded write must still end: the bound when no write timeout is set


MAX_STREAMS = 256
"""Streams in flight on one connection at most, whatever the server allows. Beyond it the pool
opens another connection (up to ``max_connections``). With about 1,000 streams on one connection
to hypercorn (which allows 1,000), requests stalled on the connection's flow-control window and
never reached the app (benchmarks/load.py); 256 is also Cloudflare's limit, and it bounds how
many streams one lost TCP segment holds up."""


class HTTP2Connection:
    """A client HTTP/2 connection over an already-connected byte stream (TLS with ALPN h2)."""

    def __init__(self, stream: anyio.abc.ByteStream, *, origin: str, connect_time: float) -> None:
        self.origin = origin
        self.connect_time = connect_time
        self.requests_served = 0
        self._sock = stream
        self._ssl_read = buffered_reader(stream)
        self._h2 = new_h2()
        self._streams: dict[int, _StreamState] = {}
        self._reserved = 0
        # Uncontended, it takes no turn of the event loop (the write itself is a checkpoint).
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._reading = False
        self._waiting: dict[int, _StreamState] = {}
        self._abandoned: list[_StreamState] = []  # responses dropped unclosed (see __del__)
        self._window_waiters: list[anyio.Event] = []
        # Read bytes go back to the connection's window together once they reach a sixteenth
        # of it, so streams that each stay below their batch cannot hold the whole window.
        self._receive_window = _ReceiveWindow(self._h2, max(1, _CONNECTION_WINDOW // 16))
        self._closed = False
        self._goaway = False
        self._error: Exception | None = None
        self._settings_received = False
        self.max_streams = 100
        self.stream_cap = MAX_STREAMS
        """Streams in flight here at most, whatever the server allows (set before ``start``)."""
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

    async def _wait_for_window(self, state: _StreamState, timeout: float | None) -> None:
        event = anyio.Event()
        self._window_waiters.append(event)
        try:
            with _deadline(timeout, httpx.WriteTimeout):
                while not event.is_set() and not state.ended:
                    self._raise_if_failed(state)
                    # The window may have opened while the caller flushed, before this event
                    # was there to be woken: then nothing else may ever come to wake it (a
                    # server that answers once it has the body), a wait lost for good.
                    if self._window_open(state):
                        return
                    if self._reading:
                        state.wake = event
                        await event.wait()
                    else:
                        await self._read_as_reader(state)
        finally:
            state.wake = None
            if event in self._window_waiters:
                self._window_waiters.remove(event)
            self._hand_over_reading()

    def _window_open(self, state: _StreamState) -> bool:
        try:
            return self._h2.local_flow_control_window(state.id) > 0
        except h2.exceptions.H2Error:
            return True  # the stream closed: the sender's next step reports it

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

    def _h2_has_output(self) -> bool:
        # Peek without taking: frames must leave in order, so only _flush (under the lock) takes.
        return bool(self._h2._data_to_send)

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

    # -- reading ---------------------------------------------------------------------------

    async def _wait(
        self, state: _StreamState, timeout: float | None, ready: Callable[[], bool]
    ) -> None:
        if self._ssl_read is not None and not self._reading:
            # Records already decrypted or buffered need no wait, hence no deadline (a cancel
            # scope per read was a fifth of the client's CPU with one event per TLS record).
            while self._read_buffered():
                if self._h2_has_output():
                    await self._flush()
                if ready() or state.ended or state.error is not None or self._reading:
                    break
            if ready():
                self._hand_over_reading()
                return
        try:
            with _deadline(timeout, httpx.ReadTimeout):
                while not ready():
                    self._raise_if_failed(state)
                    if state.ended:
                        return
                    if self._reading:
                        state.wake = anyio.Event()
                        self._waiting[state.id] = state
                        try:
                            await state.wake.wait()
                        finally:
                            state.wake = None
                            self._waiting.pop(state.id, None)
                    else:
                        await self._read_as_reader(state)
        finally:
            # Whoever leaves while nobody reads passes the role on, so no waiter is stranded.
            self._hand_over_reading()

    async def _read_as_reader(self, state: _StreamState) -> None:
        self._reading = True
        try:
            await self._read_once()
        finally:
            self._reading = False

    def _hand_over_reading(self) -> None:
        """Wake one waiting stream so that somebody keeps reading the socket."""
        if self._reading:
            return
        for other in self._waiting.values():
            if other.wake is not None:
                other.wake.set()
                return
        for event in self._window_waiters:
            event.set()

    def _raise_if_failed(self, state: _StreamState) -> None:
        if state.error is not None:
            raise _fresh(state.error)
        if self._error is not None:
            raise _fresh(self._error)

    @contextlib.contextmanager
    def _h2_errors(self, state: _StreamState) -> Iterator[None]:
        """An h2 call refused (the stream or connection closed under it) as an httpx error."""
        try:
            yield
        except h2.exceptions.H2Error as exc:
            self._refused(state, exc)

    def _refused(self, state: _StreamState, exc: h2.exceptions.H2Error) -> NoReturn:
        self._raise_if_failed(state)  # the stream's or connection's own error, if it has one
        raise httpx.LocalProtocolError(f"HTTP/2 stream {state.id}: {exc}") from exc

    async def _read_once(self) -> None:
        try:
            data = await self._sock.receive(_READ_SIZE)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._connection_lost(httpx.RemoteProtocolError("server closed the connection"), exc)
            return
        except (OSError, ssl.SSLError) as exc:
            self._connection_lost(httpx.ReadError(f"read failed: {exc}"), exc)
            return
        self._receive(data)
        if self._h2_has_output():
            await self._flush()

    def _read_buffered(self) -> bool:
        """Take bytes that TLS has at hand without waiting (nobody may be reading); False when
        there are none or the connection failed (then the awaited read reports it)."""
        if self._reading or self._error is not None or self._closed or self._ssl_read is None:
            return False
        try:
            data = self._ssl_read(_READ_SIZE)
        except (ssl.SSLError, OSError, ValueError):
            return False  # want-read, close_notify or a failure: the TLS stream's receive decides
        if not data:
            return False
        self._receive(data)
        return True

    def _receive(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._connection_lost(httpx.RemoteProtocolError(f"HTTP/2 protocol error: {exc}"), exc)
            return
        for event in events:
            self._dispatch(event)

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            state = self._streams.get(event.stream_id)
            flow = event.flow_controlled_length or 0
            if state is not None:
                state.received(event.data, flow)
            elif flow:
                self._h2.acknowledge_received_data(flow, event.stream_id)
        elif isinstance(event, h2.events.ResponseReceived):
            state = self._streams.get(event.stream_id)
            if state is not None:
                state.answered(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            state = self._streams.get(event.stream_id)
            if state is not None:
                state.end()
                self._wake_senders()
        elif isinstance(event, h2.events.StreamReset):
            state = self._streams.get(event.stream_id)
            if state is not None:
                state.reset_by_server(event.error_code)
                self._wake_senders()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._settings_received = True
            self.max_streams = min(self._h2.remote_settings.max_concurrent_streams, self.stream_cap)
            self._wake_senders()  # the initial window may have grown
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._goaway_received(event)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.SettingsAcknowledged):
            self._wake_senders()

    def _goaway_received(self, event: h2.events.ConnectionTerminated) -> None:
        self._goaway = True
        last = event.last_stream_id if event.last_stream_id is not None else 0
        for state in list(self._streams.values()):
            if state.id > last and not state.ended:
                state.fail(ConnectionNotAvailable())
        if event.error_code:
            self._connection_lost(
                httpx.RemoteProtocolError(
                    f"server closed the connection ({error_name(event.error_code)})"
                ),
                None,
            )
        else:
            # A graceful GOAWAY: the streams up to last_stream_id are still answered (RFC 9113
            # 6.8), but h2 4.x closes its whole state machine on GOAWAY and would refuse their
            # DATA (python-hyper/h2#1181). Keep it open; _goaway stops new streams.
            self._h2.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        self._wake_senders()

    def _wake_senders(self) -> None:
        for waiter in self._window_waiters:
            waiter.set()

    def _connection_lost(self, error: Exception, cause: BaseException | None) -> None:
        if cause is not None:
            error.__cause__ = cause
        self._error = error
        self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        for state in self._streams.values():
            if not state.ended and state.error is None:
                unanswered = state.status is None and state.sent_on_idle
                state.fail(ConnectionNotAvailable() if unanswered else error)
        for waiter in self._window_waiters:
            waiter.set()

    # -- writing ---------------------------------------------------------------------------

    async def _flush(self, timeout: float | None = None) -> None:
        async with self._write_lock:
            await self._send_pending(timeout)

    async def _send_pending(self, timeout: float | None = None) -> None:
        data = self._h2.data_to_send()
        if not data:
            return
        if self._error is not None:
            raise _fresh(self._error)
        # A half-written frame would corrupt every stream of the connection: never cancel a write
        # (shielded from outer scopes), but bound it (the scope's own deadline still applies).
        limit = _WRITE_LIMIT if timeout is None else timeout
        try:
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + limit) as scope:
                await self._sock.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._connection_lost(httpx.WriteError(f"write failed: {exc}"), exc)
            raise httpx.WriteError(f"write failed: {exc}") from exc
        if scope.cancelled_caught:
            error = httpx.WriteTimeout(f"no data within {limit:g} s on this stream")
            self._connection_lost(error, None)
            raise error


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
