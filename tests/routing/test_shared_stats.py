from __future__ import annotations

import json
import logging
import math
import random
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis

from llmroute.routing.shared import (
    RedisStatsBackend,
    StatsBackend,
    StatsBackendUnavailable,
    StatsSync,
)
from llmroute.routing.stats import LiveStats, SampleEvent, StatsSettings

from ..clock import FakeClock

LOGGER = "llmroute.routing.shared"
PASSWORD = "s3cret-Pw-0123"


def prior_p95(median: float = 1.0) -> float:
    return median * math.exp(1.6448536269514722 * 0.5)


def record_everything(stats: LiveStats, rng: random.Random, n: int = 60) -> None:
    for i in range(n):
        target = stats.target("ab"[i % 2])
        target.record_ttft(rng.lognormvariate(-1, 0.5), rng.choice([100, 2000, 10_000, 50_000]))
        target.record_censored(rng.uniform(0, 3), rng.choice([100, 2000]))
        target.record_stream(rng.uniform(0.01, 0.05), rng.uniform(20, 80))
        target.record_stream(None, rng.uniform(20, 80))
        target.record_latency(rng.uniform(1, 5))
        target.record_outcome(rng.choice(["ok", "ok", "error", "cancelled", "timeout"]))


# The journal, without Redis


def test_journal_off_keeps_nothing() -> None:
    stats = LiveStats(clock=FakeClock())
    record_everything(stats, random.Random(1), n=10)
    assert stats.drain() == []
    assert stats.journal_dropped == 0
    assert all(stats.target(name)._journal is None for name in stats.names())


def test_journal_records_each_kind_once() -> None:
    stats = LiveStats(clock=FakeClock(), journal=True)
    target = stats.target("x")
    target.record_ttft(0.5, 300)
    assert not target.record_censored(0.1, 300)  # below the prior's p95: not recorded
    assert target.record_censored(9.0, 300)
    target.record_stream(0.02, 50.0)
    target.record_stream(None, None)
    target.record_latency(2.5)
    target.record_outcome("ok")
    events = stats.drain()
    assert events == [
        ("x", "t", 0.5, 300),
        ("x", "c", 9.0, 300),
        ("x", "s", 0.02, 50.0),
        ("x", "l", 2.5),
        ("x", "o", "ok"),
    ]
    assert json.loads(json.dumps(events)) == [list(event) for event in events]
    assert stats.drain() == []


def test_apply_reproduces_the_windows_without_journaling_again() -> None:
    clock = FakeClock()
    settings = StatsSettings(min_samples=3)
    source = LiveStats(settings, clock, journal=True)
    record_everything(source, random.Random(2))
    events: list[SampleEvent] = json.loads(json.dumps(source.drain()))
    copy = LiveStats(settings, clock, journal=True)
    assert copy.apply(events) == len(events)
    assert copy.drain() == []
    assert copy.names() == source.names()
    for name in source.names():
        a, b = source.target(name), copy.target(name)
        assert a.snapshot() == b.snapshot()
        for tokens in (100, 2000, 50_000):
            assert a.predict(0.5, tokens) == b.predict(0.5, tokens)
            assert a.predict(0.95, tokens) == b.predict(0.95, tokens)


def test_apply_skips_malformed_events_and_other_targets() -> None:
    stats = LiveStats(clock=FakeClock(), journal=True)
    garbage: list[Any] = [
        None,
        "xt",
        [],
        ["x"],
        [1, "t", 0.1, 5],
        ["x", "z", 0.1],
        ["x", "t", -1.0, 5],
        ["x", "t", "0.1", 5],
        ["x", "t", 0.1],
        ["x", "t", 0.1, 5, 6],
        ["x", "t", math.nan, 5],
        ["x", "t", True, 5],
        ["x", "t", 0.1, -5],
        ["x", "t", 0.1, 2.5],
        ["x", "s", "fast", None],
        ["x", "l", math.inf],
        ["x", "o", "splendid"],
        ["x", "o", ["ok"]],
        ["x", "c", None, 10],
    ]
    assert stats.apply(garbage) == 0
    assert stats.names() == []
    valid = [["x", "t", 0.2, 10], ["y", "t", 0.3, 10], ["x", "o", "ok"]]
    assert stats.apply(valid, targets={"x"}) == 2
    assert stats.names() == ["x"]
    assert stats.target("x").snapshot().n == 1
    assert stats.drain() == []


def test_outbox_is_bounded_and_counts_drops() -> None:
    stats = LiveStats(clock=FakeClock())
    target = stats.target("x")
    target.record_outcome("ok")  # before the journal: not kept
    stats.enable_journal(maxlen=5)
    for i in range(8):
        target.record_latency(float(i))
    assert stats.journal_dropped == 3
    assert stats.drain() == [("x", "l", float(i)) for i in range(3, 8)]
    stats.enable_journal(maxlen=2)  # a smaller outbox keeps the newest and counts the rest
    for i in range(3):
        stats.target("y").record_latency(float(i))
    assert stats.drain() == [("y", "l", 1.0), ("y", "l", 2.0)]
    assert stats.journal_dropped == 4


# Redis


@pytest.fixture
def prefix() -> str:
    return f"llmroute-test-{uuid.uuid4().hex}"


@pytest.fixture
def backends() -> Iterator[list[RedisStatsBackend]]:
    """Backends the test opens (with ``open``), closed after it."""
    opened: list[RedisStatsBackend] = []
    yield opened
    for backend in opened:
        backend.close()


def open_backend(
    opened: list[RedisStatsBackend], url: str, prefix: str, instance: str, **kwargs: Any
) -> RedisStatsBackend:
    backend = RedisStatsBackend(url, prefix=prefix, instance=instance, **kwargs)
    opened.append(backend)
    return backend


@pytest.mark.anyio
async def test_samples_flow_between_instances_without_echo(
    redis_url: str, prefix: str, backends: list[RedisStatsBackend]
) -> None:
    clock = FakeClock()
    a, b = LiveStats(clock=clock, journal=True), LiveStats(clock=clock, journal=True)
    sync_a = StatsSync(a, open_backend(backends, redis_url, prefix, "a"), clock=clock)
    sync_b = StatsSync(b, open_backend(backends, redis_url, prefix, "b"), clock=clock)
    assert sync_a.due() and sync_b.due()
    for _ in range(20):
        a.target("x").record_ttft(3.0, 100)
    a.target("x").record_outcome("ok")
    assert b.target("x").predict(0.95, 100) == pytest.approx(prior_p95())

    await sync_a.sync()
    assert not sync_a.due()
    await sync_b.sync()
    assert b.target("x").snapshot().n == 20
    assert b.target("x").predict(0.95, 100) == 3.0
    assert b.target("x").snapshot().outcomes["ok"] == 1
    assert (sync_a.sent, sync_b.received) == (21, 21)

    b.target("x").record_ttft(5.0, 100)
    clock.advance(1.0)
    assert sync_a.due() and sync_b.due()
    await sync_b.sync()
    await sync_a.sync()
    assert a.target("x").snapshot().n == 21
    assert a.target("x").snapshot().ttft_p99 == pytest.approx(3.0 + 2.0 * 0.8)

    for _ in range(3):  # nothing echoes: repeated exchanges change no counts
        clock.advance(1.0)
        await sync_a.sync()
        await sync_b.sync()
    assert a.target("x").snapshot().n == b.target("x").snapshot().n == 21
    assert a.drain() == b.drain() == []
    assert (sync_a.received, sync_b.received) == (1, 21)


@pytest.mark.anyio
async def test_a_new_instance_warms_up_from_history(
    redis_url: str, prefix: str, backends: list[RedisStatsBackend]
) -> None:
    clock = FakeClock()
    a = LiveStats(clock=clock, journal=True)
    sync_a = StatsSync(a, open_backend(backends, redis_url, prefix, "a"), clock=clock)
    for _ in range(3):
        for index in range(10):  # a steady mix (a shift of regime would forget older samples)
            a.target("x").record_ttft(0.25 + index % 3, 100)
        clock.advance(1.0)
        await sync_a.sync()

    late = LiveStats(clock=clock)
    sync_late = StatsSync(
        late, open_backend(backends, redis_url, prefix, "late", batch=2), clock=clock
    )
    for _ in range(3):  # two entries per exchange: the history comes in pages
        await sync_late.sync()
        clock.advance(1.0)
    assert late.target("x").snapshot().n == 30
    assert late.target("x").predict(0.5, 100) == 1.25

    stale = LiveStats(clock=clock)
    await anyio.sleep(0.01)  # the stream's ids are in wall-clock milliseconds
    sync_stale = StatsSync(
        stale, open_backend(backends, redis_url, prefix, "stale", history=0.005), clock=clock
    )
    await sync_stale.sync()
    assert stale.names() == []


class HangUp:
    """A TCP listener on 127.0.0.1 that closes every connection at once, counting them: a
    Redis that cannot be talked to, and a count of how often the client tried."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def hang_up() -> Iterator[HangUp]:
    server = HangUp()
    yield server
    server.close()


@pytest.mark.anyio
async def test_unreachable_redis_keeps_working_locally(
    caplog: pytest.LogCaptureFixture,
    backends: list[RedisStatsBackend],
    prefix: str,
    hang_up: HangUp,
) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{hang_up.port}/0"
    clock = FakeClock()
    stats = LiveStats(clock=clock, journal=True)
    backend = open_backend(backends, url, prefix, "a")
    sync = StatsSync(stats, backend, clock=clock, interval=1.0)
    assert PASSWORD not in backend.describe() and ":***@" in backend.describe()
    for _ in range(10):
        stats.target("x").record_ttft(2.0, 100)

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with anyio.fail_after(30):  # a hang guard only: what is checked is the number of tries
        await sync.sync()
    # One connection and one immediate retry, then it gives up: no retry loop, no backoff.
    assert hang_up.accepted == 2
    clock.advance(4.9)
    assert not sync.due()
    clock.advance(0.2)
    assert sync.due()
    await sync.sync()
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "working locally" in warnings[0].getMessage()
    assert any(r.levelno == logging.DEBUG for r in caplog.records if r.name == LOGGER)
    assert not sync.available
    assert PASSWORD not in caplog.text
    assert stats.target("x").predict(0.95, 100) == 2.0
    stats.target("x").record_ttft(4.0, 100)
    assert stats.target("x").snapshot().n == 11

    with pytest.raises(StatsBackendUnavailable) as info:
        backend.exchange([("x", "o", "ok")])
    assert PASSWORD not in str(info.value) and "127.0.0.1" in str(info.value)
    assert PASSWORD not in str(info.value.__cause__)


class Flaky:
    """A backend that is down while ``down`` is set."""

    def __init__(self, backend: StatsBackend) -> None:
        self.backend = backend
        self.down = True

    def exchange(self, outgoing: list[SampleEvent]) -> list[SampleEvent]:
        if self.down:
            raise StatsBackendUnavailable("down for a test")
        return self.backend.exchange(outgoing)

    def close(self) -> None:
        self.backend.close()

    def describe(self) -> str:
        return "flaky " + self.backend.describe()


@pytest.mark.anyio
async def test_events_kept_while_down_are_published_on_recovery(
    caplog: pytest.LogCaptureFixture,
    redis_url: str,
    prefix: str,
    backends: list[RedisStatsBackend],
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    a, b = LiveStats(clock=clock, journal=True), LiveStats(clock=clock)
    flaky = Flaky(open_backend(backends, redis_url, prefix, "a"))
    sync_a = StatsSync(a, flaky, clock=clock, max_pending=4)
    sync_b = StatsSync(b, open_backend(backends, redis_url, prefix, "b"), clock=clock)
    for i in range(3):
        a.target("x").record_latency(float(i))
    await sync_a.sync()
    for i in range(3, 6):
        a.target("x").record_latency(float(i))
    clock.advance(5.0)
    await sync_a.sync()
    assert sync_a.dropped == 2  # the oldest two beyond max_pending

    flaky.down = False
    clock.advance(5.0)
    await sync_a.sync()
    await sync_b.sync()
    assert sync_a.available and sync_a.sent == 4
    assert b.target("x").snapshot().latency_p50 == 3.5
    assert "shared stats are back" in caplog.text
    await sync_a.aclose()
    await sync_b.aclose()
    assert not sync_a.due()


@pytest.mark.anyio
async def test_malformed_stream_entries_are_skipped(
    caplog: pytest.LogCaptureFixture,
    redis_url: str,
    prefix: str,
    backends: list[RedisStatsBackend],
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    key = f"{prefix}:ttft-samples"
    with redis.Redis.from_url(redis_url) as raw:
        for fields in (
            {"x": "y"},
            {"i": "z", "e": "not json"},
            {"i": "z", "e": "{}"},
            {"i": "z", "e": b"\xff\xfe"},
            {"i": "z", "e": "[1, 2]"},
            {"i": "z", "e": '[["x", "t", "slow", 10]]'},
        ):
            raw.xadd(key, fields)  # pyright: ignore[reportArgumentType]
    a = LiveStats(clock=FakeClock(), journal=True)
    a.target("x").record_ttft(0.5, 10)
    await StatsSync(a, open_backend(backends, redis_url, prefix, "a")).sync()

    b = LiveStats(clock=FakeClock())
    backend_b = open_backend(backends, redis_url, prefix, "b")
    sync_b = StatsSync(b, backend_b)
    caplog.clear()
    await sync_b.sync()
    assert backend_b.malformed == 5
    assert b.target("x").snapshot().n == 1 and sync_b.received == 1
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "malformed" in warnings[0].getMessage()


@pytest.mark.anyio
async def test_one_exchange_at_a_time(
    redis_url: str, prefix: str, backends: list[RedisStatsBackend]
) -> None:
    seen: list[bool] = []
    inner = open_backend(backends, redis_url, prefix, "a")

    class Watching:
        def exchange(self, outgoing: list[SampleEvent]) -> list[SampleEvent]:
            seen.append(sync.due())
            return inner.exchange(outgoing)

        def close(self) -> None:
            inner.close()

        def describe(self) -> str:
            return inner.describe()

    sync = StatsSync(LiveStats(journal=True), Watching(), clock=FakeClock())
    await sync.sync()
    assert seen == [False]
