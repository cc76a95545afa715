"""Starting warm: the stats file a client writes when it closes and the next one reads when it
starts (``[routing] stats_file``), and ``warmup(probe=True)``. Simulators over TLS + HTTP/2 on
loopback; the file's expiry on an injectable clock."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import llmroute
from llmroute import AllTargetsFailed, AsyncOpenAI, AsyncStream, ConfigError
from llmroute.routing.snapshot import STATS_FILE_VERSION, StatsFile
from llmroute.routing.stats import LiveStats
from llmroute.testing import Profile, Simulator

from ..clock import FakeClock
from ..conftest import KEY

LOGGER = "llmroute.routing.snapshot"
SLOW, FAST = "slow:sim-small", "fast:sim-small"
PRICE = {"input": 2, "output": 8}  # per million tokens


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[Simulator, Simulator]]:
    """A slow target (listed first, so a client that knows nothing tries it first) and a fast
    one."""
    with (
        Simulator(profile=Profile(reply_tokens=4, ttft_median=0.15), tls=True) as slow,
        Simulator(profile=Profile(reply_tokens=4), tls=True) as fast,
    ):
        yield slow, fast


def config(sims: tuple[Simulator, Simulator], path: Path | None, **routing: Any) -> dict[str, Any]:
    slow, fast = sims

    def provider(sim: Simulator) -> dict[str, Any]:
        return {"base_url": sim.base_url, "api_key": KEY, "prices": {"*": PRICE}}

    return {
        "providers": {"slow": provider(slow), "fast": provider(fast)},
        "models": {
            "chat": {"targets": [SLOW, FAST], "policy": "fastest"},
            "slow_only": {"targets": [SLOW]},
            "fast_only": {"targets": [FAST]},
        },
        "routing": {
            "explore": 0,
            **({"stats_file": str(path)} if path is not None else {}),
            **routing,
        },
    }


async def ask(client: AsyncOpenAI, model: str, text: str = "hello") -> list[str]:
    """One streamed request read to its end; the targets its attempts went to."""
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], stream=True
    )
    assert isinstance(stream, AsyncStream)
    async for _ in stream:
        pass
    assert stream.route is not None
    return [a.target for a in stream.route.attempts]


async def teach(client: AsyncOpenAI, times: int = 6) -> None:
    for route in ("slow_only", "fast_only"):
        for i in range(times):
            await ask(client, route, f"lesson {i}")


@pytest.mark.anyio
async def test_a_fresh_client_routes_its_first_request_where_the_last_one_learnt(
    sims: tuple[Simulator, Simulator], tmp_path: Path
) -> None:
    path = tmp_path / "state" / "stats.json"  # its folder is made too
    ca = sims[0].ssl_context()
    async with AsyncOpenAI(config=config(sims, path), verify=ca) as first:
        await teach(first)
        assert not path.exists()  # written when the client closes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert KEY not in text and "127.0.0.1" not in text  # names only: no key, no URL
    data = json.loads(text)
    assert data["version"] == STATS_FILE_VERSION
    assert set(data["targets"]) == {SLOW, FAST}
    assert len(data["targets"][FAST]["events"]) >= 6
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary file left

    async with AsyncOpenAI(config=config(sims, path), verify=ca) as fresh:
        assert fresh.stats()[FAST].n >= 6  # seeded before any request
        assert await ask(fresh, "chat") == [FAST]  # the fast target, at once

    async with AsyncOpenAI(config=config(sims, tmp_path / "other.json"), verify=ca) as cold:
        assert cold.stats()[FAST].n == 0  # another file (none yet): nothing known


def test_the_sync_client_writes_the_file_on_close_and_probes(
    sims: tuple[Simulator, Simulator], tmp_path: Path
) -> None:
    path = tmp_path / "stats.json"
    with llmroute.OpenAI(config=config(sims, path), verify=sims[0].ssl_context()) as client:
        client.warmup(probe=True)
        assert {name: snap.n for name, snap in client.stats().items()} == {SLOW: 1, FAST: 1}
        kinds = {kind for (_, kind, _) in client.metrics.costs()}
        assert kinds == {"probe"}
    data = json.loads(path.read_text())
    assert {name: len(entry["events"]) for name, entry in data["targets"].items()} == {
        SLOW: 1,
        FAST: 1,
    }


@pytest.mark.anyio
async def test_warmup_probe_measures_every_target_once_and_says_what_it_cost(
    sims: tuple[Simulator, Simulator],
) -> None:
    async with AsyncOpenAI(config=config(sims, None), verify=sims[0].ssl_context()) as client:
        await client.warmup()  # connect only: nothing measured, nothing spent
        assert all(snap.n == 0 for snap in client.stats().values())
        assert client.metrics.costs() == {}
        await client.warmup(probe=True)
        stats = client.stats()
        assert {name: snap.n for name, snap in stats.items()} == {SLOW: 1, FAST: 1}
        slow, fast = stats[SLOW].ttft_p50, stats[FAST].ttft_p50
        assert slow is not None and fast is not None
        assert slow > fast  # its 150 ms median, measured
        costs = client.metrics.costs()
        assert set(costs) == {(SLOW, "probe", "USD"), (FAST, "probe", "USD")}
        assert all(Decimal(0) < amount < Decimal("0.001") for amount in costs.values())
        attempts = client.metrics.counts()["attempts"]
        assert attempts == {(SLOW, "probe", "won"): 1.0, (FAST, "probe", "won"): 1.0}
        assert await ask(client, "chat") == [FAST]


@pytest.mark.anyio
async def test_a_failing_probe_is_a_failure_and_only_all_failing_raise(
    sims: tuple[Simulator, Simulator],
) -> None:
    with Simulator(profile=Profile(reply_tokens=4, rate_500=1.0), tls=True) as broken:
        cfg = config(sims, None)
        cfg["providers"]["broken"] = {"base_url": broken.base_url, "api_key": KEY}
        cfg["models"]["chat"]["targets"].append("broken:sim-small")
        cfg["models"]["broken_only"] = {"targets": ["broken:sim-small"]}
        ca = sims[0].ssl_context()
        async with AsyncOpenAI(config=cfg, verify=ca) as client:
            await client.warmup(probe=True)  # two of three answered: no error
            stats = client.stats()
            assert stats["broken:sim-small"].n == 0
            assert stats["broken:sim-small"].outcomes["error"] >= 1
            assert stats[FAST].n == 1
        only = {
            "providers": {"broken": cfg["providers"]["broken"]},
            "models": {"chat": {"targets": ["broken:sim-small"]}},
        }
        async with AsyncOpenAI(config=only, verify=ca) as client:
            with pytest.raises(AllTargetsFailed) as caught:
                await client.warmup(probe=True)
            assert set(caught.value.errors) == {"broken:sim-small"}
            assert KEY not in str(caught.value)


@pytest.mark.anyio
async def test_a_probe_that_does_not_answer_in_time_is_a_timeout(
    sims: tuple[Simulator, Simulator],
) -> None:
    with Simulator(profile=Profile(reply_tokens=4, rate_hang=1.0), tls=True) as hung:
        cfg = config(sims, None)
        cfg["providers"]["hung"] = {
            "base_url": hung.base_url,
            "api_key": KEY,
            "prices": {"*": PRICE},
        }
        cfg["models"]["chat"]["targets"].append("hung:sim-small")
        async with AsyncOpenAI(config=cfg, verify=sims[0].ssl_context()) as client:
            await client.warmup(probe=True, probe_timeout=0.5)  # the others answered
            stats = client.stats()
            assert stats["hung:sim-small"].outcomes["timeout"] == 1
            assert stats["hung:sim-small"].n == 0 and stats[FAST].n == 1
            attempts = client.metrics.counts()["attempts"]
            assert attempts[("hung:sim-small", "probe", "timeout")] == 1.0
            costs = client.metrics.costs()  # its prompt, assumed billed
            assert costs[("hung:sim-small", "probe", "USD")] > 0


@pytest.mark.anyio
async def test_a_corrupt_or_foreign_file_starts_cold_with_a_warning_and_is_rewritten(
    sims: tuple[Simulator, Simulator], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "stats.json"
    ca = sims[0].ssl_context()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for content, why in (
        ("{not json", "is not JSON"),
        (json.dumps({"version": 999, "written_at": 0, "targets": {}}), "is version 999"),
        (json.dumps({"version": STATS_FILE_VERSION, "written_at": 1, "targets": []}), "corrupt"),
        (b"\xff\xfe\x00", "cannot be read"),
    ):
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        caplog.clear()
        async with AsyncOpenAI(config=config(sims, path), verify=ca) as client:
            assert all(snap.n == 0 for snap in client.stats().values())
            await ask(client, "fast_only")
        warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len(warned) == 1 and str(path) in warned[0] and why in warned[0], warned
        assert "starting cold" in warned[0]
        assert json.loads(path.read_text())["targets"][FAST]["events"]  # a good file again


@pytest.mark.anyio
async def test_a_file_that_cannot_be_written_is_a_warning_never_an_error(
    sims: tuple[Simulator, Simulator], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "plain").write_text("a file, where the stats file's folder should be")
    path = tmp_path / "plain" / "stats.json"
    caplog.set_level(logging.WARNING)
    async with AsyncOpenAI(config=config(sims, path), verify=sims[0].ssl_context()) as client:
        await ask(client, "fast_only")
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("cannot write the stats file" in m and str(path) in m for m in warned), warned
    assert os.listdir(tmp_path) == ["plain"]


@pytest.mark.anyio
async def test_a_target_no_longer_in_the_config_is_ignored(
    sims: tuple[Simulator, Simulator], tmp_path: Path
) -> None:
    path = tmp_path / "stats.json"
    clock = FakeClock()
    stats = LiveStats(clock=clock)
    for _ in range(6):
        stats.target("gone:sim-small").record_ttft(0.01, 10)
        stats.target(SLOW).record_ttft(0.3, 10)
    StatsFile(path, 3600, clock=clock).save(stats, {"gone:sim-small", SLOW})
    async with AsyncOpenAI(config=config(sims, path), verify=sims[0].ssl_context()) as client:
        known = client.stats()
        assert "gone:sim-small" not in known
        assert known[SLOW].n == 6
    assert set(json.loads(path.read_text())["targets"]) == {SLOW}  # it is not written back


def test_samples_older_than_the_max_age_are_not_read(tmp_path: Path) -> None:
    clock, wall = FakeClock(), FakeClock(1_800_000_000.0)
    stats = LiveStats(clock=clock)
    stats.target("a:m").record_ttft(0.5, 10)  # 100 s before the file is written
    clock.advance(100)
    stats.target("a:m").record_ttft(0.2, 10)
    stats.target("b:m").record_ttft(0.1, 10)
    stats_file = StatsFile(tmp_path / "s.json", 3600, wall=wall, clock=clock)
    assert stats_file.save(stats, {"a:m", "b:m"}) == 3
    wall.advance(3600 - 100)  # the oldest sample is exactly the max age: still read
    assert {name: len(s) for name, s in stats_file.read().items()} == {"a:m": 2, "b:m": 1}
    wall.advance(1)
    assert {name: len(s) for name, s in stats_file.read().items()} == {"a:m": 1, "b:m": 1}
    wall.advance(100)
    assert stats_file.read() == {}
    fresh = LiveStats(clock=FakeClock())
    assert stats_file.load(fresh, {"a:m", "b:m"}) == 0 and fresh.names() == []


def test_samples_read_and_written_back_keep_their_age(tmp_path: Path) -> None:
    """Clients that start and close without a request (CLI calls) do not make the file's
    samples young again: they still expire at the max age after they were recorded."""
    clock, wall = FakeClock(), FakeClock(1_800_000_000.0)
    stats = LiveStats(clock=clock)
    stats.target("a:m").record_ttft(0.5, 10)
    path = tmp_path / "s.json"
    StatsFile(path, 3600, wall=wall, clock=clock).save(stats, {"a:m"})
    for run in range(3):  # three runs, 15 minutes apart, each reading and writing the file
        wall.advance(900)
        stats_file = StatsFile(path, 3600, wall=wall, clock=clock)
        fresh = LiveStats(clock=clock)
        assert stats_file.load(fresh, {"a:m"}) == 1
        clock.advance(1)
        if run == 2:
            fresh.target("a:m").record_latency(0.4)  # a live one (in its own window)
        stats_file.save(fresh, {"a:m"})
    ages = json.loads(path.read_text())["targets"]["a:m"]["ages"]
    assert ages[0] >= 3 * 900 and ages[1] < 60  # the first sample is 45 minutes old
    wall.advance(3600 - 3 * 900)
    later = StatsFile(path, 3600, wall=wall, clock=clock).read()
    assert [len(samples) for samples in later.values()] == [1]  # only the live one is read


@pytest.mark.parametrize("seeded", [20, 200])
def test_samples_from_the_file_are_replaced_by_live_ones_and_a_slowdown_shows_at_once(
    seeded: int,
) -> None:
    clock = FakeClock()
    old = LiveStats(clock=clock)
    for _ in range(seeded):
        old.target("t").record_ttft(0.1, 10)
    events = [event for _, event in old.saved_samples()["t"]]
    stats = LiveStats(clock=clock)
    assert stats.seed(events, {"t"}) == seeded
    target = stats.target("t")
    window = target._ttft
    assert window.seeded == seeded and not target.cold()
    assert target.predict(0.95, 10) == pytest.approx(0.1)
    target.record_ttft(0.1, 10)  # a live sample replaces a file's, one for one
    assert (len(window), window.seeded) == (seeded, seeded - 1)
    slow = 0
    while target.predict(0.95, 10) < 1.0 and slow < 20:  # 10x slower since the file
        target.record_ttft(1.0, 10)
        slow += 1
    assert slow <= 3  # the p95 (of 20), or a change of regime (of 200), says so at once
    if seeded == 200:
        assert window.seeded == 0  # the change of regime dropped the file's samples


def test_several_writers_leave_a_whole_file_and_the_last_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        stats = LiveStats(clock=FakeClock())
        for _ in range(200):
            stats.target(name).record_ttft(0.1, 10)
        stats_file = StatsFile(path, 3600)
        try:
            for _ in range(30):
                stats_file.save(stats, {name})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        for _ in range(100):
            if path.exists():
                try:
                    json.loads(path.read_text())  # never a torn file
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{i}:m",)) for i in range(3)]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert len(json.loads(path.read_text())["targets"]) == 1  # one writer's whole file
    assert os.listdir(tmp_path) == ["stats.json"]


@pytest.mark.parametrize(
    ("routing", "key"),
    [
        ({"stats_max_age": "-1h"}, "routing.stats_max_age"),
        ({"stats_max_age": 0}, "routing.stats_max_age"),
        ({"stats_file": "."}, "routing.stats_file"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_key(routing: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        AsyncOpenAI(config={"routing": routing}, api_key=KEY)
