"""Fleet-warm routing: an instance reads the statistics the fleet shares through Redis before it
routes (``warmup()`` or its first routed request), and refreshes a view older than its sync
interval. Separate processes, a real redis-server, simulators on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from llmroute import AsyncOpenAI, AsyncStream
from llmroute.routing.shared import RedisStatsBackend, StatsSync
from llmroute.routing.stats import LiveStats
from llmroute.testing import Profile, Simulator

from ..clock import FakeClock
from ..conftest import KEY

SLOW_TTFT = 0.4

INSTANCE = """
import json, sys, anyio
from llmroute import AsyncOpenAI

async def main() -> None:
    config = json.loads(sys.argv[1])
    mode = sys.argv[2]
    async with AsyncOpenAI(config=config, verify=sys.argv[3]) as client:
        if mode == "teach":  # each target alone, a few times: the fleet learns both
            for route in ("slow_only", "fast_only"):
                for i in range(6):
                    stream = await client.chat.completions.create(
                        model=route, messages=[{"role": "user", "content": f"lesson {i}"}],
                        stream=True,
                    )
                    async for _ in stream:
                        pass
            await client._stats_sync.sync()  # publish before leaving (aclose drops the rest)
            print(json.dumps({"published": client._stats_sync.sent}))
            return
        if mode == "warmup":
            await client.warmup()
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "first"}], stream=True
        )
        async for _ in stream:
            pass
        print(json.dumps({"winner": stream.route.winner,
                          "attempts": [a.target for a in stream.route.attempts]}))

anyio.run(main)
"""


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[Simulator, Simulator]]:
    """A slow target (listed first, so a cold instance tries it first) and a fast one."""
    with (
        Simulator(profile=Profile(reply_tokens=4, ttft_median=SLOW_TTFT), tls=True) as slow,
        Simulator(profile=Profile(reply_tokens=4), tls=True) as fast,
    ):
        yield slow, fast


def config(
    sims: tuple[Simulator, Simulator], redis: str, prefix: str, backend: str = "redis"
) -> dict[str, Any]:
    slow, fast = sims
    return {
        "providers": {
            "slow": {"base_url": slow.base_url, "api_key": KEY},
            "fast": {"base_url": fast.base_url, "api_key": KEY},
        },
        "models": {
            "chat": {"targets": ["slow:sim-small", "fast:sim-small"], "policy": "fastest"},
            "slow_only": {"targets": ["slow:sim-small"]},
            "fast_only": {"targets": ["fast:sim-small"]},
        },
        "routing": {"explore": 0, "stats_backend": backend, "stats_sync": "1s"},
        # A generous bound for a loaded machine: the wait ends when the exchange does.
        "redis": {"url": redis, "prefix": prefix, "timeout": 5},
    }


def run(cfg: dict[str, Any], mode: str, ca: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "LLMROUTE_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-c", INSTANCE, json.dumps(cfg), mode, ca],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_instance_routes_its_first_request_where_the_fleet_learned(
    sims: tuple[Simulator, Simulator], redis_url: str
) -> None:
    prefix = f"llmroute-test-{uuid.uuid4().hex}"
    ca = sims[0].ca_pem_path
    assert sims[1].ca_pem_path == ca  # one trustme CA per process
    # Alone, an instance knows nothing and tries the first target listed: the slow one.
    cold = run(config(sims, redis_url, prefix, backend="memory"), "first", ca)
    assert cold["winner"] == "slow:sim-small"
    assert run(config(sims, redis_url, prefix), "first", ca)["winner"] == "slow:sim-small"

    prefix = f"llmroute-test-{uuid.uuid4().hex}"  # a fleet without that first instance
    taught = run(config(sims, redis_url, prefix), "teach", ca)
    assert taught["published"] >= 12  # a TTFT sample per request at least
    for mode in ("warmup", "first"):  # warmup() reads the fleet; so does the first request
        fresh = run(config(sims, redis_url, prefix), mode, ca)
        assert fresh == {"winner": "fast:sim-small", "attempts": ["fast:sim-small"]}, mode


@pytest.mark.anyio
async def test_a_view_older_than_the_interval_is_refreshed_before_routing(
    sims: tuple[Simulator, Simulator], redis_url: str
) -> None:
    """Two instances in one process (each its own Redis instance id): one routes, the fleet
    learns the other target is faster, and the idle instance's next request goes there."""
    prefix = f"llmroute-test-{uuid.uuid4().hex}"
    cfg = config(sims, redis_url, prefix)
    cfg["routing"]["stats_sync"] = "50ms"
    slow, fast = "slow:sim-small", "fast:sim-small"
    ca = sims[0].ssl_context()
    async with (
        AsyncOpenAI(config=cfg, verify=ca) as idle,
        AsyncOpenAI(config=cfg, verify=ca) as fleet,
    ):

        async def first_target(client: AsyncOpenAI) -> str | None:
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "which?"}], stream=True
            )
            assert isinstance(stream, AsyncStream)
            async for _ in stream:
                pass
            assert stream.route is not None
            return stream.route.winner

        assert await first_target(idle) == slow  # nobody knows anything yet
        stats = fleet._router.stats  # what the fleet learned elsewhere, published through Redis
        for _ in range(20):
            stats.target(slow).record_ttft(2.0, 10)
            stats.target(fast).record_ttft(0.01, 10)
        await fleet._stats_sync.sync()
        assert fleet._stats_sync.sent >= 40
        sync = idle._stats_sync
        await anyio.sleep(0.1)  # idle for longer than its 50 ms interval
        assert sync.stale() and sync.received == 0  # it has not read what the fleet learned
        assert await first_target(idle) == fast
        assert sync.received >= 40


@pytest.mark.anyio
async def test_refresh_reads_the_fleet_only_when_stale_and_not_while_backing_off(
    redis_url: str,
) -> None:
    clock = FakeClock()
    prefix = f"llmroute-test-{uuid.uuid4().hex}"
    teacher = LiveStats(clock=clock, journal=True)
    teach = StatsSync(
        teacher, RedisStatsBackend(redis_url, prefix=prefix, instance="t"), clock=clock
    )
    local = LiveStats(clock=clock)
    sync = StatsSync(
        local, RedisStatsBackend(redis_url, prefix=prefix, instance="l", timeout=5), clock=clock
    )
    try:
        assert sync.stale()  # never read: stale
        teacher.target("x").record_ttft(0.5, 10)
        await teach.sync()
        assert await sync.refresh(None) and sync.received == 1
        assert not sync.stale()
        teacher.target("x").record_ttft(0.5, 10)
        await teach.sync()
        assert await sync.refresh(None) and sync.received == 1  # fresh: nothing read
        clock.advance(1.0)
        assert sync.stale()
        assert await sync.refresh(None) and sync.received == 2
    finally:
        await teach.aclose()
        await sync.aclose()
    assert not sync.stale()  # closed


@pytest.mark.anyio
async def test_an_unreachable_fleet_falls_back_to_local_stats_and_backs_off() -> None:
    clock = FakeClock()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = RedisStatsBackend(f"redis://127.0.0.1:{port}/0", timeout=0.2, instance="l")
    sync = StatsSync(LiveStats(clock=clock), backend, clock=clock)
    try:
        with anyio.fail_after(30):
            assert not await sync.refresh(None)  # the exchange failed: local stats
        assert not sync.stale()  # backing off: the next requests do not wait on Redis
        clock.advance(5.0)
        assert sync.stale()
    finally:
        await sync.aclose()
