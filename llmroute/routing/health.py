"""Target health: a circuit breaker over consecutive failures, plus Retry-After cooldowns.

Pure state machines driven by an injectable ``clock``. Which failures count against a target is
the caller's decision; these classes only keep score.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Literal

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "BreakerState", "CircuitBreaker", "TargetHealth"]

BreakerState = Literal["closed", "open", "half-open"]
CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half-open"


class CircuitBreaker:
    """Stops traffic to a target after ``failures`` consecutive failures, then probes it.

    Open, it refuses attempts for ``cooldown`` seconds; then one probe goes (half-open). A
    successful probe closes it; a failed one re-opens it with the cooldown doubled, up to
    ``max_cooldown``.
    """

    __slots__ = (
        "_base_cooldown",
        "_clock",
        "_consecutive",
        "_cooldown",
        "_failures",
        "_max_cooldown",
        "_probe_out",
        "_retry_at",
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

    @property
    def state(self) -> BreakerState:
        """``"closed"``, ``"open"`` or ``"half-open"``; open stays open until an acquire."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Failures recorded since the last success."""
        return self._consecutive

    @property
    def cooldown(self) -> float:
        """The cooldown the breaker opens (or last opened) for, in seconds."""
        return self._cooldown

    def available(self) -> bool:
        """Whether :meth:`acquire` would grant an attempt now. No side effects."""
        if self._state == CLOSED:
            return True
        if self._state == OPEN:
            return self._clock() >= self._retry_at
        return not self._probe_out

    def acquire(self) -> bool:
        """Permission to send one attempt.

        Closed: yes. Open with the cooldown over: it turns half-open and grants the one probe.
        Half-open with the probe out, or open and cooling: no.
        """
        if self._state == CLOSED:
            return True
        if self._state == OPEN:
            if self._clock() < self._retry_at:
                return False
            self._state = HALF_OPEN
        if self._probe_out:
            return False
        self._probe_out = True
        return True

    def release(self) -> None:
        """The probe ended without a verdict (it was cancelled); another may go."""
        if self._state == HALF_OPEN:
            self._probe_out = False

    def record_success(self) -> None:
        """The target answered: close, forgetting failures and cooldown doubling."""
        self._state = CLOSED
        self._consecutive = 0
        self._cooldown = self._base_cooldown
        self._probe_out = False

    def record_failure(self) -> None:
        """The target failed: count it while closed, opening at the threshold; a failed probe
        re-opens with the cooldown doubled (capped). Failures while open change nothing."""
        if self._state == OPEN:
            return
        self._consecutive += 1
        if self._state == HALF_OPEN:
            self._cooldown = min(self._cooldown * 2, self._max_cooldown)
        elif self._consecutive < self._failures:
            return
        self._state = OPEN
        self._probe_out = False
        self._retry_at = self._clock() + self._cooldown

    def retry_at(self) -> float | None:
        """Clock time an open breaker lets a probe through; ``None`` unless open."""
        return self._retry_at if self._state == OPEN else None


class TargetHealth:
    """A target's circuit breaker plus a cooldown the target asked for (Retry-After)."""

    __slots__ = ("_clock", "_cooling_until", "_misconfigured", "_reason", "breaker", "cause")

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
        if breaker.state == OPEN:
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
