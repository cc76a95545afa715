"""A known API key, used in a run that succeeds, fails and caches, appears nowhere it could leak.

The simulator runs in a child process, so this process's logs hold only the client's own records
(the simulator's HTTP/2 decoder logs the headers it receives at DEBUG).
"""

from __future__ import annotations

import logging
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI, OpenAIError, StreamInterrupted
from llmroute.testing import Profile, SimulatorProcess

pytestmark = pytest.mark.anyio

SECRET = "sk-live-SECRET-0f9e8d7c6b5a4f3e2d1c"
OTHER = "sk-live-OTHER-aa11bb22cc33dd44ee55"


@pytest.fixture(scope="module")
def upstream() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(profile=Profile(reply_tokens=8), tls=True) as sim:
        yield sim


def config(sim: SimulatorProcess, cache: dict[str, Any]) -> dict[str, Any]:
    return {
        "providers": {
            "a": {"base_url": sim.base_url, "api_key": SECRET, "continuation": {}},
            "b": {"base_url": sim.base_url, "api_key": OTHER, "continuation": {}},
        },
        "models": {"chat": {"targets": ["a:sim-small", "b:sim-small"], "policy": "hedge"}},
        "cache": cache,
    }


async def workload(client: AsyncOpenAI, seen: list[str]) -> None:
    """Answers, a cache hit, a continued break, and failures of every kind; everything the
    caller can see of them goes to ``seen``."""
    messages = [{"role": "user", "content": "Keep my secrets."}]
    for _ in range(20):  # the second ask is stored (after its answer): a later one is a hit
        completion = await client.chat.completions.create(
            model="chat", messages=messages, temperature=0
        )
        seen += [repr(completion), repr(completion.route), repr(completion.timings)]
        if completion.route.cache_hit:
            break
        await anyio.sleep(0.05)
    stream = await client.chat.completions.create(
        model="chat",
        messages=messages,
        stream=True,
        extra_headers={
            "x-sim-fault": "drop:2",
            "x-sim-fault-times": "1",
            "x-sim-fault-key": uuid.uuid4().hex,
        },
    )
    async for chunk in stream:
        seen.append(repr(chunk))
    seen.append(repr(stream.route))
    for fault in ("500", "429", "html502", "stream-error:1", "truncate:2"):
        try:
            stream = await client.chat.completions.create(
                model="chat",
                messages=messages,
                stream=True,
                extra_headers={"x-sim-fault": fault, "x-llmroute-cache": "off"},
            )
            async for _ in stream:
                pass
        except (AllTargetsFailed, StreamInterrupted, OpenAIError) as exc:
            seen += [str(exc), repr(exc), repr(getattr(exc, "report", None))]
            seen += [repr(e) for e in getattr(exc, "errors", {}).values()]
            seen.append(repr(getattr(exc, "body", None)))
    seen += [repr(client), repr(client.stats()), repr(client._providers)]
    seen.append(client.metrics.exposition().decode())


async def test_the_key_is_in_no_log_exception_repr_metric_or_cache_file(
    upstream: SimulatorProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level: httpx, h2, hpack, llmroute
    ctx = ssl.create_default_context(cafile=upstream.ca_pem_path)
    cache = {"backend": "disk", "path": str(tmp_path / "cache"), "min_hits": 2}
    seen: list[str] = []
    async with AsyncOpenAI(config=config(upstream, cache), verify=ctx, max_retries=0) as client:
        await workload(client, seen)
    assert any("cache_hit=True" in text for text in seen)  # the run did what it says
    assert any("continued_on=['" in text for text in seen)
    assert len(caplog.records) > 20
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r}" for r in caplog.records)
    files = b"".join(p.read_bytes() for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert files  # the cache wrote its files
    for key in (SECRET, OTHER):
        assert key not in logged
        assert key.encode() not in files
        for text in seen:
            assert key not in text, text[:200]


async def test_the_key_is_in_no_redis_key_or_value(
    upstream: SimulatorProcess, redis_url: str
) -> None:
    import redis

    ctx = ssl.create_default_context(cafile=upstream.ca_pem_path)
    prefix = "llmroute-secrets-test"
    cache = {"backend": "redis", "min_hits": 2}
    cfg = {**config(upstream, cache), "redis": {"url": redis_url, "prefix": prefix}}
    cfg["routing"] = {"stats_backend": "redis"}
    seen: list[str] = []
    async with AsyncOpenAI(config=cfg, verify=ctx, max_retries=0) as client:
        await workload(client, seen)
    server = redis.Redis.from_url(redis_url)
    try:
        keys = list(server.scan_iter(match=f"{prefix}*"))
        assert keys  # the cache and the shared stats wrote there
        dump = b"".join(keys)
        for key in keys:
            kind = server.type(key)
            if kind == b"string":
                dump += server.get(key) or b""
            elif kind == b"stream":
                dump += repr(server.xrange(key)).encode()
            elif kind == b"hash":
                dump += repr(server.hgetall(key)).encode()
        for secret in (SECRET, OTHER):
            assert secret.encode() not in dump
        for text in seen:
            assert SECRET not in text and OTHER not in text
    finally:
        for key in server.scan_iter(match=f"{prefix}*"):
            server.delete(key)
        server.close()


def test_turning_tls_verification_off_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="llmroute")
    AsyncOpenAI(api_key=SECRET, base_url="https://127.0.0.1:9/v1")
    assert not caplog.records  # verification is on by default, silently
    AsyncOpenAI(api_key=SECRET, base_url="https://127.0.0.1:9/v1", verify=False)
    (record,) = caplog.records
    assert "verification is off" in record.getMessage()
    assert SECRET not in record.getMessage()
