"""Before and after in one run: one child process per tree (``PYTHONPATH`` = that tree), in
rotated order each round, and the ratio of the two with its spread over the rounds.

Used by ``routed_stream.py --baseline`` and ``per_request.py --baseline``: each child measures
its own CPU time and prints one JSON line last; the rounds put the two trees' measurements
seconds apart, since absolute times drift on a shared machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def tree_child(tree: Path, argv: Sequence[str], *, timeout: float = 600) -> dict[str, Any]:
    """``python *argv`` with ``tree`` first on the path (from ``/``, so no folder shadows it,
    without ``$LLMROUTE_CONFIG``); the last line it prints, as JSON. SystemExit with its
    stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "LLMROUTE_CONFIG"}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout, cwd="/"
    )
    if done.returncode != 0:
        raise SystemExit(f"child for {tree} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rotated(names: Sequence[T], round_: int) -> list[T]:
    """``names`` starting at ``round_`` (mod their number): each goes first in turn."""
    k = round_ % len(names)
    return [*names[k:], *names[:k]]


def interleaved(
    trees: dict[str, Path],
    rounds: int,
    measure: Callable[[Path], dict[str, Any]],
    show: Callable[[int, dict[str, dict[str, Any]]], None] | None = None,
) -> list[dict[str, dict[str, Any]]]:
    """``measure(tree)`` for every tree each round, in rotated order; one {name: result} a
    round (``show`` is called with each as it ends)."""
    out = []
    for r in range(rounds):
        row = {name: measure(trees[name]) for name in rotated(list(trees), r)}
        out.append(row)
        if show is not None:
            show(r, row)
    return out


def ratio(this: Sequence[float], baseline: Sequence[float]) -> dict[str, float]:
    """The per-round ratios this/baseline: median, min and max."""
    ratios = [a / b for a, b in zip(this, baseline, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
