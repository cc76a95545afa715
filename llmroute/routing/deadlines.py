"""Deadlines an attempt is held to: for its first token, from the target's live p99 TTFT; between
chunks, from the target's live pauses or, while it has too few, the stream's own. Pure functions
of the figures :class:`~llmroute.routing.stats.LiveStats` measures."""

from __future__ import annotations

__all__ = [
    "FIRST_TOKEN_FLOOR",
    "FIRST_TOKEN_MULTIPLE",
    "STALL_FLOOR",
    "STALL_MULTIPLE",
    "STALL_PRIOR",
    "STALL_STREAM_FLOOR",
    "STALL_STREAM_GAPS",
    "STALL_STREAM_MULTIPLE",
    "first_token_deadline",
    "stall_deadline",
    "stream_stall_deadline",
]

STALL_MULTIPLE = 4.0
"""The deadline between chunks is this many times a target's p99 longest pause per stream."""
STALL_FLOOR = 2.0
"""Seconds: the deadline between chunks is never shorter."""
STALL_PRIOR = 10.0
"""Seconds: the deadline between chunks of a target with too few streams measured."""


STALL_STREAM_GAPS = 4
"""Pauses between chunks a stream must have shown before its own deadline rule applies (while
its target has too few streams measured for :func:`stall_deadline`)."""
STALL_STREAM_MULTIPLE = 8.0
"""A stream's own deadline between chunks is this many times its longest pause so far."""
STALL_STREAM_FLOOR = 4.0
"""Seconds: a stream's own deadline between chunks is never shorter. Above the pauses seen
mid-answer from vendors under load and from a self-hosted server that prefills other requests
between decode steps (chunked prefill: well under a second a step), which are 1 to 3 s at worst."""


def stream_stall_deadline(
    longest_gap: float,
    first_token: float | None,
    *,
    prior: float,
    multiple: float = STALL_STREAM_MULTIPLE,
    floor: float = STALL_STREAM_FLOOR,
) -> float:
    """Seconds a stream whose target has no live pause statistics may send nothing, once it
    has shown :data:`STALL_STREAM_GAPS` pauses: ``multiple`` times its longest pause so far, at
    least ``floor`` and at least its own time to first token (a server that prefilled this
    prompt that long may pause as long to prefill another), at most ``prior`` (the deadline it
    had: the rule only shortens it)."""
    return min(prior, max(floor, multiple * longest_gap, first_token or 0.0))


def stall_deadline(
    gap_p99: float | None,
    *,
    cap: float,
    multiple: float = STALL_MULTIPLE,
    floor: float = STALL_FLOOR,
    prior: float = STALL_PRIOR,
) -> float:
    """Seconds a stream may send nothing before it counts as stalled: ``multiple`` times the
    target's p99 longest pause between chunks, at least ``floor``, at most ``cap``; ``prior``
    (capped) while there is no such statistic."""
    if gap_p99 is None:
        return min(prior, cap)
    return min(cap, max(floor, multiple * gap_p99))


FIRST_TOKEN_MULTIPLE = 4.0
"""The live first-token deadline is this many times the target's p99 TTFT for the prompt's
length class."""
FIRST_TOKEN_FLOOR = 5.0
"""Seconds: the live first-token deadline is never shorter."""


def first_token_deadline(
    ttft_p99: float | None,
    *,
    cap: float,
    multiple: float = FIRST_TOKEN_MULTIPLE,
    floor: float = FIRST_TOKEN_FLOOR,
) -> float:
    """Seconds an attempt may wait for its first token: ``multiple`` times the target's live
    p99 TTFT for the prompt's class, at least ``floor``, at most ``cap`` (the route's
    ``first_token_timeout``); ``cap`` itself while the class has too few samples."""
    if ttft_p99 is None:
        return cap
    return min(cap, max(floor, multiple * ttft_p99))
