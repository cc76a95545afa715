"""The stats file: a fresh client starts from the samples the last one learnt.

:class:`StatsFile` writes a :class:`~llmroute.routing.stats.LiveStats`' samples to a JSON file
when the client closes and seeds a new client's stats from it when it starts
(``[routing] stats_file``, docs/routing.md "Starting warm"). The samples are the events that
shared stats exchange through Redis (:data:`~llmroute.routing.stats.SampleEvent`, recorded by
:meth:`LiveStats.apply <llmroute.routing.stats.LiveStats.apply>`), each with its age::

    {"version": 1, "written_at": 1796608800.0,
     "targets": {"fast:sim-small": {"ages": [41.2, 3.5],
                                    "events": [["fast:sim-small", "t", 0.12, 0], ...]}}}

``written_at`` is Unix time; ``ages`` are seconds before it, one per event, oldest first. A
target is named as the config names it (``provider:model``): no URL, no key. The file is
written to a temporary file beside it and renamed over it (mode 0600): several processes
sharing one file each leave a whole file, the last to close wins. It is a cache: a missing
file starts cold silently; an unreadable, corrupt or other-version file starts cold with a
warning naming it; nothing in it is a reason not to start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Final, cast

from .stats import LiveStats, SampleEvent

__all__ = ["STATS_FILE_VERSION", "StatsFile"]

STATS_FILE_VERSION: Final = 1
"""The file's format; a file of another version is ignored (with a warning)."""

logger = logging.getLogger("llmroute.routing.snapshot")


class StatsFile:
    """The stats file at ``path``; samples older than ``max_age`` seconds are not read.

    ``wall``: the Unix clock the ages are measured on (a test's); ``clock``: the stats' own
    clock (``time.monotonic``), which the samples' times are on.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_age: float,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_age > 0:
            raise ValueError(f"max_age must be positive, got {max_age!r}")
        self.path = Path(path)
        self.max_age = max_age
        self._wall = wall
        self._clock = clock
        self._read_at: float | None = None  # the stats' clock when load() seeded them
        self._oldest: dict[str, float] = {}  # each target's oldest sample's age, then

    def _cold(self, why: str) -> None:
        logger.warning(
            "stats file %s %s: starting cold (it is rewritten when the client closes; "
            "delete it, or fix [routing] stats_file, to silence this)",
            self.path,
            why,
        )

    def read(self) -> dict[str, list[tuple[float, SampleEvent]]]:
        """The file's samples younger than ``max_age``, as ``(age in seconds, event)`` by
        target, oldest first; ``{}`` (with a warning, unless there is no file) when it cannot
        be used."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            self._cold(f"cannot be read ({type(exc).__name__}: {exc})")
            return {}
        try:
            data = json.loads(text)
        except ValueError as exc:
            self._cold(f"is not JSON ({exc})")
            return {}
        if not isinstance(data, dict):
            self._cold("is not a stats file (not a JSON object)")
            return {}
        data = cast(dict[str, Any], data)
        version = data.get("version")
        if version != STATS_FILE_VERSION:
            self._cold(f"is version {version!r}; this llmroute reads version {STATS_FILE_VERSION}")
            return {}
        written_at, targets = data.get("written_at"), data.get("targets")
        if not _number(written_at) or not isinstance(targets, dict):
            self._cold("is corrupt (no written_at or targets)")
            return {}
        since = max(0.0, self._wall() - cast(float, written_at))
        kept: dict[str, list[tuple[float, SampleEvent]]] = {}
        for name, entry in cast(dict[str, Any], targets).items():
            samples = _entry(entry)
            if samples is None:
                self._cold(f"is corrupt (the entry of {name!r})")
                return {}
            young = [(age + since, e) for age, e in samples if age + since <= self.max_age]
            if young:
                kept[name] = young
        return kept

    def load(self, stats: LiveStats, targets: Collection[str]) -> int:
        """Seed ``stats`` (a fresh client's) with the file's samples of ``targets`` that are
        young enough (:meth:`LiveStats.seed`); returns how many were recorded."""
        read = {name: samples for name, samples in self.read().items() if name in targets}
        events = [
            event
            for name, samples in read.items()
            for _, event in samples
            if event and event[0] == name
        ]
        seeded = stats.seed(events, targets)
        self._read_at = self._clock()
        self._oldest = {name: max(age for age, _ in samples) for name, samples in read.items()}
        return seeded

    def save(self, stats: LiveStats, targets: Collection[str]) -> int:
        """Write the samples ``stats`` holds of ``targets`` (:meth:`dump`, :meth:`write`);
        returns how many. Raises ``OSError`` when the file cannot be written."""
        text, count = self.dump(stats, targets)
        self.write(text)
        return count

    def dump(self, stats: LiveStats, targets: Collection[str]) -> tuple[str, int]:
        """The file's text for the samples ``stats`` holds of ``targets``, and how many (read
        where the stats are kept: the event loop's thread)."""
        now, wall = self._clock(), self._wall()
        entries: dict[str, dict[str, list[Any]]] = {}
        count = 0
        for name, samples in stats.saved_samples().items():
            if name not in targets:
                continue
            entries[name] = {
                "ages": [round(self._age(name, when, now), 3) for when, _ in samples],
                "events": [list(event) for _, event in samples],
            }
            count += len(samples)
        data = {"version": STATS_FILE_VERSION, "written_at": wall, "targets": entries}
        return json.dumps(data, separators=(",", ":"), allow_nan=False), count

    def write(self, text: str) -> None:
        """Replace the file with ``text`` atomically: a temporary file beside it (mode 0600),
        synced, renamed over it; its folder made if missing. Raises ``OSError``."""
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp made it 0600
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def _age(self, name: str, when: float, now: float) -> float:
        """A sample's age: since it was recorded; for one read from the file (recorded when the
        file was read), plus the age its target's oldest sample had then. So a sample written
        back is never younger than it is (older by at most the spread of its target's ages in
        the file: a window), and clients that start and close without a request do not make
        the file's samples young again: they expire at ``max_age`` or sooner."""
        age = max(0.0, now - when)
        if self._read_at is not None and when <= self._read_at:
            age += self._oldest.get(name, 0.0)
        return age


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _entry(entry: object) -> list[tuple[float, SampleEvent]] | None:
    """One target's ``{"ages": [...], "events": [...]}``, or ``None`` when malformed (an
    event's own values are checked when it is recorded: a bad one is skipped then)."""
    if not isinstance(entry, dict):
        return None
    ages, events = (
        cast(dict[str, Any], entry).get("ages"),
        cast(dict[str, Any], entry).get("events"),
    )
    if not isinstance(ages, list) or not isinstance(events, list):
        return None
    ages, events = cast(list[Any], ages), cast(list[Any], events)
    if len(ages) != len(events):
        return None
    if not all(_number(age) and age >= 0 for age in ages):
        return None
    if not all(isinstance(event, list) for event in events):
        return None
    return list(zip(cast(list[float], ages), cast(list[SampleEvent], events), strict=True))
