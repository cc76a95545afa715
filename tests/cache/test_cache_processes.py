"""The disk cache shared by separate processes: popularity counted across them, answers served
to the next process (real child processes, one cache directory, a simulator on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmroute.testing import Simulator

from ..conftest import KEY

COUNTER = """
import sys, anyio
from llmroute.cache._stores import DiskStore

async def main() -> None:
    store = DiskStore(sys.argv[1], max_bytes=1 << 24)
    counts = [await store.hit("chat/popular", window=3600) for _ in range(int(sys.argv[2]))]
    await store.aclose()
    print(" ".join(map(str, counts)))

anyio.run(main)
"""

ASKER = """
import json, sys, anyio
from llmroute import AsyncOpenAI

async def main() -> None:
    base_url, ca, path = sys.argv[1:4]
    config = {
        "providers": {"sim": {"base_url": base_url, "api_key": sys.argv[4]}},
        "models": {"chat": {"targets": ["sim:sim-small"]}},
        "cache": {"backend": "disk", "path": path, "min_hits": 2},
    }
    async with AsyncOpenAI(config=config, verify=ca) as client:
        done = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Asked by every process."}],
            temperature=0,
        )
    print(json.dumps({"hit": done.route.cache_hit, "text": done.choices[0].message.content}))

anyio.run(main)
"""


FIRST_HIT = """
import json, sys, anyio, anyio.to_thread
from openai.types.chat import ChatCompletionChunk
from llmroute import AsyncOpenAI

async def main() -> None:
    base_url, ca, path = sys.argv[1:4]
    config = {
        "providers": {"sim": {"base_url": base_url, "api_key": sys.argv[4]}},
        "models": {"chat": {"targets": ["sim:sim-small"]}},
        "cache": {"backend": "disk", "path": path, "min_hits": 2},
    }
    async with AsyncOpenAI(config=config, verify=ca) as client:
        cache = client._cache
        cache._flushed_at = float("inf")  # no lookup-counter flush during the counted hit
        statements = []
        cache.store._cache._local.con.set_trace_callback(statements.append)
        threads = []
        run_sync = anyio.to_thread.run_sync

        async def counted(*args, **kwargs):
            threads.append(1)
            return await run_sync(*args, **kwargs)

        anyio.to_thread.run_sync = counted
        built = ChatCompletionChunk.__pydantic_complete__
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Asked by every process."}],
            temperature=0, stream=True,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        found = {
            "hit": stream.route.cache_hit,
            "statements": list(statements),
            "threads": len(threads),
            "schema_built": ChatCompletionChunk.__pydantic_complete__ and not built,
        }
        anyio.to_thread.run_sync = run_sync
        await stream.close()
    print(json.dumps(found))

anyio.run(main)
"""


def child(script: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "LLMROUTE_CONFIG"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def output(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out


def test_popularity_counts_are_atomic_across_processes(tmp_path: Path) -> None:
    """Four processes counting the same key at once: every count from 1 to 100 exactly once."""
    processes = [child(COUNTER, str(tmp_path), "25") for _ in range(4)]
    counts = [int(n) for p in processes for n in output(p).split()]
    assert sorted(counts) == list(range(1, 101))


def test_a_prompt_asked_once_by_each_process_is_served_from_the_cache(
    sim: Simulator, tmp_path: Path
) -> None:
    """min_hits = 2: the second process's ask makes the answer popular and stores it; the third
    and fourth get it from the cache, and the simulator answered twice only."""
    before = sim.stats()["chat_requests"]
    args = (sim.base_url, sim.ca_pem_path, str(tmp_path / "cache"), KEY)
    answers = [json.loads(output(child(ASKER, *args))) for _ in range(4)]
    assert [a["hit"] for a in answers] == [False, False, True, True]
    assert len({a["text"] for a in answers}) == 1
    assert sim.stats()["chat_requests"] - before == 2


def test_a_fresh_processs_first_hit_is_one_read_on_the_event_loop(
    sim: Simulator, tmp_path: Path
) -> None:
    """The work of a new process's first disk-cache hit, to its first content chunk: one
    SQLite SELECT (the connection was opened with the store; no write, such as diskcache's
    LRU access time), no worker thread, and no pydantic schema built for openai's chunk class
    (openai defers it; building it was most of that hit's time)."""
    args = (sim.base_url, sim.ca_pem_path, str(tmp_path / "cache"), KEY)
    assert [json.loads(output(child(ASKER, *args)))["hit"] for _ in range(2)] == [False, False]
    found = json.loads(output(child(FIRST_HIT, *args)))
    assert found["hit"] is True
    assert len(found["statements"]) == 1 and found["statements"][0].startswith("SELECT")
    assert found["threads"] == 0
    assert found["schema_built"] is False
