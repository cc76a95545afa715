"""One HTTP/2 stream's state, and the connection's receive window that its reads return.

``_StreamState`` is what a stream has received (status, headers, chunks, its end or its error)
and how each of the server's events changes it; ``_ReceiveWindow`` gives the server back the
flow-control window of what the streams' readers took, in batches. Also the small pieces every
wait of a stream uses: ``_deadline``, ``_fresh`` and ``ConnectionNotAvailable``.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

import anyio
import h2.connection
import h2.exceptions
import httpx
from h2.errors import ErrorCodes

from ._h2_wire import error_name

__all__ = ["ConnectionNotAvailable"]

_ACK_BATCH = 16384  # flow-controlled bytes read before their window is returned (<< windows)


class ConnectionNotAvailable(Exception):
    """The connection closed (GOAWAY or EOF) before the stream was sent; safe to retry elsewhere."""


def _fresh(error: Exception) -> Exception:
    """A new exception like ``error``: each waiting stream raises its own, not one shared object."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        return error
    copy.__cause__ = error.__cause__ or error
    return copy


class _deadline:
    """``anyio.move_on_after`` that raises an httpx timeout; ``None`` means no deadline."""

    __slots__ = ("_exc", "_scope", "_timeout")

    def __init__(self, timeout: float | None, exc: type[httpx.TimeoutException]) -> None:
        self._timeout = timeout
        self._exc = exc
        self._scope: anyio.CancelScope | None = None

    def __enter__(self) -> None:
        if self._timeout is not None:
            scope = anyio.move_on_after(self._timeout)
            scope.__enter__()
            self._scope = scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope = self._scope
        if scope is None:
            return
        scope.__exit__(exc_type, exc, tb)
        if scope.cancelled_caught:
            raise self._exc(f"no data within {self._timeout:g} s on this stream")


class _StreamState:
    __slots__ = (
        "chunks",
        "ended",
        "error",
        "headers",
        "id",
        "local_ended",
        "pending_flow",
        "read_flow",
        "remote_reset",
        "sent_on_idle",
        "status",
        "wake",
    )

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[tuple[bytes, int]] = deque()
        self.ended = False
        self.error: Exception | None = None
        self.wake: anyio.Event | None = None
        self.pending_flow = 0  # flow-controlled bytes received and not yet acknowledged
        self.read_flow = 0  # of which the reader already took (acknowledged in batches)
        self.sent_on_idle = False
        self.local_ended = False
        self.remote_reset = False

    def received(self, data: bytes, flow: int) -> None:
        """A DATA frame's bytes, ``flow`` of them flow-controlled (to return once read)."""
        self.chunks.append((data, flow))
        self.pending_flow += flow
        _wake(self)

    def answered(self, fields: list[tuple[bytes, bytes]]) -> None:
        """The response's header block: its status and its (non-pseudo) headers."""
        status = 0
        headers = []
        for name, value in fields:
            if name == b":status":
                status = int(value)
            elif not name.startswith(b":"):
                headers.append((name, value))
        self.status = status
        self.headers = headers
        _wake(self)

    def end(self) -> None:
        self.ended = True
        _wake(self)

    def reset_by_server(self, error_code: int) -> None:
        """RST_STREAM from the server: an error unless the stream had ended; a refused stream
        that got no answer is safe to send again elsewhere."""
        self.remote_reset = True
        if not self.ended:
            code = error_name(error_code)
            if error_code == ErrorCodes.REFUSED_STREAM and self.status is None:
                self.error = ConnectionNotAvailable()
            else:
                self.error = httpx.RemoteProtocolError(f"server reset the stream ({code})")
        _wake(self)

    def fail(self, error: Exception) -> None:
        self.error = error
        _wake(self)


def _wake(state: _StreamState) -> None:
    if state.wake is not None:
        state.wake.set()


class _ReceiveWindow:
    """The window of what the streams' readers took, given back to the server in batches.

    A stream's read bytes are returned once they reach ``_ACK_BATCH`` (h2 sends a WINDOW_UPDATE
    only when half a window is used anyway); across the connection, once ``limit`` bytes are
    read, whichever streams read them: thousands of short streams, each below its batch, would
    otherwise hold the whole window and stall every stream on it. A closed stream's rest is
    returned by ``forget``.
    """

    __slots__ = ("_h2", "_limit", "unacked", "unacked_bytes")

    def __init__(self, conn: h2.connection.H2Connection, limit: int) -> None:
        self._h2 = conn
        self._limit = limit
        self.unacked: dict[int, _StreamState] = {}  # streams with read bytes not yet returned
        self.unacked_bytes = 0  # and their sum

    def took(self, state: _StreamState, flow: int) -> bool:
        """Count ``flow`` bytes that ``state``'s reader took; ``True`` when windows were
        returned (frames to send). h2's errors propagate."""
        if not state.read_flow:
            self.unacked[state.id] = state
        state.read_flow += flow
        self.unacked_bytes += flow
        if state.read_flow >= _ACK_BATCH:
            self._return(state)
        elif self.unacked_bytes >= self._limit:
            # One pass over the streams that read since the last pass, so the work is at most
            # one step per chunk read.
            for other in list(self.unacked.values()):
                self._return(other)
        else:
            return False
        return True

    def _return(self, state: _StreamState) -> None:
        """Give the server back the window of what ``state``'s reader has taken."""
        flow, state.read_flow = state.read_flow, 0
        state.pending_flow -= flow
        self.unacked_bytes -= flow
        del self.unacked[state.id]
        self._h2.acknowledge_received_data(flow, state.id)

    def forget(self, state: _StreamState) -> None:
        """A stream closes: return every byte it received, read or not."""
        if self.unacked.pop(state.id, None) is not None:
            self.unacked_bytes -= state.read_flow
            state.read_flow = 0
        if state.pending_flow:
            try:
                self._h2.acknowledge_received_data(state.pending_flow, state.id)
            except h2.exceptions.ProtocolError:
                pass
            state.pending_flow = 0
