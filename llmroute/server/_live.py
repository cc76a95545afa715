"""The gateway's live page (``[gateway] live_page = true``): a static page under ``/admin/live``
whose script asks ``/admin/live/data`` (an admin key in ``Authorization``) every second.

The data are samples of what the client already measures (``client.stats()`` and the counters
of ``client.metrics``) kept in a ring. A sample is taken only when the data are asked for, at
most once per ``interval``: with nobody watching nothing is sampled, no task runs and no timer
fires, so the page costs the gateway nothing then. A viewer asks for the samples after the last
one it holds (``?since=<seq>``), so each answer carries one sample, not the whole ring.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, Final

from ..config import Config
from ..metrics import ClientMetrics
from ..routing.stats import TargetSnapshot

__all__ = ["LIVE_FILES", "LivePage", "LiveView"]

INTERVAL: Final = 1.0
"""Seconds between samples (at most one per interval, however many viewers ask)."""
KEEP: Final = 300
"""Samples kept: five minutes at one a second (a viewer's first answer holds them all, about
1 MB with 20 targets; each later one holds the samples it has not seen)."""

LIVE_FILES: Final = {
    "/admin/live": ("live.html", "text/html; charset=utf-8"),
    "/admin/live/live.js": ("live.js", "text/javascript; charset=utf-8"),
    "/admin/live/live.css": ("live.css", "text/css; charset=utf-8"),
}
"""The page's static files by path: (file name in ``llmroute/server/live``, content type)."""

PAGE_HEADERS: Final = {
    # Nothing but the gateway itself: no CDN, no inline script, no framing by another site.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
"""Headers of the page's files and of its data."""

_ERROR_CAUSES: Final = ("error", "timeout", "rate_limited", "interrupted")


class LivePage:
    """The page's static files, read once from the package."""

    def __init__(self) -> None:
        folder = resources.files("llmroute.server") / "live"
        self.files = {
            path: ((folder / name).read_bytes(), content_type)
            for path, (name, content_type) in LIVE_FILES.items()
        }


class LiveView:
    """Samples of the client's live figures, taken only while someone asks for them.

    ``stats`` and ``metrics`` are the client's (``client.stats``, ``client.metrics``); ``usage``
    and ``slo`` give the gateway's per-key usage and objectives, read per answer (not sampled).
    ``clock`` (monotonic) decides when a sample is due; ``wall`` stamps it for the page.
    """

    def __init__(
        self,
        config: Config,
        stats: Callable[[], Mapping[str, TargetSnapshot]],
        metrics: ClientMetrics,
        usage: Callable[[], Awaitable[dict[str, Any]]],
        slo: Callable[[], dict[str, Any]],
        *,
        interval: float = INTERVAL,
        keep: int = KEEP,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._stats = stats
        self._metrics = metrics
        self._usage = usage
        self._slo = slo
        self.interval = interval
        self._clock = clock
        self._wall = wall
        self.replica = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        """This process's view (``--workers`` runs several): a viewer that meets another one
        starts its samples afresh rather than mixing two processes' counters."""
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)
        self.seq = 0
        self.sampled = 0
        """Samples taken since the start (a test counts them)."""
        self._last: float | None = None
        self._ttft_le: list[str] = []
        """The upper bounds of the callers' TTFT buckets (the histogram's, fixed)."""
        self.routes = {
            name: {"policy": route.policy, "targets": list(route.targets)}
            for name, route in config.models.items()
        }
        self.tiered = {
            name: {"tiers": dict(tiered.tiers), "default": tiered.default}
            for name, tiered in config.tiered.items()
        }

    def due(self) -> bool:
        """Whether a sample is due now (the last one is at least ``interval`` old)."""
        return self._last is None or self._clock() - self._last >= self.interval * 0.9

    def sample(self) -> dict[str, Any]:
        """Take one sample now: every target's live percentiles, state and counters, every
        route's counters."""
        self._last = self._clock()
        counts = self._metrics.counts()
        targets: dict[str, Any] = {}
        for name, snap in self._stats().items():
            targets[name] = {
                "n": snap.n,
                "p50": _round(snap.ttft_p50),
                "p95": _round(snap.ttft_p95),
                "p99": _round(snap.ttft_p99),
                "in_flight": snap.in_flight,
                "breaker": snap.breaker,
                "error_rate": _round(snap.error_rate),
                "attempts": {},
            }
        for (target, reason, outcome), value in counts["attempts"].items():
            entry = targets.setdefault(target, {"attempts": {}})
            entry["attempts"].setdefault(reason, {})[outcome] = int(value)
        routes: dict[str, Any] = {}

        def route(name: str) -> dict[str, Any]:
            return routes.setdefault(name, {"requests": {}, "cache": {}})

        for (name, outcome, source), value in counts["requests"].items():
            requests = route(name)["requests"]
            requests[f"{outcome}/{source}"] = int(value)
        for field in ("hedges_fired", "hedges_won", "hedges_denied", "continuations"):
            for (name,), value in counts[field].items():
                route(name)[field] = int(value)
        for (name, kind), value in counts["cache_hits"].items():
            route(name)["cache"][kind] = int(value)
        buckets: dict[str, dict[str, int]] = {}
        for (name, _source, le), value in counts.get("request_ttft_buckets", {}).items():
            # The callers' TTFT (hedges, failovers and cache hits included), every source.
            by_le = buckets.setdefault(name, {})
            by_le[le] = by_le.get(le, 0) + int(value)
            if le not in self._ttft_le:
                self._ttft_le = sorted({*self._ttft_le, le}, key=float)
        for name, by_le in buckets.items():
            # Cumulative counts in the order of ``ttft_le`` (the answer's): fewer bytes.
            route(name)["ttft_buckets"] = [by_le.get(le, 0) for le in self._ttft_le]
        tiers = [
            {"model": m, "class": c, "tier": t, "reason": r, "n": int(value)}
            for (m, c, t, r), value in counts["tier_decisions"].items()
        ]
        self.seq += 1
        self.sampled += 1
        sample = {
            "seq": self.seq,
            "t": round(self._wall(), 3),
            "targets": targets,
            "routes": routes,
            "tiers": tiers,
        }
        self.samples.append(sample)
        return sample

    async def data(self, since: int = 0) -> dict[str, Any]:
        """The answer of ``/admin/live/data``: the samples after ``since`` (a new one taken if
        due), the routes and their targets, per-key usage and the objectives now."""
        if self.due():
            self.sample()
        return {
            "object": "llmroute.live",
            "replica": self.replica,
            "interval": self.interval,
            "keep": self.samples.maxlen,
            "seq": self.seq,
            "routes": self.routes,
            "tiered": self.tiered,
            "ttft_le": self._ttft_le,
            "samples": [s for s in self.samples if s["seq"] > since],
            "usage": (await self._usage())["keys"],
            "slo": self._slo()["series"],
        }


def _round(seconds: float | None) -> float | None:
    """A latency (or a rate) to 0.1 ms (or 0.01%): what the page shows, in fewer bytes."""
    return None if seconds is None else round(seconds, 4)


def since_of(value: str) -> int:
    """The sequence number a viewer holds samples up to (its ``x-llmroute-live-since``
    header), 0 when absent or not a number."""
    value = value.strip()
    return int(value) if value.isdigit() and len(value) < 19 else 0
