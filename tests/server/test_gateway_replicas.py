"""Two gateway replicas on one Redis: per-key limits (``limits_backend = "redis"``) and the
routes' TTFT statistics (``stats_backend = "redis"``) hold across them, as behind any load
balancer. The replicas are two ``Gateway`` servers, each with its own event loop, client,
connections and stats, sharing nothing but the Redis server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

KEYS = {"alpha": "gw-replica-alpha-0123456789", "beta": "gw-replica-beta-0123456789"}
ENVIRON = {"GW_ALPHA": KEYS["alpha"], "GW_BETA": KEYS["beta"]}
MESSAGES = [{"role": "user", "content": "Tell me about replicas."}]
DEADLINE = 10.0


@pytest.fixture(scope="module")
def slow() -> Iterator[Simulator]:
    """300 tokens 10 ms apart: a stream holds its slot for about 3 s."""
    with Simulator(profile=Profile(reply_tokens=300, inter_token=0.01), tls=False) as server:
        yield server


@pytest.fixture
def replicas(redis_url: str, slow: Simulator) -> Iterator[tuple[Gateway, Gateway]]:
    config: dict[str, Any] = {
        "providers": {"slow": {"base_url": slow.base_url, "api_key": "sk-replica-upstream"}},
        "models": {"chat": {"targets": ["slow:sim-small"]}},
        "routing": {"explore": 0, "stats_backend": "redis", "stats_sync": "100ms"},
        "redis": {"url": redis_url, "prefix": f"replicas-{uuid.uuid4().hex[:8]}"},
        "gateway": {
            "keys": {"alpha": "GW_ALPHA", "beta": "GW_BETA"},
            "max_concurrency_per_key": 2,
            "limits_backend": "redis",
        },
    }
    with ExitStack() as stack:
        first = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        second = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        yield first, second


def _post(gateway: Gateway, key: str, **fields: Any) -> httpx.Response:
    with httpx.Client(timeout=DEADLINE) as client:
        return client.post(
            gateway.base_url + "/chat/completions",
            json={"model": "chat", "messages": MESSAGES, **fields},
            headers={"authorization": f"Bearer {KEYS[key]}"},
        )


def test_a_keys_limit_holds_across_replicas(replicas: tuple[Gateway, Gateway]) -> None:
    first, second = replicas
    readers: list[Iterator[bytes]] = []  # kept: a dropped reader closes its connection
    with httpx.Client(timeout=DEADLINE) as client, ExitStack() as streams:
        for _ in range(2):  # alpha's two slots, both taken on the first replica
            reply = streams.enter_context(
                client.stream(
                    "POST",
                    first.base_url + "/chat/completions",
                    json={"model": "chat", "messages": MESSAGES, "stream": True},
                    headers={"authorization": f"Bearer {KEYS['alpha']}"},
                )
            )
            assert reply.status_code == 200
            readers.append(reply.iter_bytes())
            next(readers[-1])  # in flight
        refused = _post(second, "alpha")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert _post(second, "beta").status_code == 200  # another key is unaffected
    # The streams closed: their slots are released, on the other replica too.
    deadline = time.monotonic() + DEADLINE
    status = 429
    while status == 429 and time.monotonic() < deadline:
        status = _post(second, "alpha").status_code
        if status == 429:
            time.sleep(0.05)
    assert status == 200


def test_ttft_statistics_are_shared_across_replicas(replicas: tuple[Gateway, Gateway]) -> None:
    first, second = replicas
    for _ in range(5):
        assert _post(first, "alpha", stream=True, max_tokens=3).status_code == 200

    def samples(gateway: Gateway) -> int:
        health = httpx.get(gateway.base_url.removesuffix("/v1") + "/health").json()
        return health["targets"]["slow:sim-small"]["n"]

    # Replicas publish and take samples when they route (a request starts a sync once one is
    # due, every stats_sync): one more request on the first, a sync later, publishes its five.
    time.sleep(0.15)
    assert _post(first, "alpha", stream=True, max_tokens=3).status_code == 200
    theirs = 5
    own = 0
    deadline = time.monotonic() + DEADLINE
    while samples(second) < own + theirs and time.monotonic() < deadline:
        assert _post(second, "beta", stream=True, max_tokens=3).status_code == 200
        own += 1
        time.sleep(0.15)
    assert samples(second) >= own + theirs
    assert own < 20


def test_serve_with_workers_answers_and_stops_cleanly(tmp_path: Path) -> None:
    """``llmroute serve --workers 2``: two processes on one socket; SIGTERM stops both, exit 0."""
    config = tmp_path / "llmroute.toml"
    config.write_text(
        '[providers.up]\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "W_UP"\n'
        '[models.chat]\ntargets = ["up:m"]\n[gateway]\nkeys = { a = "W_KEY" }\nport = 0\n'
    )
    env = {**os.environ, "W_UP": "sk-workers-up", "W_KEY": KEYS["alpha"]}
    command = [sys.executable, "-m", "llmroute.cli", "serve", "--config", str(config)]
    command += ["--workers", "2", "--log-level", "error"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "2 workers" in line
        root = line.split("listening on ", 1)[1].split()[0].removesuffix("/v1")
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        assert len(children) == 2
        for _ in range(4):
            assert httpx.get(root + "/health", timeout=DEADLINE).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
