from __future__ import annotations

from collections.abc import Callable

import pytest

from llmroute.routing.health import CircuitBreaker, TargetHealth, fails_open, failure_party

from ..clock import FakeClock


def open_breaker(
    failures: int = 3, cooldown: float = 10.0, max_cooldown: float = 35.0
) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    breaker = CircuitBreaker(failures, cooldown, max_cooldown, clock)
    for _ in range(failures):
        breaker.record_failure()
    return breaker, clock


def test_closed_breaker_grants_everything() -> None:
    breaker = CircuitBreaker(clock=FakeClock())
    assert breaker.state == "closed"
    assert all(breaker.acquire() for _ in range(100))
    assert breaker.available()
    assert breaker.retry_at() is None


def test_opens_at_the_failure_threshold() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, cooldown=10.0, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "closed"
    breaker.record_failure()
    assert breaker.state == "open"
    assert not breaker.available()
    assert not breaker.acquire()
    assert breaker.retry_at() == clock.now + 10.0


def test_success_resets_the_consecutive_count() -> None:
    breaker = CircuitBreaker(failures=3, clock=FakeClock())
    for _ in range(10):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state == "closed"
    assert breaker.consecutive_failures == 0


def test_half_open_grants_a_single_probe() -> None:
    breaker, clock = open_breaker()
    clock.advance(9.9)
    assert not breaker.available()
    clock.advance(0.1)
    assert breaker.available()
    assert breaker.state == "open"  # available() changes nothing
    assert breaker.acquire()
    assert breaker.state == "half-open"
    assert not breaker.available()
    assert [breaker.acquire() for _ in range(5)] == [False] * 5


def test_successful_probe_closes() -> None:
    breaker, clock = open_breaker()
    clock.advance(10.0)
    assert breaker.acquire()
    breaker.record_success()
    assert breaker.state == "closed"
    assert breaker.acquire()
    assert breaker.acquire()
    for _ in range(3):
        breaker.record_failure()
    assert breaker.retry_at() == clock.now + 10.0  # the cooldown starts over from its base


def test_failed_probe_doubles_the_cooldown_up_to_the_cap() -> None:
    breaker, clock = open_breaker(cooldown=10.0, max_cooldown=35.0)
    cooldowns = []
    for _ in range(4):
        retry_at = breaker.retry_at()
        assert retry_at is not None
        clock.now = retry_at
        assert breaker.acquire()
        breaker.record_failure()
        assert breaker.state == "open"
        cooldowns.append(breaker.cooldown)
        assert breaker.retry_at() == clock.now + breaker.cooldown
    assert cooldowns == [20.0, 35.0, 35.0, 35.0]


def test_released_probe_lets_another_go() -> None:
    breaker, clock = open_breaker()
    clock.advance(10.0)
    assert breaker.acquire()
    assert not breaker.acquire()
    breaker.release()
    assert breaker.state == "half-open"
    assert breaker.available()
    assert breaker.acquire()
    assert not breaker.acquire()


def test_failures_while_open_change_nothing() -> None:
    breaker, clock = open_breaker()
    retry_at = breaker.retry_at()
    clock.advance(5.0)
    breaker.record_failure()
    assert breaker.retry_at() == retry_at
    assert breaker.cooldown == 10.0


def test_release_while_closed_changes_nothing() -> None:
    breaker = CircuitBreaker(failures=1, clock=FakeClock())
    breaker.release()
    breaker.record_failure()
    assert breaker.state == "open"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"failures": 0}, "failures"),
        ({"cooldown": 0.0}, "cooldown"),
        ({"cooldown": 10.0, "max_cooldown": 5.0}, "max_cooldown"),
    ],
)
def test_breaker_arguments_are_checked(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]


# TargetHealth


def test_cooldown_keeps_the_later_end() -> None:
    clock = FakeClock()
    health = TargetHealth(CircuitBreaker(clock=clock), clock)
    assert health.cooling() == 0.0
    health.cool_down(5.0)
    health.cool_down(2.0)
    assert health.cooling() == 5.0
    clock.advance(1.0)
    health.cool_down(6.0)
    assert health.cooling() == 6.0
    assert not health.available()
    assert not health.acquire()
    assert health.retry_at() == clock.now + 6.0
    clock.advance(6.0)
    assert health.cooling() == 0.0
    assert health.available()
    assert health.acquire()
    assert health.retry_at() is None


def test_describe_says_why() -> None:
    clock = FakeClock()
    health = TargetHealth(CircuitBreaker(failures=5, cooldown=30.0, clock=clock), clock)
    assert health.describe() == "available"
    health.cool_down(1.0)
    assert health.describe() == "cooling down for 1.0 s after a 429"
    clock.advance(1.0)
    for _ in range(5):
        health.breaker.record_failure()
    clock.advance(18.0)
    assert health.describe() == "circuit open for another 12.0 s after 5 failures"
    health.cool_down(3.0, reason="a 503")
    assert health.describe() == (
        "circuit open for another 12.0 s after 5 failures; cooling down for 3.0 s after a 503"
    )
    clock.advance(12.0)
    assert health.describe() == "available"
    assert health.acquire()
    assert health.describe() == "circuit half-open after 5 failures, a probe is out"
    assert not health.available()
    health.breaker.record_success()
    assert health.describe() == "available"


def test_target_health_builds_a_breaker_on_the_same_clock() -> None:
    clock = FakeClock()
    health = TargetHealth(clock=clock)
    for _ in range(5):
        health.breaker.record_failure()
    assert health.retry_at() == clock.now + 30.0
    clock.advance(30.0)
    assert health.available()


# -- failures attributed to a party (the gateway's keys) --------------------------------------


def _as(party: str | None, action: Callable[[], object]) -> object:
    token = failure_party.set(party)
    try:
        return action()
    finally:
        failure_party.reset(token)


def test_one_partys_failures_open_its_own_breaker_only() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, cooldown=10, clock=clock)
    for _ in range(10):
        _as("a", breaker.record_failure)
    assert breaker.shared_state == "closed"
    assert breaker.state == "closed"  # unattributed callers see the shared breaker
    assert _as("a", lambda: breaker.state) == "open"
    assert _as("a", breaker.acquire) is False
    assert _as("b", breaker.acquire) is True
    clock.advance(10)
    assert _as("a", breaker.acquire) is True  # a's probe
    assert _as("a", lambda: breaker.state) == "half-open"
    _as("a", breaker.record_success)
    assert _as("a", lambda: breaker.state) == "closed"


def test_failures_of_two_parties_open_the_shared_breaker() -> None:
    breaker = CircuitBreaker(failures=3, cooldown=10, clock=FakeClock())
    _as("a", breaker.record_failure)
    _as("a", breaker.record_failure)
    _as("b", breaker.record_failure)
    assert breaker.shared_state == "open"
    assert _as("c", breaker.acquire) is False


def test_another_partys_success_ends_the_shared_run() -> None:
    breaker = CircuitBreaker(failures=3, cooldown=10, clock=FakeClock())
    _as("a", breaker.record_failure)
    _as("a", breaker.record_failure)
    _as("b", breaker.record_success)
    _as("b", breaker.record_failure)
    assert breaker.shared_state == "closed"


def test_unattributed_failures_behave_as_before() -> None:
    breaker = CircuitBreaker(failures=2, cooldown=10, clock=FakeClock())
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "open"


def test_party_breakers_are_bounded() -> None:
    breaker = CircuitBreaker(failures=1, cooldown=10, clock=FakeClock())
    for i in range(3000):
        _as(f"p{i}", breaker.record_failure)
    assert len(breaker._parties) <= 1024  # pyright: ignore[reportPrivateUsage]


def test_the_router_bounds_the_probe_schedule_near_one_cooldown() -> None:
    """An outage of any length: after it ends, a probe finds the target within the cap (60 s
    by default), never the doubled-to-300-s waits of before."""
    from llmroute.routing.engine import Router

    clock = FakeClock()
    router = Router({}, breaker_failures=1, breaker_cooldown=30.0, clock=clock)
    breaker = router.health("a:m").breaker
    breaker.record_failure()
    waits: list[float] = []
    for _ in range(10):  # ten failed probes in a row: a long outage
        retry_at = breaker.retry_at()
        assert retry_at is not None
        waits.append(retry_at - clock.now)
        clock.now = retry_at
        assert breaker.acquire()
        breaker.record_failure()
    assert waits[:3] == [30.0, 60.0, 60.0] and max(waits) == 60.0
    capped = Router({}, breaker_failures=1, breaker_cooldown=5.0, breaker_max_cooldown=20.0)
    health = capped.health("a:m")
    assert health.breaker.cooldown == 5.0
    long = Router({}, breaker_cooldown=90.0)  # a cooldown above the cap is the cap
    long.health("a:m").breaker.record_failure()
    assert long.health("a:m").breaker.cooldown == 90.0


def test_a_misconfigured_target_is_left_out_and_named() -> None:
    clock = FakeClock()
    health = TargetHealth(CircuitBreaker(clock=clock), clock=clock)
    health.misconfigured("AuthenticationError: Incorrect API key", 60.0)
    assert not health.available()
    assert health.misconfiguration == "AuthenticationError: Incorrect API key"
    assert "misconfigured (AuthenticationError: Incorrect API key)" in health.describe()
    clock.advance(60.0)
    assert health.available() and health.misconfiguration is None


def test_failing_open_goes_through_a_circuit_alone_when_no_other_target_may_be_asked() -> None:
    clock = FakeClock()
    target, other = (TargetHealth(CircuitBreaker(1, 10.0, clock=clock), clock) for _ in range(2))
    assert not target.circuit_only() and not fails_open(target, [])  # closed: no need
    target.breaker.record_failure()
    assert target.circuit_only()
    assert fails_open(target, []) and not fails_open(target, [other])  # other may be asked
    other.breaker.record_failure()
    assert fails_open(target, [other])  # every circuit open: the request still goes
    other.breaker.record_success()
    other.cool_down(5.0)  # a 429's Retry-After: other may not be asked, nor gone through
    assert fails_open(target, [other]) and not fails_open(other, [target])
    target.misconfigured("a 401", 60.0)
    assert not target.circuit_only() and not fails_open(target, [other])
