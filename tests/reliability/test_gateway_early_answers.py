"""Item 1 of the gateway's hardening: an answer sent before a request's body is read (401 for
a wrong key, 413 for a body too large, 429 over a key's limit, 400 for a bad request) must not
disturb any other stream on the same HTTP/2 connection (hypercorn 0.18 dropped the connection:
issue #329, fixed in llmroute/server/_h2.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator
from tests.reliability.gateway_kit import KEYS, client_context, config, tls_gateway

ROUNDS = 3


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def slow() -> Iterator[Simulator]:
    """Replies of 30 tokens 10 ms apart: the good streams are in flight while the bad arrive."""
    with Simulator(profile=Profile(reply_tokens=30, inter_token=0.01)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(slow: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = config({"slow": slow}, max_body_bytes="16KiB", max_concurrency_per_key=4)
    with tls_gateway(cfg, tmp_path_factory.mktemp("tls"), verify=slow.ssl_context()) as gw:
        yield gw


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "slow", "messages": [{"role": "user", "content": content}], **extra}


async def _expected(slow: Simulator, content: str) -> str:
    """The simulator's own answer to ``content``, streamed directly."""
    async with httpx.AsyncClient(verify=slow.ssl_context(), http2=True) as client:
        reply = await client.post(
            f"{slow.base_url}/chat/completions",
            json={**_chat(content), "model": "sim-small"},
            headers={"authorization": "Bearer x"},
        )
    return reply.json()["choices"][0]["message"]["content"]


def _text(sse: str) -> str:
    parts: list[str] = []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            parts.extend(c["delta"].get("content") or "" for c in chunk["choices"])
    return "".join(parts)


async def _one_round(url: str, prompts: list[str]) -> dict[str, list[Any]]:
    """Good, crowded and bad requests at once on one HTTP/2 connection; what each got."""
    results: dict[str, list[Any]] = {"good": [], "crowd": [], "bad": []}
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(
        http2=True, verify=client_context(), timeout=30, limits=limits
    ) as client:

        async def post(kind: str, key: str, body: dict[str, Any]) -> None:
            headers = {"authorization": f"Bearer {key}"}
            try:
                reply = await client.post(url, content=json.dumps(body).encode(), headers=headers)
                results[kind].append((body, reply.status_code, reply.text))
            except httpx.HTTPError as exc:  # a dropped connection: the harm itself
                results[kind].append((body, type(exc).__name__, ""))

        async with anyio.create_task_group() as tg:
            for p in prompts:  # within alpha's limit of 4: all must complete exactly
                tg.start_soon(post, "good", KEYS["alpha"], _chat(p, stream=True))
            for i in range(8):  # beta: 4 in its slots, the rest 429 (also well-formed)
                tg.start_soon(post, "crowd", KEYS["beta"], _chat(prompts[i % 4], stream=True))
            for _ in range(3):  # a wrong key with a 30 KB body: 401 before it is read
                tg.start_soon(post, "bad", "wrong-key", _chat("x" * 30_000))
            for _ in range(3):  # over max_body_bytes (16 KiB): 413
                tg.start_soon(post, "bad", KEYS["gamma"], _chat("y" * 40_000))
            for _ in range(3):  # a bad request: 400
                tg.start_soon(post, "bad", KEYS["gamma"], _chat("z", stream="false"))
    return results


@pytest.mark.anyio
async def test_early_answers_leave_every_other_stream_whole(
    gateway: Gateway, slow: Simulator
) -> None:
    prompts = [f"good request number {i}" for i in range(4)]
    expected = {p: await _expected(slow, p) for p in prompts}
    for _ in range(ROUNDS):
        results = await _one_round(gateway.base_url + "/chat/completions", prompts)
        assert sorted(r[1] for r in results["bad"]) == [400] * 3 + [401] * 3 + [413] * 3
        for body, status, text in results["good"]:
            assert status == 200
            assert text.endswith("data: [DONE]\n\n")
            assert _text(text) == expected[body["messages"][0]["content"]]
        statuses = sorted(str(r[1]) for r in results["crowd"])
        assert set(statuses) <= {"200", "429"}, statuses
        assert statuses.count("200") >= 4
        for body, status, text in results["crowd"]:
            if status == 200:
                assert _text(text) == expected[body["messages"][0]["content"]]
