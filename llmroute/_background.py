"""Work that must outlive the call that starts it: a shared upstream read, a stats sync.

anyio starts tasks only inside a task group, and an SDK call has none that outlives it: a
single-flight read must go on when the request that started it is cancelled, as long as an
identical request still reads it. :func:`spawn` starts such a task on the running event loop
(asyncio's ``create_task``, trio's system nursery). The task's own work runs in a cancel scope
of its owner's, which is how it is stopped; an exception it raises is logged, never lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["spawn"]

log = logging.getLogger("llmroute")

_running: set[Any] = set()  # asyncio keeps only weak references to tasks


async def _guarded(work: Callable[[], Awaitable[object]], name: str) -> None:
    try:
        await work()
    except Exception:
        log.exception("llmroute background task %s failed", name)


def spawn(work: Callable[[], Awaitable[object]], *, name: str) -> None:
    """Run ``work()`` in a new task of the running event loop, detached from the caller."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio's other backend, trio
        import trio

        trio.lowlevel.spawn_system_task(_guarded, work, name, name=f"llmroute:{name}")
        return
    task = loop.create_task(_guarded(work, name), name=f"llmroute:{name}")
    _running.add(task)
    task.add_done_callback(_running.discard)
