"""Many streams over one HTTP/2 socket: reading frames, handing their events to the streams,
writing frames, and failing every stream when the connection is lost.

There is no background task: whichever stream needs data becomes the connection's reader, reads
from the socket and hands every frame to the stream it belongs to; when it has what it wanted it
passes the reader's role to another waiting stream. This works the same on asyncio and trio.
``HTTP2Connection`` (``_h2.py``) adds the connection's life and its requests on top.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterator
from typing import NoReturn

import anyio
import anyio.abc
import h2.connection
import h2.events
import h2.exceptions
import httpx

from ._h2_stream import ConnectionNotAvailable, _deadline, _fresh, _StreamState
from ._h2_wire import buffered_reader, error_name, new_h2

__all__ = ["MAX_STREAMS"]

_READ_SIZE = 65536
_WRITE_LIMIT = 30.0  # a shielded write must still end: the bound when no write timeout is set
MAX_STREAMS = 256
"""Streams in flight on one connection at most, whatever the server allows. Beyond it the pool
opens another connection (up to ``max_connections``). With about 1,000 streams on one connection
to hypercorn (which allows 1,000), requests stalled on the connection's flow-control window and
never reached the app (benchmarks/load.py); 256 is also Cloudflare's limit, and it bounds how
many streams one lost TCP segment holds up."""


class _Multiplexer:
    """The streams of one client HTTP/2 connection over an already-connected byte stream."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._sock = stream
        self._ssl_read = buffered_reader(stream)
        self._h2 = new_h2()
        self._streams: dict[int, _StreamState] = {}
        # Uncontended, it takes no turn of the event loop (the write itself is a checkpoint).
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._reading = False
        self._waiting: dict[int, _StreamState] = {}
        self._window_waiters: list[anyio.Event] = []
        self._closed = False
        self._goaway = False
        self._error: Exception | None = None
        self._settings_received = False
        self.max_streams = 100
        self.stream_cap = MAX_STREAMS
        """Streams in flight here at most, whatever the server allows (set before ``start``)."""

    # -- a stream's waits ------------------------------------------------------------------

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

    # -- reading ---------------------------------------------------------------------------

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

    def _h2_has_output(self) -> bool:
        # Peek without taking: frames must leave in order, so only _flush (under the lock) takes.
        return bool(self._h2._data_to_send)

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
