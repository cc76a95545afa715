"""What the attempts of one race share (:class:`Race`): the winner, the failures so far, what
to try again, and a wake-up for the coordinator (:mod:`.coordinator`)."""

from __future__ import annotations

import anyio

from .answer import Ready

__all__ = ["Race"]


class Race:
    """What the attempts of one race share: the winner and a wake-up for the coordinator."""

    def __init__(self) -> None:
        self.winner: Ready | None = None
        self.live = 0
        self.failures: dict[str, BaseException] = {}
        self.last: BaseException | None = None
        self.final: Exception | None = None
        """The request itself is at fault (it cannot be encoded, or a target refused it as
        invalid): the race ends with this error, raised to the caller unchanged."""
        self.again: tuple[str, float] | None = None
        """A target to try again, and when (the event loop's clock): an ordered route's
        primary after a short Retry-After or a 5xx."""
        self.refused_at: int | None = None
        """The largest declared context window that answered a context-length error: only
        targets with a larger one are tried after it."""
        self.continuing = False
        """A race for a continuation: a target that refuses the request (a 400 or 422 for
        its form) hands over to the next continuation target instead of ending the race."""
        self.running_on: list[tuple[anyio.CancelScope, float]] = []
        """Probes in tasks of their own, each with the time (the event loop's clock) it gives
        up at once the race is decided (:meth:`decided`)."""
        self._event = anyio.Event()

    def decided(self) -> None:
        """The race has its winner (or has failed): its probes wait no longer than their
        patience."""
        for scope, until in self.running_on:
            scope.deadline = until

    def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._event.wait()
        self._event = anyio.Event()
