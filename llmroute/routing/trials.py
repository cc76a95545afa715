"""Background trials of open circuits: a target that recovered serves again within seconds.

While a target's circuit is open, a task owned by the router (not by any request) sends it the
catalog's cheapest request for its vendor (:class:`~llmroute._catalog.Trial`: one output token,
not streamed) each time the breaker says a trial is due: ``breaker_cooldown`` after the circuit
opened, then after each failed trial the interval doubled, up to ``breaker_max_cooldown`` (and
never before a 429's Retry-After has passed). One task per target, one trial at a time: never
more than one in flight per target. A successful trial closes the circuit and the task ends; a
failed one re-opens it. Requests never wait on a trial nor see its failure: while the circuit
is not closed they are not sent to the target at all (``CircuitBreaker.trials_in_background``).
:meth:`CircuitTrials.aclose` (the client's ``close()``) cancels every task and waits for it.
"""

from __future__ import annotations

import collections
import functools
import logging
from typing import Any

import anyio

from .._background import spawn
from .engine import Router, RouteTarget, Sender
from .health import CLOSED, failure_party

__all__ = ["TRIAL_PROMPT", "TRIAL_TIMEOUT", "CircuitTrials"]

log = logging.getLogger("llmroute")

TRIAL_TIMEOUT = 10.0
"""Seconds a trial may take before it counts as failed (a target that hangs is not back)."""
TRIAL_PROMPT = "Hi"
"""The trial's one user message: a prompt of a few tokens."""


class CircuitTrials:
    """The background trials of one router's open circuits, sent with ``send``.

    :meth:`start` is called when a circuit opens (and, idempotently, when a request is planned
    over a route with an open circuit); :meth:`nudge` makes the waiting tasks read the router's
    clock again (a test's clock moved, a cooldown changed); :meth:`aclose` ends them all.
    """

    def __init__(self, router: Router, send: Sender, *, timeout: float = TRIAL_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.router = router
        self.timeout = timeout
        self.sent: collections.Counter[str] = collections.Counter()
        """Trials sent, by target."""
        self.verdicts: collections.Counter[tuple[str, str]] = collections.Counter()
        """Trials ended, by target and verdict (``closed``, ``failed``, ``none``)."""
        self._send = send
        self._tasks: dict[str, anyio.CancelScope] = {}
        self._wake: anyio.Event | None = None
        self._idle: anyio.Event | None = None
        self._closed = False
        router.attach_trials(self)

    @property
    def running(self) -> frozenset[str]:
        """The targets whose trials are going (their circuit is open)."""
        return frozenset(self._tasks)

    def start(self, target: RouteTarget) -> None:
        """Make sure ``target``'s trials are going (a no-op if they are, or once closed)."""
        name = target.name
        if self._closed or name in self._tasks:
            return
        scope = self._tasks[name] = anyio.CancelScope()
        try:
            spawn(functools.partial(self._run, target, scope), name=f"trial {name}")
        except RuntimeError:  # no event loop here: the next planned request starts them
            del self._tasks[name]

    def nudge(self) -> None:
        """Wake the waiting tasks: each reads the clock again and sends its trial if due."""
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.set()

    async def aclose(self) -> None:
        """Cancel every trial (an HTTP/2 trial's stream is reset) and wait for the tasks."""
        self._closed = True
        if not self._tasks:
            return
        idle = self._idle = anyio.Event()
        for scope in self._tasks.values():
            scope.cancel()
        with anyio.move_on_after(30):  # a hang guard: a cancelled task ends at once
            await idle.wait()

    async def _run(self, target: RouteTarget, scope: anyio.CancelScope) -> None:
        name = target.name
        failure_party.set(None)  # a trial is nobody's: the task copied its starter's context
        health = self.router.health(name)
        try:
            with scope:
                # Each turn waits for the due time or sends one trial, whose verdict moves the
                # due time on (or closes the circuit): bounded in rate, ended by the circuit
                # closing or the client closing.
                while not self._closed:
                    due = health.trial_due_in()
                    if due is None:
                        if health.breaker.shared_state == CLOSED:
                            return
                        due = self.timeout  # not ours to send (cannot happen): look again
                    if due > 0:
                        await self._sleep(due)
                    elif health.breaker.acquire_trial():
                        await self._trial(target)
        finally:
            if self._tasks.get(name) is scope:
                del self._tasks[name]
            if not self._tasks and self._idle is not None:
                self._idle.set()

    async def _sleep(self, seconds: float) -> None:
        wake = self._wake
        if wake is None:
            wake = self._wake = anyio.Event()
        with anyio.move_on_after(seconds):
            await wake.wait()

    async def _trial(self, target: RouteTarget) -> None:
        name = target.name
        body: dict[str, Any] = {
            "model": target.model,
            "messages": [{"role": "user", "content": TRIAL_PROMPT}],
            **target.trial,
        }
        self.sent[name] += 1
        try:
            with anyio.fail_after(self.timeout):
                response, _ = await self._send(target, body, stream=False, continuation=False)
            with anyio.CancelScope(shield=True):
                await response.aclose()
        except Exception as exc:
            verdict = self.router.record_trial(name, exc)
        except BaseException:
            self.router.health(name).breaker.release()
            raise
        else:
            verdict = self.router.record_trial(name, None)
        self.verdicts[name, verdict] += 1
        if verdict == "closed":
            log.info("llmroute: a trial found %s answering: its circuit is closed", name)
