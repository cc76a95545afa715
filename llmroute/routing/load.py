"""One target's load as this client sees it (:class:`TargetLoad`): its attempts in flight, now
and over the last :data:`IN_FLIGHT_HISTORY` seconds, and its server's latest ``/metrics``
reading, which together say how busy the target's server is (``least-loaded`` and ``prefix``
rank by it). Kept beside a target's latency stats (:class:`~.target_stats.TargetStats`'s
``load``), apart from them: what a target predicts does not depend on it. No I/O, no tasks."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from typing import Final

from .stats_report import ServerMetrics

__all__ = ["IN_FLIGHT_HISTORY", "IN_FLIGHT_HISTORY_MAX", "FlightLog", "TargetLoad"]

IN_FLIGHT_HISTORY: Final = 60.0
"""Seconds of in-flight counts each target remembers, to add the requests sent since a
``/metrics`` reading was taken (readings older than that no longer count for load)."""
IN_FLIGHT_HISTORY_MAX: Final = 100_000
"""At most this many changes of the in-flight count are remembered per target."""


class FlightLog:
    """A target's attempts in flight over time: ``(time, count after the change)`` of the
    latest changes, the last :data:`IN_FLIGHT_HISTORY` seconds of them (at most
    :data:`IN_FLIGHT_HISTORY_MAX`), and the count before the oldest kept."""

    __slots__ = ("_before", "_changes")

    def __init__(self) -> None:
        self._changes: deque[tuple[float, int]] = deque()
        self._before = 0  # in flight before the oldest change kept

    def record(self, now: float, in_flight: int) -> None:
        """The count changed to ``in_flight`` at ``now``."""
        changes = self._changes
        changes.append((now, in_flight))
        horizon = now - IN_FLIGHT_HISTORY
        while changes and (changes[0][0] < horizon or len(changes) > IN_FLIGHT_HISTORY_MAX):
            self._before = changes.popleft()[1]

    def at(self, when: float) -> int:
        """The count at ``when``; before the oldest change kept, the count before it."""
        changes = self._changes
        index = bisect.bisect_right(changes, when, key=lambda change: change[0])
        return changes[index - 1][1] if index else self._before

    def __len__(self) -> int:
        return len(self._changes)


class TargetLoad:
    """One target's attempts in flight from this client and its server's latest reading."""

    __slots__ = ("_clock", "_flights", "in_flight", "server")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._flights = FlightLog()
        self.in_flight = 0
        """This client's attempts at the target now."""
        self.server: ServerMetrics | None = None
        """The latest reading of the target's own ``/metrics`` (self-hosted servers only)."""

    def started(self) -> None:
        """An attempt went out."""
        self.in_flight += 1
        self._flights.record(self._clock(), self.in_flight)

    def finished(self) -> None:
        """An attempt ended, however it ended."""
        self.in_flight = max(0, self.in_flight - 1)
        self._flights.record(self._clock(), self.in_flight)

    def in_flight_at(self, when: float) -> int:
        """This client's attempts in flight at time ``when`` (the clock's). Known for the
        last :data:`IN_FLIGHT_HISTORY` seconds; before that, the oldest count remembered."""
        return self._flights.at(when)

    def observe_server(self, metrics: ServerMetrics) -> bool:
        """Take a ``/metrics`` reading unless a newer one is already held (readings may arrive
        out of order); returns whether it was taken."""
        if self.server is not None and metrics.read_at < self.server.read_at:
            return False
        self.server = metrics
        return True

    def server_load(self, max_age: float) -> float | None:
        """The requests the server is working on per data-parallel rank, from its latest
        reading if younger than ``max_age`` seconds (else ``None``): queued + running at the
        reading, plus the change in this client's attempts in flight since it was taken (those
        started since are not in it, those finished since were), each counted once."""
        server = self.server
        if server is None or self._clock() - server.read_at > max_age:
            return None
        since = self.in_flight - self.in_flight_at(server.read_at)
        return max(0.0, (server.queued + server.running + since) / server.dp_size)
