"""Counting work instead of timing it: linearity checks that a busy machine cannot fail.

:func:`count_lines` runs a function under :func:`sys.settrace` and counts the Python lines it
executes, in every frame it reaches (llmroute's and the libraries'). The count depends only on
the code and its input, never on the machine's load: the same input gives the same count.
Work done inside C (a ``bytes.find``, a slice copy) is not a line, so tests whose risk lies there
also count the bytes their buffers scan (``ScanCountingBuffer``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["ScanCountingBuffer", "assert_linear_work", "count_lines"]


def count_lines(work: Callable[[], object]) -> int:
    """The Python lines ``work()`` executes (its own and every function it calls)."""
    lines = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        work()
    finally:
        sys.settrace(previous)
    return lines


def assert_linear_work(
    make: Callable[[int], Callable[[], int]], n: int, *, factor: int = 4, slack: float = 1.5
) -> None:
    """``make(n)()`` returns the work done on an input of size ``n``; at ``factor * n`` it must
    be at most ``factor * slack`` times as much (linear: ``factor``; quadratic: ``factor**2``).

    Each is measured once after a warm-up run at ``n``, which pays for imports and caches.
    """
    make(n)()
    small = make(n)()
    large = make(factor * n)()
    assert small > 0
    ratio = large / small
    assert ratio <= factor * slack, (
        f"{large} units of work at {factor}n against {small} at n (n={n}): ratio {ratio:.2f}, "
        f"linear would be {factor}, quadratic {factor * factor}"
    )


class ScanCountingBuffer(bytearray):
    """A ``bytearray`` that counts the bytes its operations touch (:attr:`scanned`).

    Appends count the bytes appended; ``find``/``rfind`` the bytes between their bounds; slices,
    ``strip`` and ``bytes()`` of a slice the bytes copied; a deletion the bytes that stay (an
    upper bound: CPython moves none when deleting from the front). A decoder that rescans or
    recopies its whole buffer for every chunk shows up here as quadratic, whatever its lines.
    """

    scanned: int = 0

    def __iadd__(self, other: Any) -> ScanCountingBuffer:  # type: ignore[override]
        self.scanned += len(other)
        super().__iadd__(other)
        return self

    def _span(self, start: int | None, end: int | None) -> int:
        begin, stop, _ = slice(start, end).indices(len(self))
        return max(0, stop - begin)

    def find(self, sub: Any, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        self.scanned += self._span(start, end)
        return super().find(sub, start, end)

    def rfind(self, sub: Any, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        self.scanned += self._span(start, end)
        return super().rfind(sub, start, end)

    def __getitem__(self, item: Any) -> Any:
        value = super().__getitem__(item)
        if isinstance(item, slice):
            self.scanned += len(value)
        return value

    def __delitem__(self, item: Any) -> None:
        super().__delitem__(item)
        self.scanned += len(self)

    def strip(self, chars: Any = None) -> bytearray:  # type: ignore[override]
        self.scanned += len(self)
        return super().strip(chars)
