"""Target health: a circuit breaker over consecutive failures, plus Retry-After cooldowns.

Pure state machines driven by an injectable ``clock``. Which failures count against a target is
the caller's decision; these classes only keep score.

Attribution: a caller serving several parties (the gateway's keys) sets :data:`failure_party`
around each request. A breaker then opens for everyone only when failures of at least two
parties make up the run that reaches the threshold; failures of one party alone open that
party's own breaker, so one tenant's bad requests stop that tenant, not the others.

An open circuit puts its target last; it never refuses a request's last chance: when none of a
request's targets may be asked, :func:`fails_open` lets the attempt go to one whose circuit
alone keeps it out (a refusal cannot give an answer; a target that is slow under a burst, not
down, gives one).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Final, Literal

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "BreakerState",
    "CircuitBreaker",
    "TargetHealth",
    "fails_open",
    "failure_party",
]

failure_party: ContextVar[str | None] = ContextVar("llmroute_failure_party", default=None)
"""Who the request in this context is for (a gateway key's name); ``None``: unattributed."""

_MAX_PARTIES = 1024  # party breakers kept per target (the closed ones are dropped first)

BreakerState = Literal["closed", "open", "half-open"]
CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half-open"


class CircuitBreaker:
    """Stops traffic to a target after ``failures`` consecutive failures, then probes it.

    Open, it refuses attempts for ``cooldown`` seconds; then one probe goes (half-open). A
    successful probe closes it; a failed one re-opens it with the cooldown doubled, up to
    ``max_cooldown``.

    With :meth:`trials_in_background` the probe is never a request's: while the shared breaker
    is not closed, :meth:`acquire` refuses every attempt and only :meth:`acquire_trial` takes
    the probe (a background trial, see :mod:`llmroute.routing.trials`); :meth:`trial_due_in`
    says when the next one is due. The cooldown is then the interval between trials.

    With :data:`failure_party` set, it keeps a breaker per party too: a run of failures from a
    single party opens that party's breaker only; the shared one opens when the run holds
    failures of two parties or more (or unattributed ones). Every method then answers for the
    current party: the shared breaker while it is not closed, else the party's own.
    """

    __slots__ = (
        "_attributed",
        "_background",
        "_base_cooldown",
        "_clock",
        "_consecutive",
        "_cooldown",
        "_failures",
        "_max_cooldown",
        "_on_open",
        "_parties",
        "_probe_out",
        "_retry_at",
        "_run",
        "_state",
    )

    def __init__(
        self,
        failures: int = 5,
        cooldown: float = 30.0,
        max_cooldown: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1:
            raise ValueError(f"failures must be at least 1, got {failures!r}")
        if not cooldown > 0:
            raise ValueError(f"cooldown must be positive, got {cooldown!r}")
        if not max_cooldown >= cooldown:
            raise ValueError(
                f"max_cooldown must be at least cooldown ({cooldown!r}), got {max_cooldown!r}"
            )
        self._failures = failures
        self._base_cooldown = float(cooldown)
        self._max_cooldown = float(max_cooldown)
        self._clock = clock
        self._state: BreakerState = CLOSED
        self._consecutive = 0
        self._cooldown = self._base_cooldown
        self._retry_at = 0.0
        self._probe_out = False
        self._attributed = True  # a party's own breaker is not
        self._parties: dict[str, CircuitBreaker] = {}
        self._run: set[str | None] = set()  # parties of the failures since the last success
        self._background = False
        self._on_open: Callable[[], None] | None = None

    def trials_in_background(self, on_open: Callable[[], None] | None = None) -> None:
        """Leave the probes of the shared circuit to background trials: no request is sent
        to the target while it is not closed. ``on_open`` is called each time it opens (to
        start the trials). A party's own breaker keeps request probes: a trial is no one's."""
        self._background = True
        self._on_open = on_open

    def acquire_trial(self) -> bool:
        """Permission to send the background trial: the shared circuit is open with its
        cooldown over, or half-open with no probe out. Takes the probe (half-open)."""
        if self._state == CLOSED or self._probe_out:
            return False
        if self._state == OPEN and self._clock() < self._retry_at:
            return False
        self._state = HALF_OPEN
        self._probe_out = True
        return True

    def trial_due_in(self) -> float | None:
        """Seconds until the shared circuit's next trial may go (0.0: now); ``None`` when it
        is closed or a trial is out."""
        if self._state == CLOSED or self._probe_out:
            return None
        if self._state == HALF_OPEN:
            return 0.0
        return max(0.0, self._retry_at - self._clock())

    def postpone(self) -> None:
        """The trial ended without a verdict (the target refused its shape, or rate-limited
        it): open again for the current cooldown, not doubled, so the next trial waits too."""
        if self._state != HALF_OPEN:
            return
        self._state = OPEN
        self._probe_out = False
        self._retry_at = self._clock() + self._cooldown

    def _current(self) -> CircuitBreaker:
        """The breaker answering for the current party."""
        if self._state != CLOSED or not self._parties:
            return self
        party = failure_party.get()
        if party is None:
            return self
        return self._parties.get(party, self)

    @property
    def state(self) -> BreakerState:
        """``"closed"``, ``"open"`` or ``"half-open"``; open stays open until an acquire."""
        return self._current()._state

    @property
    def shared_state(self) -> BreakerState:
        """The state of the breaker shared by every party."""
        return self._state

    @property
    def in_background(self) -> bool:
        """Whether the shared circuit's probes are background trials (no request's)."""
        return self._background

    @property
    def consecutive_failures(self) -> int:
        """Failures recorded since the last success."""
        return self._current()._consecutive

    @property
    def cooldown(self) -> float:
        """The cooldown the breaker opens (or last opened) for, in seconds."""
        return self._current()._cooldown

    def available(self) -> bool:
        """Whether :meth:`acquire` would grant an attempt now. No side effects."""
        current = self._current()
        if current is not self:
            return current.available()
        if self._state == CLOSED:
            return True
        if self._background:
            return False
        if self._state == OPEN:
            return self._clock() >= self._retry_at
        return not self._probe_out

    def acquire(self) -> bool:
        """Permission to send one attempt.

        Closed: yes. Open with the cooldown over: it turns half-open and grants the one probe.
        Half-open with the probe out, or open and cooling: no. With trials in the background:
        no while not closed.
        """
        current = self._current()
        if current is not self:
            return current.acquire()
        if not self.available():
            return False
        if self._state == OPEN:  # opening cleared the probe
            self._state = HALF_OPEN
        if self._state == HALF_OPEN:
            self._probe_out = True
        return True

    def release(self) -> None:
        """The probe ended without a verdict (it was cancelled); another may go."""
        current = self._current()
        if current is not self:
            current.release()
        elif self._state == HALF_OPEN:
            self._probe_out = False

    def record_success(self) -> None:
        """The target answered: close, forgetting failures and cooldown doubling."""
        party = failure_party.get() if self._attributed else None
        if party is not None:
            self._parties.pop(party, None)
        self._run.clear()
        self._state = CLOSED
        self._consecutive = 0
        self._cooldown = self._base_cooldown
        self._probe_out = False

    def record_failure(self) -> None:
        """The target failed: count it while closed, opening at the threshold; a failed probe
        re-opens with the cooldown doubled (capped). Failures while open change nothing.
        A failure of a party (:data:`failure_party`) counts for the party's own breaker, and
        opens the shared one only when the run of failures holds two parties or more."""
        if self._state == OPEN:
            return
        party = failure_party.get() if self._attributed else None
        if party is not None and self._state == CLOSED:
            own = self._parties.get(party)
            if own is None:
                if len(self._parties) >= _MAX_PARTIES:
                    self._forget_a_party()
                own = self._parties[party] = CircuitBreaker(
                    self._failures, self._base_cooldown, self._max_cooldown, self._clock
                )
                own._attributed = False
            own.record_failure()
        self._run.add(party)
        self._consecutive += 1
        if self._state == HALF_OPEN:
            self._cooldown = min(self._cooldown * 2, self._max_cooldown)
        elif self._consecutive < self._failures:
            return
        elif len(self._run) < 2 and None not in self._run:
            return  # one party's failures alone: its own breaker speaks for it
        self._state = OPEN
        self._probe_out = False
        self._retry_at = self._clock() + self._cooldown
        if self._on_open is not None:
            self._on_open()

    def retry_at(self) -> float | None:
        """Clock time an open breaker lets a probe through; ``None`` unless open."""
        current = self._current()
        return current._retry_at if current._state == OPEN else None

    def _forget_a_party(self) -> None:
        for name, breaker in self._parties.items():
            if breaker._state == CLOSED:
                del self._parties[name]
                return
        self._parties.pop(next(iter(self._parties)))


class TargetHealth:
    """A target's circuit breaker plus a cooldown the target asked for (Retry-After)."""

    __slots__ = (
        "_clock",
        "_cooling_until",
        "_misconfigured",
        "_reason",
        "breaker",
        "cause",
        "failure",
        "kind",
    )

    def __init__(
        self,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.breaker = breaker if breaker is not None else CircuitBreaker(clock=clock)
        self._clock = clock
        self._cooling_until = 0.0
        self._reason = ""
        self._misconfigured = ""
        self.cause: BaseException | None = None
        """The answer that found the target misconfigured (a 401, 403 or 404), while it is."""
        self.failure: BaseException | None = None
        """The last failure counted against the target's health (a request's or a trial's):
        what a request refused while the circuit waits for a trial is refused for."""
        self.kind = "chat"
        """The kind of call (``chat``, ``responses``, ``completions``, ``embeddings``) whose
        failure last counted against the target: the endpoint its trials go to."""

    def failed(self, exc: BaseException, kind: str | None = None) -> None:
        """Remember a failure that counts against the target's health, of a call of ``kind``
        (``None``: a trial's, which keeps the kind). The breaker is the caller's to tell."""
        self.failure = exc
        if kind is not None:
            self.kind = kind

    def misconfigured(self, why: str, seconds: float, cause: BaseException | None = None) -> None:
        """The target refused this client (401, 403) or does not know the model (404): its
        key or model name is wrong. It is left out for ``seconds``, and named so."""
        self._misconfigured = why
        self.cause = cause
        self._cooling_until = self._clock() + seconds
        self._reason = f"it was found misconfigured ({why})"

    @property
    def misconfiguration(self) -> str | None:
        """Why the target is left out as misconfigured, while it is; else ``None``."""
        return self._misconfigured if self._misconfigured and self.cooling() > 0 else None

    def cool_down(self, seconds: float, reason: str = "a 429") -> None:
        """Send nothing for ``seconds``; an existing cooldown that ends later is kept."""
        until = self._clock() + seconds
        if until > self._cooling_until:
            self._cooling_until = until
            self._reason = reason

    def cooling(self) -> float:
        """Seconds left of the cooldown; 0.0 when there is none."""
        return max(0.0, self._cooling_until - self._clock())

    def available(self) -> bool:
        """Whether an attempt may go now: the breaker allows it and no cooldown is running."""
        return self.breaker.available() and self.cooling() == 0.0

    def acquire(self) -> bool:
        """Permission to send one attempt, taking the breaker's probe when it is half-open."""
        return self.cooling() == 0.0 and self.breaker.acquire()

    def circuit_only(self) -> bool:
        """Whether its circuit alone keeps the target out now: not available, and no cooldown
        running (a 429's Retry-After, a misconfiguration), which failing open respects."""
        return self.cooling() == 0.0 and not self.breaker.available()

    def trial_due_in(self) -> float | None:
        """Seconds until the background trial of the open circuit may go: the breaker's
        schedule, and a running cooldown (a 429's Retry-After) on top; ``None`` when the
        circuit is closed or a trial is out."""
        due = self.breaker.trial_due_in()
        return None if due is None else max(due, self.cooling())

    def retry_at(self) -> float | None:
        """Clock time the target may be tried again, or ``None`` if now or unknown."""
        now = self._clock()
        times = [t for t in (self.breaker.retry_at(), self._cooling_until) if t is not None]
        later = max(times)
        return later if later > now else None

    def describe(self) -> str:
        """Why the target is unavailable, for error messages; ``"available"`` if it is not."""
        reasons: list[str] = []
        breaker = self.breaker
        failures = breaker.consecutive_failures
        after = f"after {failures} failure{'' if failures == 1 else 's'}"
        background = breaker.in_background and breaker.shared_state != CLOSED
        if background:
            due = breaker.trial_due_in()
            when = "a trial is out" if due is None else f"next trial in {due:.1f} s"
            reasons.append(f"circuit {breaker.state} {after}, {when}")
        elif breaker.state == OPEN:
            retry_at = breaker.retry_at()
            left = 0.0 if retry_at is None else retry_at - self._clock()
            if left > 0:
                reasons.append(f"circuit open for another {left:.1f} s {after}")
        elif breaker.state == HALF_OPEN and not breaker.available():
            reasons.append(f"circuit half-open {after}, a probe is out")
        cooling = self.cooling()
        if cooling > 0:
            reasons.append(f"cooling down for {cooling:.1f} s after {self._reason}")
        return "; ".join(reasons) or "available"


def fails_open(target: TargetHealth, others: Iterable[TargetHealth]) -> bool:
    """Whether an attempt goes to ``target`` although its circuit is open: its circuit alone
    keeps it out (:meth:`TargetHealth.circuit_only`) and none of ``others``, the request's
    other targets, may be asked either. Refusing cannot give an answer and trying can: a
    target timed out by a burst's own queueing is slow, not down (Envoy's panic threshold and
    Finagle's balancer after ``maxEffort`` route to unhealthy hosts rather than to none). The
    attempt is no probe: its answer closes the circuit, its failure leaves it open."""
    return target.circuit_only() and not any(other.available() for other in others)
