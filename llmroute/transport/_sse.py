"""An incremental Server-Sent Events decoder (WHATWG "event stream interpretation").

Bytes go in as they arrive from the network; each completed event comes out at once. The common
case, whole ``data: {...}`` events with LF line ends, is split on bytes and decoded without a
per-character loop. Events are bounded in size, so a hostile server cannot grow memory without
limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn, cast

from .._sizes import format_size

__all__ = ["SSEDecodeError", "SSEDecoder", "ServerSentEvent"]

_BOM = b"\xef\xbb\xbf"
_RETRY_DIGITS = 15  # a longer retry (over 30,000 years in ms) is ignored; int() refuses 4300+


@dataclass(slots=True)
class ServerSentEvent:
    """One dispatched event: its data lines joined with ``"\\n"``, and its fields."""

    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEDecodeError(ValueError):
    """Raised when an event stream cannot be decoded (an event over the size limit, bad UTF-8)."""


class SSEDecoder:
    """Decode an event stream incrementally, fed with byte chunks cut at any boundary.

    Follows the WHATWG rules: LF, CRLF and CR line ends (also a CRLF split between two chunks),
    ``data`` lines joined with ``"\\n"``, comment lines and unknown fields ignored, one space after
    the colon stripped, a leading byte order mark dropped, an event dispatched on a blank line and
    only if it had a ``data`` line. ``id`` persists across events (the last event ID), ``retry`` is
    reported on the event it came with and in :attr:`retry`. An empty ``event`` field is ``None``.

    An event whose bytes (its lines with their line ends, without the blank line) exceed
    ``max_event_bytes`` raises :class:`SSEDecodeError` as soon as that many bytes of it are
    buffered, so memory stays within ``max_event_bytes`` plus one fed chunk whatever the server
    sends. Invalid UTF-8 in a ``data``, ``event`` or ``id`` field raises it too. Events completed
    before a failing one are returned first and the error is raised by the next :meth:`feed` or
    :meth:`close`, so how the bytes were cut never changes what comes out; after an error the
    stream is unusable. A ``retry`` value of more than 15 digits is ignored (no such delay).
    """

    __slots__ = ("_buf", "_error", "_head", "_last_id", "_max", "_skip_lf", "_started", "retry")

    def __init__(self, *, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self._max = max_event_bytes
        self._error: SSEDecodeError | None = None  # raised by the next feed or close
        self._buf = bytearray()  # bytes after the last blank line: the event in progress
        self._head = b""  # a possible byte order mark cut short by the first chunk
        self._started = False
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF ends no line
        self._last_id: str | None = None
        self.retry: int | None = None
        """The last valid ``retry`` value seen (the reconnection time in ms), if any."""

    @property
    def last_event_id(self) -> str | None:
        """The last event ID seen, as a reconnecting client would send in ``Last-Event-ID``."""
        return self._last_id

    @property
    def buffered(self) -> int:
        """How many bytes are held for the event in progress (at most ``max_event_bytes`` + 1)."""
        return len(self._buf) + len(self._head)

    def feed(self, data: bytes) -> list[ServerSentEvent]:
        """Add bytes from the stream; return the events they complete, in order."""
        if self._error is not None:
            self._raise()
        if not self._started:
            data = self._head + data
            if len(data) < 3 and _BOM.startswith(data):
                self._head = data
                return []
            self._started = True
            self._head = b""
            if data.startswith(_BOM):
                data = data[3:]
        if not data:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if data[0] == 10:
                data = data[1:]
                if not data:
                    return []
        if b"\r" in data:
            self._skip_lf = data[-1] == 13
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

        buf = self._buf
        if buf:
            start = len(buf) - 1
            buf += data
            end = buf.rfind(b"\n\n", start)
            if end < 0:
                if len(buf) > self._max:
                    self._check_pending([])
                return []
            done = bytes(buf[:end])
            del buf[: end + 2]
        else:
            end = data.rfind(b"\n\n")
            if end < 0:
                buf += data
                if len(buf) > self._max:
                    self._check_pending([])
                return []
            if end + 2 == len(data) and data[:6] == b"data: " and data.find(b"\n", 6) == end:
                if end > self._max:
                    raise self._too_big()
                try:
                    return [ServerSentEvent(data[6:end].decode(), None, self._last_id, None)]
                except UnicodeDecodeError as exc:
                    raise _bad_utf8(exc) from exc
            done = data[:end]
            if end + 2 < len(data):
                buf += data[end + 2 :]
        events = self._events(done)
        if len(buf) > self._max:
            self._check_pending(events)
        return events

    def close(self) -> list[ServerSentEvent]:
        """End the stream. An event not ended by a blank line is discarded, as the spec says.

        Returns an empty list (kept for symmetry with :meth:`feed`), or raises the error the last
        :meth:`feed` deferred; the decoder is reset and may be fed a new stream, keeping the last
        event ID.
        """
        self._buf.clear()
        self._head = b""
        self._started = False
        self._skip_lf = False
        if self._error is not None:
            self._raise()
        return []

    def _raise(self) -> NoReturn:
        error, self._error = self._error, None
        raise cast(SSEDecodeError, error)

    def _check_pending(self, events: list[ServerSentEvent]) -> None:
        """Fail if the event in progress is over the limit (only called when it may be)."""
        buf = self._buf
        if len(buf.strip(b"\n")) > self._max:
            buf.clear()
            self._fail(self._too_big(), events)

    def _fail(self, error: SSEDecodeError, events: list[ServerSentEvent]) -> None:
        """Raise ``error`` now, or after ``events`` are returned if there are some."""
        if not events:
            raise error
        if self._error is None:
            self._error = error

    def _too_big(self) -> SSEDecodeError:
        return SSEDecodeError(
            f"SSE event larger than max_event_bytes={self._max} ({format_size(self._max)})"
        )

    def _events(self, done: bytes) -> list[ServerSentEvent]:
        """Decode complete blocks of lines (the bytes before a blank line) into events."""
        events: list[ServerSentEvent] = []
        check_size = len(done) > self._max
        last_id = self._last_id
        try:
            for block in done.split(b"\n\n"):
                if check_size and len(block) > self._max and len(block.strip(b"\n")) > self._max:
                    self._fail(self._too_big(), events)
                    return events
                if block[:6] == b"data: " and b"\n" not in block:
                    events.append(ServerSentEvent(block[6:].decode(), None, last_id, None))
                    continue
                data: list[bytes] = []
                event: bytes | None = None
                retry: int | None = None
                for line in block.split(b"\n"):
                    if not line:
                        if data:
                            events.append(_event(data, event, last_id, retry))
                            data = []
                        event = retry = None
                        continue
                    if line[0] == 58:  # b":" a comment
                        continue
                    name, _, value = line.partition(b":")
                    if value[:1] == b" ":
                        value = value[1:]
                    if name == b"data":
                        data.append(value)
                    elif name == b"event":
                        event = value
                    elif name == b"id":
                        if b"\0" not in value:
                            last_id = value.decode()
                    elif name == b"retry":
                        if value.isdigit():
                            value = value.lstrip(b"0") or b"0"
                            if len(value) <= _RETRY_DIGITS:
                                retry = self.retry = int(value)
                if data:
                    events.append(_event(data, event, last_id, retry))
        except UnicodeDecodeError as exc:
            error = _bad_utf8(exc)
            error.__cause__ = exc
            self._fail(error, events)
        finally:
            self._last_id = last_id
        return events


def _event(
    data: list[bytes], event: bytes | None, id: str | None, retry: int | None
) -> ServerSentEvent:
    return ServerSentEvent(
        (data[0] if len(data) == 1 else b"\n".join(data)).decode(),
        (event.decode() or None) if event else None,
        id,
        retry,
    )


def _bad_utf8(exc: UnicodeDecodeError) -> SSEDecodeError:
    return SSEDecodeError(f"SSE stream is not valid UTF-8: {exc}")
