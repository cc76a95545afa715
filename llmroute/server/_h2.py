"""HTTP/2 back-pressure for the hypercorn servers llmroute starts (hypercorn 0.18).

hypercorn 0.18.0's ``StreamBuffer`` (``hypercorn/protocol/h2.py``) lets an app write without
bound to a client that does not read: when the client's flow-control window is 0 the send task
calls ``pop(0)``, and ``pop`` wakes the writer whenever the bytes it *removed* are fewer than the
low-water mark (``b""`` is), although the buffer is still full; ``push`` also waits only once
instead of until the buffer is below the high-water mark. An app streaming to a stalled client
thus buffers the whole answer in memory.

:class:`BoundedStreamBuffer` fixes both: ``pop`` wakes the writer only once the buffer *left*
is below the low-water mark, and ``push`` waits until the buffer is below the high-water mark.
:class:`BoundedH2Protocol` uses it for its streams when its config has
``h2_bounded_stream_buffers = True``; :func:`install` puts it in ``hypercorn.protocol`` (where
hypercorn looks the HTTP/2 protocol class up for each connection). Servers whose config lacks
the flag, i.e. every hypercorn server llmroute does not start itself, are unchanged.

This module imports hypercorn (the ``server`` extra): import it only to serve.
"""

from __future__ import annotations

from typing import Any

import hypercorn.protocol
from hypercorn.protocol.h2 import (
    BUFFER_HIGH_WATER,
    BUFFER_LOW_WATER,
    BufferCompleteError,
    H2Protocol,
    StreamBuffer,
)

__all__ = ["CONFIG_FLAG", "BoundedH2Protocol", "BoundedStreamBuffer", "install"]

CONFIG_FLAG = "h2_bounded_stream_buffers"
"""The hypercorn config attribute that turns :class:`BoundedStreamBuffer` on."""


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


class BoundedH2Protocol(H2Protocol):
    """hypercorn's ``H2Protocol`` with :class:`BoundedStreamBuffer` send buffers, when its
    config has ``h2_bounded_stream_buffers = True``; otherwise hypercorn's own behaviour."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self.config, CONFIG_FLAG, False):
            self.stream_buffers = _BoundedBuffers(self.context.event_class)


def install() -> None:
    """Make new hypercorn HTTP/2 connections use :class:`BoundedH2Protocol` (or a subclass of
    it already installed, such as the simulator's). Idempotent; a server only changes
    behaviour when its config sets ``h2_bounded_stream_buffers``."""
    current = hypercorn.protocol.H2Protocol  # type: ignore[attr-defined]
    if not (isinstance(current, type) and issubclass(current, BoundedH2Protocol)):
        hypercorn.protocol.H2Protocol = BoundedH2Protocol  # type: ignore[misc]
