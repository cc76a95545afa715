"""benchmarks/gateway_memory.py's bounds: a stream that fails before the others have opened, or
streams that do not open in time, end the run at once with a sentence (it waited 10 minutes for
a count that could no longer be reached); and a small run against a real gateway and simulator
counts every stream in flight when it reads the RSS."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "gateway_memory", BENCHMARKS / "gateway_memory.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


bench = load_benchmark()


async def held(tasks_that_fail: int, seconds: float) -> str:
    """``_until_open`` over 3 streams that wait forever and ``tasks_that_fail`` that fail."""

    async def fail() -> None:
        raise bench.Bound("a stream was answered 502: upstream")

    tasks = [asyncio.create_task(asyncio.sleep(3600)) for _ in range(3)]
    tasks += [asyncio.create_task(fail()) for _ in range(tasks_that_fail)]
    try:
        with pytest.raises(bench.Bound) as caught:
            async with asyncio.timeout(30):  # the test's own bound, far above the run's
                await bench._until_open(asyncio.Event(), tasks, seconds, lambda: 3)
        return str(caught.value)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_a_stream_that_fails_ends_the_wait_at_once_saying_why() -> None:
    message = asyncio.run(held(1, seconds=600))
    assert (
        message == "3 of 4 streams had opened when one failed: a stream was answered 502: upstream"
    )


def test_streams_that_do_not_open_in_time_end_the_run_with_a_sentence() -> None:
    message = asyncio.run(held(0, seconds=0.05))
    assert message == "3 of 3 streams had their first token after 0.05 s (--open-timeout)"


def test_a_small_run_holds_every_stream_open_when_it_reads_the_rss() -> None:
    from llmroute.testing import Profile, SimulatorProcess

    profile = Profile(reply_tokens=3, inter_token=float(bench.HOLD_SECONDS))
    with SimulatorProcess(profile) as sim:
        row = bench.measure(sim, 3, "1.1", 60)  # raises Bound unless all 3 are in flight
    assert row["streams"] == 3 and row["rss_open_mb"] >= row["rss_before_mb"] > 0
