"""What is known of one chat request when it ends: the record metrics and spans are made of."""

from __future__ import annotations

from dataclasses import dataclass

from .._types import RouteReport, Timings

__all__ = ["RequestRecord"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What is known of one chat request when it ends."""

    route: str
    outcome: str
    """``ok``, ``error``, ``interrupted`` (broke after tokens) or ``cancelled`` (the caller left
    before the end)."""
    stream: bool
    report: RouteReport | None = None
    timings: Timings | None = None
    target: str | None = None
    """The target of a request that is not routed (``report`` then has no attempts)."""

    @property
    def source(self) -> str:
        """``cache`` (replayed), ``shared`` (an identical call's answer) or ``live``."""
        report = self.report
        if report is not None:
            if report.cache_hit:
                return "cache"
            if report.shared:
                return "shared"
        return "live"

    @property
    def caller_ttft(self) -> float | None:
        """Time to first token as the caller saw it: the route's (hedges included), else the
        stream's own."""
        report = self.report
        if report is not None and report.ttft is not None:
            return report.ttft
        return self.timings.first_token if self.timings is not None else None
