"""Quiet shared simulators (and a client's cache) before counting on them.

A simulator shared by the session (``sim``, ``sim_slow``, ...) notices a client's cancel on its
own thread, some time after the client left: an earlier test's reset can land while a later test
runs. A test that reads a counter such as ``streams_cancelled`` as its starting point must wait
for the simulator to be idle first, else it counts the earlier test's reset as its own (and
``before + 1`` becomes ``before + 2``). ``in_flight`` drops only after a cancel was counted, so
``in_flight == 0`` means every earlier cancel is in the counters.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from llmroute.testing import Simulator

__all__ = ["settled", "settled_sync", "stored"]

_POLL = 0.02
_POLLS = 3000  # a hang guard only: 60 s of polls at the least


async def settled(sim: Simulator) -> None:
    """Wait until ``sim`` has no request in flight (so earlier cancels are counted)."""
    for _ in range(_POLLS):
        if sim.stats()["in_flight"] == 0:
            break
        await anyio.sleep(_POLL)
    assert sim.stats()["in_flight"] == 0, "the simulator never went idle"


def settled_sync(sim: Simulator) -> None:
    """:func:`settled` for tests without an event loop (the sync client's)."""
    for _ in range(_POLLS):
        if sim.stats()["in_flight"] == 0:
            break
        time.sleep(_POLL)
    assert sim.stats()["in_flight"] == 0, "the simulator never went idle"


async def stored(client: Any) -> None:
    """Wait until ``client``'s cache has stored the answers in flight (that happens after the
    callers have them), 10 s at most."""
    cache = client._cache
    assert cache is not None
    with anyio.move_on_after(10):
        while cache._flights:  # noqa: ASYNC110 - bounded poll of the cache's own state
            await anyio.sleep(0.005)
