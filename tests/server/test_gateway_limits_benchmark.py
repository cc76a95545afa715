"""benchmarks/gateway_limits.py's admission micro-benchmark on a tiny scale, against a real
redis-server: every variant measured, the limits really counted in Redis, the tables printed."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "gateway_limits", BENCHMARKS / "gateway_limits.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_micro_benchmark_counts_every_admission_in_redis(redis_url: str) -> None:
    import redis

    bench = load_benchmark()
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    micro = asyncio.run(bench.micro(redis_url, 5, 2, warm=3, prefix=prefix))
    assert [m["round_trips"] for m in micro.values()] == [0, 2, 2, 2, 2, 2]
    assert all(m["wall_per_pair"] > 0 and m["pairs"] > 0 for m in micro.values())
    client = redis.Redis.from_url(redis_url)
    try:
        counted = client.hvals(f"{prefix}:gateway-limits:{{bench}}:requests")
        slots = client.zcard(f"{prefix}:gateway-slots:bench")
    finally:
        client.close()
    assert sum(int(n) for n in counted) == 3 + 5 * 2  # warm-up and both rounds, none lost
    assert slots == 0  # every slot released

    encoded = bench.hpack_cost([("content-type", "text/event-stream")], 20, 1)
    assert encoded["headers_b"] - encoded["headers_a"] == 9  # rpm, tpm, budget: 3 each
    text = bench.report({"gateway": {"levels": {}}, "micro": micro, "hpack": encoded})
    assert "| RedisLimits admit + settle | 2 |" in text
    assert "| added | 9 |" in text
