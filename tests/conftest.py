from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import settings

from llmroute.testing import Profile, Simulator
from tests.redis_server import redis_url  # noqa: F401  (a fixture)

# Shared 2-core machines: a slow example is not a failure (hypothesis' default deadline is 200 ms).
settings.register_profile("llmroute", deadline=None)
settings.load_profile("llmroute")

KEY = "sk-test-0123456789abcdef-SECRET"


def fault(kind: str, times: int = 1, **headers: str) -> dict[str, str]:
    """Headers that make the simulator fail the next ``times`` requests of this key with ``kind``
    (``500``, ``429``, ``drop:5``, ...), plus any other ``headers``."""
    return {
        "x-sim-fault": kind,
        "x-sim-fault-times": str(times),
        "x-sim-fault-key": uuid.uuid4().hex,
        **headers,
    }


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What llmroute keeps in the user's cache directory (fitted tier classifiers, a disk
    cache without a path) goes to a directory of the session's, for it and its subprocesses,
    never to the home of whoever runs the tests."""
    import os

    previous = os.environ.get("LLMROUTE_CACHE_DIR")
    os.environ["LLMROUTE_CACHE_DIR"] = str(tmp_path_factory.mktemp("llmroute-cache"))
    yield
    if previous is None:
        os.environ.pop("LLMROUTE_CACHE_DIR", None)
    else:
        os.environ["LLMROUTE_CACHE_DIR"] = previous


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every ``anyio.sleep`` delay asked for during the test (still slept): a wait is checked by
    what was asked, not by a clock."""
    asked: list[float] = []
    real = anyio.sleep

    async def recording(delay: float, *args: Any, **kwargs: Any) -> None:
        asked.append(delay)
        await real(delay, *args, **kwargs)

    monkeypatch.setattr(anyio, "sleep", recording)
    return asked


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def sim() -> Iterator[Simulator]:
    """A zero-latency TLS + HTTP/2 simulator with 20-token replies, shared by the session."""
    with Simulator(profile=Profile(reply_tokens=20), tls=True) as server:
        yield server


@pytest.fixture(scope="session")
def sim_h1() -> Iterator[Simulator]:
    """The same simulator over plain HTTP/1.1."""
    with Simulator(profile=Profile(reply_tokens=20), tls=False) as server:
        yield server


@pytest.fixture(scope="session")
def sim_slow() -> Iterator[Simulator]:
    """Tokens every 10 ms: streams stay busy for a while."""
    with Simulator(profile=Profile(reply_tokens=200, inter_token=0.01), tls=True) as server:
        yield server


@pytest.fixture(scope="session")
def sim_stall() -> Iterator[Simulator]:
    """Every first token takes 5 s: a target that always needs hedging."""
    with Simulator(profile=Profile(reply_tokens=20, ttft_median=5.0), tls=True) as server:
        yield server
