"""``llmroute cache stats|clear``, run as a real subprocess on a cache a client filled."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from llmroute import AsyncOpenAI
from llmroute.testing import Simulator

from ..conftest import KEY


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmroute.cli", "cache", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_config(path: Path, body: str) -> str:
    path.write_text(body)
    return str(path)


@pytest.mark.anyio
async def test_stats_and_clear_of_a_disk_cache(sim: Simulator, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    config = write_config(
        tmp_path / "llmroute.toml", f'[cache]\nbackend = "disk"\npath = "{cache_dir}"\n'
    )
    async with AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config
    ) as client:
        for prompt in ("one", "two"):
            for _ in range(3):
                await client.chat.completions.create(
                    model="sim-small",
                    messages=[{"role": "user", "content": prompt}],
                    temperature=0,
                )
                cache = client._cache
                assert cache is not None
                await cache.flush_stats()
                with anyio.fail_after(10):
                    while cache._flights:  # noqa: ASYNC110 - each ask is stored before the next
                        await anyio.sleep(0.005)
    shown = cli("stats", "--config", config, "--json")
    assert shown.returncode == 0, shown.stderr
    stats = json.loads(shown.stdout)
    assert (stats["entries"], stats["hits"], stats["misses"]) == (2, 2, 4)
    assert stats["hit_rate"] == pytest.approx(1 / 3) and stats["bytes"] > 0
    assert str(cache_dir) in stats["store"]
    text = cli("stats", "--config", config)
    assert "hit rate  33.3%" in text.stdout and "entries   2" in text.stdout
    cleared = cli("clear", "--config", config)
    assert cleared.returncode == 0 and "2 entries" in cleared.stdout
    after = json.loads(cli("stats", "--config", config, "--json").stdout)
    assert (after["entries"], after["hits"], after["misses"]) == (0, 0, 0)


def test_an_unreachable_redis_is_a_clear_error_without_the_password(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = write_config(
        tmp_path / "c.toml",
        f'[cache]\nbackend = "redis"\n[redis]\nurl = "redis://:hunter2@127.0.0.1:{port}/0"\n',
    )
    result = cli("stats", "--config", config)
    assert result.returncode == 1
    assert "127.0.0.1" in result.stderr and "hunter2" not in result.stderr + result.stdout


def test_a_memory_cache_has_nothing_to_show_and_a_bad_config_is_named(tmp_path: Path) -> None:
    memory = write_config(tmp_path / "m.toml", '[cache]\nbackend = "memory"\n')
    result = cli("stats", "--config", memory)
    assert result.returncode == 0 and "memory" in result.stdout
    bad = write_config(tmp_path / "bad.toml", "[cache]\nttl = 'soon'\n")
    result = cli("stats", "--config", bad)
    assert result.returncode == 2 and "cache.ttl" in result.stderr and "bad.toml" in result.stderr
