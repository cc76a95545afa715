"""What an HTTP/2 connection puts on the wire and reads off it, below the streams.

``h2``'s client connection with two of its costs taken out (``_H2Connection``), its settings,
a request's header block checked once and encoded (``request_headers``), and the socket-level
reads the connection makes without waiting (``buffered_reader``, ``peer_closed``).
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
from anyio.streams.tls import TLSAttribute
from h2.errors import ErrorCodes
from h2.exceptions import StreamClosedError, StreamIDTooLowError
from hpack import NeverIndexedHeaderTuple
from hyperframe.frame import Frame, RstStreamFrame

__all__ = ["buffered_reader", "error_name", "new_h2", "peer_closed", "request_headers", "start_h2"]

_HOP_BY_HOP = frozenset(
    (b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)

_SECRET_HEADERS = frozenset(
    (b"authorization", b"proxy-authorization", b"x-api-key", b"api-key", b"x-goog-api-key")
)


_INVALID_HEADER = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9a-z]")
_INVALID_VALUE = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")


class _H2Connection(h2.connection.H2Connection):
    """h2's client connection, but counting its open streams without walking them all.

    h2 counts open streams at every new stream by iterating over every stream it holds (and
    drops the closed ones as it goes): O(n) work per request, O(n^2) to open n concurrent
    streams. ``HTTP2Connection.close_stream`` removes each stream from ``streams`` as it closes
    it (``_forget``), so the streams held bound the open ones (server push is off: all are
    outbound). Only at the server's limit are they counted h2's way, exactly.
    """

    @property
    def open_outbound_streams(self) -> int:
        held = len(self.streams)
        if held < self.remote_settings.max_concurrent_streams:
            return held
        return super().open_outbound_streams

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        """h2's own, minus ``logger.trace("Received frame: %s", repr(frame))``: the argument is
        built even for h2's no-op logger, and a DATA frame's repr copies and hex-encodes its
        payload (a tenth of the client's CPU with one event per frame). The rest is h2 4.4's
        code as is (``tests/transport/test_h2_corners.py`` checks that it still is)."""
        events: list[h2.events.Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except StreamClosedError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except StreamIDTooLowError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)

        return events

    def _forget(self, stream_id: int) -> None:
        """Drop a closed stream as h2's own count would (its end is remembered for late frames)."""
        stream = self.streams.get(stream_id)
        if stream is not None and stream.closed:
            del self.streams[stream_id]
            self._closed_streams[stream_id] = stream.closed_by


def new_h2() -> _H2Connection:
    """A client connection whose outbound headers ``request_headers`` has checked already."""
    # h2's outbound header checks and normalisation (a chain of generators over every header of
    # every request) are done once, in request_headers, with the same outcome.
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    return _H2Connection(config=config)


def start_h2(conn: h2.connection.H2Connection, *, stream_window: int, window: int) -> None:
    """Queue the connection preface: no push, ``stream_window`` per stream, ``window`` in all."""
    conn.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
        },
    )
    conn.initiate_connection()
    if window > 65535:
        conn.increment_flow_control_window(window - 65535)


def request_headers(request: httpx.Request) -> list[Any]:
    """``request``'s header block as h2 sends it, or ``httpx.LocalProtocolError`` for a header
    that would make the server end the whole connection."""
    url = request.url
    authority = url.netloc
    headers = [
        (b":method", request.method.encode()),
        (b":authority", authority),
        (b":scheme", url.raw_scheme),
        (b":path", url.raw_path),
    ]
    if not url.raw_path:
        raise httpx.LocalProtocolError("an empty :path")
    # What h2's outbound checks would refuse or change, done here once (they are off): a
    # name that is empty, not lower case or not a token (a ":" is not: no pseudo-header
    # comes from the caller), CR, LF or NUL in a value, or white space around it (refused,
    # where h2 strips it), TE other than "trailers"; connection-specific headers dropped;
    # credentials and short cookies never indexed.
    for name, value in request.headers.raw:
        lname = name.lower()
        if (
            not lname
            or _INVALID_HEADER.search(lname)
            or _INVALID_VALUE.search(value)
            or (lname == b"te" and value.lower() != b"trailers")
        ):
            # Sent as is, it would make the server end the whole connection (all its streams).
            shown = name.decode(errors="replace")
            raise httpx.LocalProtocolError(f"invalid HTTP header {shown!r}")
        if lname in _SECRET_HEADERS or (lname == b"cookie" and len(value) < 20):
            # Never indexed (RFC 7541 7.1.3), and redacted in hpack's debug log.
            headers.append(NeverIndexedHeaderTuple(lname, value))
        elif lname not in _HOP_BY_HOP:
            headers.append((lname, value))
    return headers


def buffered_reader(stream: anyio.abc.ByteStream) -> Callable[[int], bytes] | None:
    """The ``read`` of a TLS stream's ``SSLObject``: it returns what is already buffered or
    raises ``SSLWantReadError`` without waiting. Reading through it is safe whenever nobody
    awaits the stream's own ``receive``; anything the read leaves to send (a TLS 1.3 key update's
    answer) goes out, in order, with the stream's next write."""
    try:
        ssl_object = stream.extra(TLSAttribute.ssl_object)
    except anyio.TypedAttributeLookupError:
        return None
    return ssl_object.read if isinstance(ssl_object, ssl.SSLObject) else None


def peer_closed(stream: anyio.abc.ByteStream) -> bool:
    """Whether the peer has shut ``stream``'s socket down (end of file or reset), without
    reading anything; ``False`` when that cannot be told."""
    try:
        fileno = stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
        # asyncio wraps its sockets (no recv): peek through a duplicate of the descriptor.
        with socket.socket(fileno=os.dup(fileno)) as dup:
            return dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (anyio.TypedAttributeLookupError, ValueError):
        return False
    except OSError:
        return True


def error_name(code: int) -> str:
    """An HTTP/2 error code's name (``CANCEL``), or its number when it has none."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"error code {code}"
