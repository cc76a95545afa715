"""A deadline between server-sent events, for streams that trickle bytes without ending one."""

from __future__ import annotations

import httpx

__all__ = ["EventDeadline"]

# Two line terminators in a row (LF LF, CR CR, or LF then CR/CRLF) end an event; CR LF is one.
_EVENT_ENDS = frozenset((b"\n\n", b"\r\r", b"\n\r"))


class EventDeadline:
    """Raises ``httpx.ReadTimeout`` once a stream has kept its reader waiting ``timeout`` seconds
    in all without ending an event (a blank line), though data arrived meanwhile.

    A stream that goes silent is the read timeout's; this catches one that keeps sending bytes
    without ever ending an event (a slow loris): it fails at most ``timeout`` plus one gap between
    bytes late. Only time spent waiting for data counts, so an application that reads slowly
    never makes a healthy server look slow. Cost per chunk: a scan for a blank line.
    """

    __slots__ = ("_tail", "_waited", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._waited = 0.0
        self._tail = b""

    def check(self, data: bytes, waited: float) -> None:
        """Account for ``data`` (a non-empty chunk), which took ``waited`` seconds to come."""
        if (
            b"\n\n" in data
            or b"\r\r" in data
            or b"\n\r" in data
            or self._tail + data[:1] in _EVENT_ENDS
        ):
            self._waited = 0.0
        else:
            self._waited += waited
            if self._waited > self.timeout:
                raise httpx.ReadTimeout(
                    f"no server-sent event ended in {self.timeout:g} s of waiting, though data "
                    "kept arriving"
                )
        self._tail = data[-1:]
