"""HTTP/2 fixes and limits for the hypercorn servers llmroute starts (hypercorn 0.18).

Back-pressure. hypercorn 0.18.0's ``StreamBuffer`` (``hypercorn/protocol/h2.py``) lets an app
write without bound to a client that does not read: when the client's flow-control window is 0
the send task calls ``pop(0)``, and ``pop`` wakes the writer whenever the bytes it *removed* are
fewer than the low-water mark (``b""`` is), although the buffer is still full; ``push`` also
waits only once instead of until the buffer is below the high-water mark. An app streaming to a
stalled client thus buffers the whole answer in memory. :class:`BoundedStreamBuffer` fixes both:
``pop`` wakes the writer only once the buffer *left* is below the low-water mark, and ``push``
waits until the buffer is below the high-water mark. A stream the client resets, or a connection
that closes, closes its buffer, so a writer waiting on a zero window wakes up.

Early answers. hypercorn 0.18 forgets a stream once its app has answered; DATA the client still
sends for that stream (the rest of a body the app refused with 401, 413 or 429 before reading it)
raises ``KeyError`` inside hypercorn, which drops the connection and every other stream on it
(hypercorn issue #329). :class:`BoundedH2Protocol` acknowledges and drops such DATA instead (up to
``H2Limits.orphan_bytes`` per stream, then it resets the stream with ``NO_ERROR``, as RFC 9113
8.1 allows after a complete response).

Limits (``h2_limits``: an :class:`H2Limits`, the gateway's): streams reset by the client before
their answer ended and frames that carry no request are counted against per-connection budgets;
a connection that overdraws one gets GOAWAY ``ENHANCE_YOUR_CALM`` and is closed, which ends (and
cancels) the app's work for all its streams. A stream whose app returns before the end of its
answer (a client that does not read, see the gateway's ``write_timeout``) is reset with
``CANCEL`` instead of being left open.

:class:`BoundedH2Protocol` does all this when its config has ``h2_bounded_stream_buffers =
True`` (limits only with ``h2_limits`` too); :func:`install` puts it in ``hypercorn.protocol``
(where hypercorn looks the HTTP/2 protocol class up for each connection). Servers whose config
lacks the flag, i.e. every hypercorn server llmroute does not start itself, are unchanged.

This module imports hypercorn (the ``server`` extra): import it only to serve.
"""

from __future__ import annotations

import logging
import ssl
import time
from typing import Any

import h2.errors
import h2.events
import h2.exceptions
import hypercorn.protocol
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.events import Body, EndBody, EndData, StreamClosed, Trailers
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h2 import (
    BUFFER_HIGH_WATER,
    BUFFER_LOW_WATER,
    BufferCompleteError,
    H2Protocol,
    StreamBuffer,
)
from priority.priority import (
    DeadlockError,
    DuplicateStreamError,
    MissingStreamError,
    TooManyStreamsError,
)

__all__ = [
    "CONFIG_FLAG",
    "LIMITS_ATTRIBUTE",
    "BoundedH2Protocol",
    "BoundedStreamBuffer",
    "H2Limits",
    "install",
]

CONFIG_FLAG = "h2_bounded_stream_buffers"
"""The hypercorn config attribute that turns :class:`BoundedH2Protocol`'s fixes on."""
LIMITS_ATTRIBUTE = "h2_limits"
"""The hypercorn config attribute holding the :class:`H2Limits` of a server (the gateway's)."""

_LOG = logging.getLogger("llmroute.server")
_ORPHAN_BYTES = 16 * 2**20  # body bytes dropped for an answered stream before it is reset
_LINGER = 1.0  # seconds a connection closed for abuse is read (and dropped) before it closes
_MAX_PRIORITY_STREAMS = 1000  # streams the send order knows at once (priority's own default)

# Events of frames that carry no request: a flood of them is all cost and no work.
_NOISE = (
    h2.events.PingReceived,
    h2.events.PingAckReceived,
    h2.events.RemoteSettingsChanged,
    h2.events.SettingsAcknowledged,
    h2.events.PriorityUpdated,
    h2.events.UnknownFrameReceived,
)


class H2Limits:
    """What one HTTP/2 connection may make the gateway do. Each budget is a token bucket of
    ``burst`` events, refilled at ``burst / window`` per second; a connection that overdraws
    one is closed with GOAWAY ``ENHANCE_YOUR_CALM``.

    ``resets``: streams the client resets (rapid reset, CVE-2023-44487). ``frames``: frames
    that carry no request (PING, SETTINGS, PRIORITY, empty DATA, unknown types).
    ``orphan_bytes``: body bytes accepted for a stream already answered.
    """

    __slots__ = ("frames", "orphan_bytes", "resets", "window")

    def __init__(
        self,
        resets: int = 200,
        frames: int = 1000,
        window: float = 10.0,
        orphan_bytes: int = 16 * 2**20,
    ) -> None:
        self.resets = resets
        self.frames = frames
        self.window = window
        self.orphan_bytes = orphan_bytes


class _Budget:
    """A token bucket: ``take()`` is False once more than ``burst`` events came faster than
    ``burst / window`` per second."""

    __slots__ = ("_burst", "_left", "_rate", "_stamp")

    def __init__(self, burst: int, window: float) -> None:
        self._burst = float(burst)
        self._rate = burst / window
        self._left = float(burst)
        self._stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._left = min(self._burst, self._left + (now - self._stamp) * self._rate)
        self._stamp = now
        self._left -= 1.0
        return self._left >= 0.0


class BoundedStreamBuffer(StreamBuffer):
    """hypercorn's per-stream send buffer, holding at most about ``BUFFER_HIGH_WATER`` bytes
    plus one write: the writer (the app's ``send``) waits while it is fuller than that."""

    async def push(self, data: bytes) -> None:
        if self._complete:
            raise BufferCompleteError()
        self.buffer.extend(data)
        await self._is_empty.clear()
        # Loop: the pause event may have been set by an earlier pop (or be set again while the
        # buffer is still full); only a buffer below the high-water mark lets the writer on.
        # close() empties the buffer and sets the event, which ends the wait too.
        while len(self.buffer) >= BUFFER_HIGH_WATER:
            await self._paused.wait()
            await self._paused.clear()

    async def pop(self, max_length: int) -> bytes:
        length = min(len(self.buffer), max_length)
        data = bytes(self.buffer[:length])
        del self.buffer[:length]
        # What is left decides, not what was removed: pop(0) on a zero window removes nothing.
        if len(self.buffer) < BUFFER_LOW_WATER:
            await self._paused.set()
        if len(self.buffer) == 0:
            await self._is_empty.set()
        return data


class _BoundedBuffers(dict[int, StreamBuffer]):
    """``H2Protocol.stream_buffers`` that swaps each new hypercorn buffer for a bounded one as
    it is stored (``_create_stream`` stores it before the app can write to it)."""

    def __init__(self, event_class: Any) -> None:
        super().__init__()
        self._event_class = event_class

    def __setitem__(self, stream_id: int, buffer: StreamBuffer) -> None:
        if type(buffer) is StreamBuffer:  # hypercorn's own, just created
            buffer = BoundedStreamBuffer(self._event_class)
        super().__setitem__(stream_id, buffer)


class _Answered:
    """What ``H2Protocol.streams`` gives for a stream it no longer has (its app answered):
    hypercorn 0.18 raised ``KeyError`` there and dropped the connection (issue #329)."""

    __slots__ = ("_protocol", "_stream_id")

    def __init__(self, protocol: BoundedH2Protocol, stream_id: int) -> None:
        self._protocol = protocol
        self._stream_id = stream_id

    async def handle(self, event: StreamEvent) -> None:
        self._protocol.orphan(self._stream_id, event)


class _Streams(dict[int, Any]):
    """``H2Protocol.streams``, where a stream already answered and forgotten is an
    :class:`_Answered` for ``streams[id]`` (``in`` and ``get`` are unchanged)."""

    def __init__(self, protocol: BoundedH2Protocol) -> None:
        super().__init__()
        self._protocol = protocol

    def __missing__(self, stream_id: int) -> _Answered:
        return _Answered(self._protocol, stream_id)


class _ReadyStreams:
    """What hypercorn's send task asks ``priority.PriorityTree`` (which stream sends next),
    without the tree: streams with data take turns in the order they became ready. RFC 9113
    deprecates HTTP/2 priorities and a gateway's streams are all alike, while the tree's
    scheduling cost ~5% of the gateway's CPU per streamed request (``Stream.schedule``,
    ``__eq__``, ``remove_child`` in a py-spy profile). Same interface and errors, same cap on
    streams known at once."""

    __slots__ = ("_known", "_ready")

    def __init__(self) -> None:
        self._known: set[int] = set()
        self._ready: dict[int, None] = {}  # insertion-ordered: the turn order

    def insert_stream(self, stream_id: int, *args: Any, **kwargs: Any) -> None:
        if stream_id in self._known:
            raise DuplicateStreamError(stream_id)
        if len(self._known) >= _MAX_PRIORITY_STREAMS:
            raise TooManyStreamsError(f"more than {_MAX_PRIORITY_STREAMS} streams")
        self._known.add(stream_id)
        self._ready[stream_id] = None

    def _check(self, stream_id: int) -> None:
        if stream_id not in self._known:
            raise MissingStreamError(stream_id)

    def block(self, stream_id: int) -> None:
        self._check(stream_id)
        self._ready.pop(stream_id, None)

    def unblock(self, stream_id: int) -> None:
        self._check(stream_id)
        self._ready[stream_id] = None

    def remove_stream(self, stream_id: int) -> None:
        self._check(stream_id)
        self._known.discard(stream_id)
        self._ready.pop(stream_id, None)

    def reprioritize(self, stream_id: int, *args: Any, **kwargs: Any) -> None:
        self._check(stream_id)  # weights and dependencies are not kept

    def __iter__(self) -> _ReadyStreams:
        return self

    def __next__(self) -> int:
        ready = self._ready
        if not ready:
            raise DeadlockError("no stream has data to send")
        stream_id = next(iter(ready))
        del ready[stream_id]  # to the back of the line
        ready[stream_id] = None
        return stream_id


class BoundedH2Protocol(H2Protocol):
    """hypercorn's ``H2Protocol`` with the fixes and limits of this module when its config has
    ``h2_bounded_stream_buffers = True`` (limits when it also has ``h2_limits``); otherwise
    hypercorn's own behaviour."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fixed = bool(getattr(self.config, CONFIG_FLAG, False))
        limits: H2Limits | None = getattr(self.config, LIMITS_ATTRIBUTE, None)
        self._limits = limits if self._fixed else None
        if self._fixed:
            self.stream_buffers = _BoundedBuffers(self.context.event_class)
            self.streams = _Streams(self)
        self._orphans: dict[int, int] = {}  # answered stream -> body bytes dropped since
        self._ended: set[int] = set()  # streams whose app sent the end of the answer
        if self._limits is not None:
            self._resets = _Budget(self._limits.resets, self._limits.window)
            self._frames = _Budget(self._limits.frames, self._limits.window)
            self.priority = _ReadyStreams()  # type: ignore[assignment]
        self.calmed = False  # closed with ENHANCE_YOUR_CALM

    async def handle(self, event: Event) -> None:
        if self.calmed and isinstance(event, RawData):
            return  # read and dropped until the connection closes (see _calm_down)
        await super().handle(event)
        if self._fixed and isinstance(event, Closed):
            # Writers waiting on a zero window would wait forever: wake them.
            for buffer in list(self.stream_buffers.values()):
                await buffer.close()

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        if not self._fixed:
            await super()._handle_events(events)
            return
        if self._limits is not None:
            for event in events:
                if not self._within_limits(event):
                    await self._calm_down()
                    return
        try:
            await super()._handle_events(events)
        except h2.exceptions.ProtocolError:
            # hypercorn resets a stream that arrives during shutdown even when the connection
            # is already closed; h2's error would escape the connection's task.
            await self._flush()
            await self.send(Closed())
            return
        for event in events:
            if isinstance(event, h2.events.StreamReset):
                self._orphans.pop(event.stream_id, None)
                buffer = self.stream_buffers.get(event.stream_id)
                if buffer is not None:
                    await buffer.close()

    def orphan(self, stream_id: int, event: StreamEvent) -> None:
        """Body of a stream already answered (hypercorn #329): dropped (hypercorn acknowledges
        it), and the stream reset once more than ``orphan_bytes`` came."""
        if isinstance(event, EndBody):
            self._orphans.pop(stream_id, None)
            return
        if not isinstance(event, Body):
            return
        dropped = self._orphans.get(stream_id, 0) + len(event.data)
        cap = self._limits.orphan_bytes if self._limits is not None else _ORPHAN_BYTES
        if dropped <= cap:
            self._orphans[stream_id] = dropped
            return
        self._orphans.pop(stream_id, None)
        try:
            self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:
            pass

    def _within_limits(self, event: h2.events.Event) -> bool:
        if isinstance(event, h2.events.StreamReset):
            # Every reset counts, answered or not: the work of a stream (an app task, headers
            # parsed, often an answer) is done by the time a rapid-reset client cancels it.
            return not event.remote_reset or self._resets.take()
        if isinstance(event, _NOISE) or (
            isinstance(event, h2.events.DataReceived) and not event.data and not event.stream_ended
        ):
            return self._frames.take()
        return True

    async def _calm_down(self) -> None:
        """GOAWAY ENHANCE_YOUR_CALM; every stream ends now (their apps see a disconnect), and
        the connection closes after a short linger during which what the client still sends
        is read unparsed, so the kernel does not answer it with a TCP reset that would destroy
        the GOAWAY before the client reads it."""
        self.calmed = True
        self.connection.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        await self._flush()
        await super().handle(Closed())
        for buffer in list(self.stream_buffers.values()):
            await buffer.close()
        self.task_group.spawn(self._close_after_linger)

    async def _close_after_linger(self) -> None:
        await self.context.sleep(_LINGER)
        await self.send(Closed())

    async def stream_send(self, event: StreamEvent) -> None:
        if self._limits is not None:
            if isinstance(event, EndBody | EndData | Trailers):
                self._ended.add(event.stream_id)
            elif isinstance(event, StreamClosed):
                if event.stream_id not in self._ended and event.stream_id in self.streams:
                    await self._reset(event.stream_id)
                self._ended.discard(event.stream_id)
        await super().stream_send(event)

    async def _reset(self, stream_id: int) -> None:
        """A stream whose app returned before the end of its answer: reset (CANCEL), its
        buffer dropped, rather than left open (hypercorn 0.18 leaves it open)."""
        try:
            self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.ProtocolError:
            return  # already closed
        buffer = self.stream_buffers.get(stream_id)
        if buffer is not None:
            buffer.set_complete()
            buffer.buffer = bytearray()
            try:
                self.priority.unblock(stream_id)
            except Exception:  # priority.MissingStreamError
                pass
        await self._flush()
        await self.has_data.set()


def install() -> None:
    """Make new hypercorn HTTP/2 connections use :class:`BoundedH2Protocol` (or a subclass of
    it already installed, such as the simulator's), and keep a TLS error of a connection's
    close from failing the server's shutdown. Idempotent; a server's HTTP/2 only changes
    behaviour when its config sets ``h2_bounded_stream_buffers``."""
    current = hypercorn.protocol.H2Protocol  # type: ignore[attr-defined]
    if not (isinstance(current, type) and issubclass(current, BoundedH2Protocol)):
        hypercorn.protocol.H2Protocol = BoundedH2Protocol  # type: ignore[misc]
    close = TCPServer._close  # pyright: ignore[reportPrivateUsage]
    if not getattr(close, "_llmroute", False):

        async def _close(self: TCPServer) -> None:
            # hypercorn 0.18 lets the SSLError of a TLS client that still sends after the
            # server's close_notify escape a connection's task, and hypercorn's shutdown then
            # raises it: a client's behaviour must not fail the server's exit.
            try:
                await close(self)
            except ssl.SSLError:
                pass

        _close._llmroute = True  # type: ignore[attr-defined]
        TCPServer._close = _close  # type: ignore[method-assign]
        run = TCPServer.run

        async def _run(self: TCPServer) -> None:
            # One connection's failure (an h2 state error or a write to a TLS transport
            # already gone, both seen when a client keeps sending while hypercorn shuts its
            # connection) ends that connection only: hypercorn's shutdown re-raises it.
            try:
                await run(self)
            except Exception as exc:
                _LOG.debug("a connection ended on %s", type(exc).__name__)

        TCPServer.run = _run  # type: ignore[method-assign]
