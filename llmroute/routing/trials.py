"""Background trials of open circuits: a target that recovered serves again within seconds.

While a target's circuit is open, a task owned by the router (not by any request) sends it a
cheap request of the kind it is used for (:func:`trial_body`: the kind of call whose failure
last counted against it; a chat trial is the catalog's :class:`~llmroute._catalog.Trial`, one
output token, not streamed) each time the breaker says a trial is due: ``breaker_cooldown``
after the circuit opened, then after each failed trial the interval doubled, up to
``breaker_max_cooldown`` (and never before a 429's Retry-After has passed). One task per
target, one trial at a time: never more than one in flight per target. A trial the server
answers closes the circuit and the task ends (see :meth:`Router.record_trial`); a failed one
re-opens it. Requests never wait on a trial nor see its failure: while the circuit is not
closed they are not sent to the target at all (``CircuitBreaker.trials_in_background``).
A task also ends once no request was planned over its target for ``idle`` seconds, and at its
next turn once the client is dropped without ``close()`` (:meth:`CircuitTrials.abandon`); the
next request planned over the target starts it again.
:meth:`CircuitTrials.aclose` (the client's ``close()``) cancels every task and waits for it.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import anyio

from .._background import spawn
from .engine import Router
from .health import CLOSED, failure_party
from .route import RouteTarget, Sender

__all__ = ["TRIAL_IDLE", "TRIAL_PROMPT", "TRIAL_TIMEOUT", "CircuitTrials", "trial_body"]

log = logging.getLogger("llmroute")

TRIAL_TIMEOUT = 10.0
"""Seconds a trial may take before it counts as failed (a target that hangs is not back)."""
TRIAL_PROMPT = "Hi"
"""The trial's one user message (or input): a prompt of a few tokens."""
TRIAL_IDLE = 300.0
"""Seconds without a request planned over a target after which its trials stop (until the
next request planned over it starts them again)."""


def trial_body(target: RouteTarget, kind: str) -> dict[str, Any]:
    """The trial of ``target`` for a call of ``kind``: the smallest request of that endpoint.
    A chat trial adds the catalog's fields (``target.trial``); a Responses trial asks for 16
    output tokens (OpenAI's least ``max_output_tokens``); an embeddings trial embeds one word."""
    if kind == "responses":
        return {"model": target.model, "input": TRIAL_PROMPT, "max_output_tokens": 16}
    if kind == "embeddings":
        return {"model": target.model, "input": TRIAL_PROMPT}
    if kind == "completions":
        return {"model": target.model, "prompt": TRIAL_PROMPT, "max_tokens": 1}
    return {
        "model": target.model,
        "messages": [{"role": "user", "content": TRIAL_PROMPT}],
        **target.trial,
    }


class CircuitTrials:
    """The background trials of one router's open circuits, a call of each kind sent with
    ``senders(kind)``; ``keyed(target)``: whether the target has a key of its own (else a
    401 or 403 only says a caller's key is needed: the server is up).

    :meth:`start` is called when a circuit opens (and, idempotently, when a request is planned
    over a route with an open circuit); :meth:`nudge` makes the waiting tasks read the router's
    clock again (a test's clock moved, a cooldown changed); :meth:`aclose` ends them all.
    """

    def __init__(
        self,
        router: Router,
        senders: Callable[[str], Sender],
        *,
        keyed: Callable[[RouteTarget], bool] = lambda target: True,
        timeout: float = TRIAL_TIMEOUT,
        idle: float = TRIAL_IDLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not idle > 0:
            raise ValueError(f"idle must be positive, got {idle!r}")
        self.router = router
        self.timeout = timeout
        self.idle = idle
        """Seconds without a request planned over a target after which its task ends."""
        self.sent: collections.Counter[str] = collections.Counter()
        """Trials sent, by target."""
        self.verdicts: collections.Counter[tuple[str, str]] = collections.Counter()
        """Trials ended, by target and verdict (``closed``, ``failed``, ``none``)."""
        self._senders = senders
        self._keyed = keyed
        self._clock = clock
        self._planned: dict[str, float] = {}  # when a request was last planned, by target
        self._tasks: dict[str, anyio.CancelScope] = {}
        self._wakes: set[anyio.Event] = set()  # one per sleeping task, made in its own loop
        self._idle: anyio.Event | None = None
        self._closed = False
        router.attach_trials(self)

    @property
    def running(self) -> frozenset[str]:
        """The targets whose trials are going (their circuit is open)."""
        return frozenset(self._tasks)

    def start(self, target: RouteTarget, *, planned: bool = True) -> None:
        """Make sure ``target``'s trials are going (a no-op if they are, or once closed).
        ``planned``: a request was planned over the target (the task's idle time restarts);
        else its circuit (re-)opened, which a failed trial does too."""
        name = target.name
        if planned or name not in self._tasks:
            self._planned[name] = self._clock()
        if self._closed or name in self._tasks:
            return
        scope = self._tasks[name] = anyio.CancelScope()
        try:
            spawn(functools.partial(self._run, target, scope), name=f"trial {name}")
        except RuntimeError:  # no event loop here: the next planned request starts them
            del self._tasks[name]

    def abandon(self) -> None:
        """The client owning the trials was dropped without ``close()``: each task ends at its
        next turn, as if nobody had asked for its target for long (a request planned later,
        by a copy of the client, starts it again). Safe to call from a finalizer."""
        self._planned.clear()

    def nudge(self) -> None:
        """Wake the waiting tasks: each reads the clock again and sends its trial if due."""
        wakes, self._wakes = self._wakes, set()
        for wake in wakes:
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
                # closing, the client closing or no request planned over the target for long.
                while not self._closed:
                    due = health.trial_due_in()
                    if due is None:
                        if health.breaker.shared_state == CLOSED:
                            return
                        due = self.timeout  # not ours to send (cannot happen): look again
                    idle_in = self._planned.get(name, -math.inf) + self.idle - self._clock()
                    if idle_in <= 0:
                        return  # nobody asks for the target: the next planned request restarts
                    due = min(due, idle_in)
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
        wake = anyio.Event()  # this task's own: an event is bound to the loop that awaits it
        self._wakes.add(wake)
        try:
            with anyio.move_on_after(seconds):
                await wake.wait()
        finally:
            self._wakes.discard(wake)

    async def _trial(self, target: RouteTarget) -> None:
        name = target.name
        kind = self.router.health(name).kind
        body = trial_body(target, kind)
        self.sent[name] += 1
        try:
            with anyio.fail_after(self.timeout):
                response, _ = await self._senders(kind)(
                    target, body, stream=False, continuation=False
                )
            with anyio.CancelScope(shield=True):
                await response.aclose()
        except Exception as exc:
            verdict = self.router.record_trial(name, exc, keyed=self._keyed(target))
        except BaseException:
            self.router.health(name).breaker.release()
            raise
        else:
            verdict = self.router.record_trial(name, None)
        self.verdicts[name, verdict] += 1
        if verdict == "closed":
            log.info("llmroute: a trial found %s answering: its circuit is closed", name)
