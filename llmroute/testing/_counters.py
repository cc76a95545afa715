"""The simulator's counters (``/_sim/stats``), its streams held before their first token
(``Profile.hold_first_token``, let go by ``/_sim/release``) and its open requests, which a closing
server ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["SimCounters"]


def _zero_stats() -> dict[str, Any]:
    return {
        "requests": 0,
        "chat_requests": 0,
        "responses_requests": 0,
        "streams_started": 0,
        "streams_completed": 0,
        "streams_cancelled": 0,
        "prompt_tokens": 0,
        "tokens_streamed": 0,
        "in_flight": 0,
        "peak_in_flight": 0,
        "held": 0,
        "faults": {},
    }


class SimCounters:
    """The counters of one simulator, read from other threads (``snapshot``), and what ends
    its held and open requests."""

    def __init__(self) -> None:
        self.values = _zero_stats()
        self.closing = False
        self.open: set[asyncio.Event] = set()
        """One event per open request (``_wire.watching``), set when the server closes."""
        self._release = asyncio.Event()  # set by release(): the streams held now go on

    def snapshot(self) -> dict[str, Any]:
        """A snapshot of the counters."""
        snap = dict(self.values)
        snap["faults"] = dict(self.values["faults"])
        return snap

    def reset(self) -> None:
        """Zero the counters (``in_flight`` and ``held`` are kept)."""
        fresh = _zero_stats()
        fresh["in_flight"] = fresh["peak_in_flight"] = self.values["in_flight"]
        fresh["held"] = self.values["held"]
        self.values = fresh

    def count(self, key: str, step: int = 1) -> None:
        """Add ``step`` to the counter ``key``."""
        self.values[key] += step

    def count_fault(self, kind: str) -> None:
        faults = self.values["faults"]
        faults[kind] = faults.get(kind, 0) + 1

    def ended_early(self) -> None:
        """A stream ended before its end: counted as cancelled unless the server is closing."""
        if not self.closing:
            self.values["streams_cancelled"] += 1

    @contextlib.contextmanager
    def in_flight(self, kind: str) -> Any:
        """One more request of ``kind`` counted, in flight while the block runs
        (``peak_in_flight`` keeps the most at once)."""
        stats = self.values
        stats[kind] += 1
        stats["in_flight"] += 1
        stats["peak_in_flight"] = max(stats["peak_in_flight"], stats["in_flight"])
        try:
            yield
        finally:
            self.values["in_flight"] -= 1

    def release(self) -> int:
        """Let every stream held before its first token go on; streams that come later are
        held until the next release. Returns how many were held. Call on the server's loop."""
        held = self.values["held"]
        event, self._release = self._release, asyncio.Event()
        event.set()
        return held

    async def hold(self, gone: asyncio.Event, most: float) -> bool:
        """Wait for the next release (``most`` seconds at most); True when the client left
        first."""
        self.values["held"] += 1
        waits = (asyncio.ensure_future(self._release.wait()), asyncio.ensure_future(gone.wait()))
        try:
            await asyncio.wait(waits, timeout=most, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.values["held"] -= 1
            for waiting in waits:
                waiting.cancel()
        return gone.is_set()

    def close(self) -> None:
        """End held, hanging and stalled requests at once (call on the server's loop)."""
        self.closing = True
        for event in list(self.open):
            event.set()
