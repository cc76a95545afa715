"""A deadline between server-sent events, for streams that trickle bytes without ending one."""

from __future__ import annotations

import time

import httpx

__all__ = ["EventDeadline"]

_LINE_ENDS = (b"\n", b"\r")


class EventDeadline:
    """Raises ``httpx.ReadTimeout`` when data arrives but no SSE event has ended (a blank line)
    for ``timeout`` seconds.

    A stream that goes silent is the read timeout's; this catches one that keeps sending bytes
    without ever ending an event (a slow loris): it fails at most ``timeout`` plus one gap between
    bytes late. Cost per chunk: a scan for a blank line, and a clock read.
    """

    __slots__ = ("_last", "_tail", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._last = time.monotonic()
        self._tail = b""

    def check(self, data: bytes) -> None:
        """Account for ``data`` (a non-empty chunk of the stream), or raise the timeout."""
        if (
            b"\n\n" in data
            or (self._tail in _LINE_ENDS and data[:1] in _LINE_ENDS)
            or b"\r\r" in data
            or b"\n\r\n" in data
        ):
            self._last = time.monotonic()
        elif time.monotonic() - self._last > self.timeout:
            raise httpx.ReadTimeout(
                f"no server-sent event ended in {self.timeout:g} s, though data kept arriving"
            )
        self._tail = data[-1:]
