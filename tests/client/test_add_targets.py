"""Targets added at run time: a provider and a route given in code, as a launched server does."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from llmroute import AsyncOpenAI, ConfigError
from llmroute.testing import Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio


async def test_a_client_without_config_gets_a_route(sim: Simulator) -> None:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        c.add_provider("gpu", {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY})
        c.add_targets("chat", ["gpu:sim-small"], policy="fastest")
        completion = await c.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.route.winner == "gpu:sim-small"
        c.add_provider("gpu-1", {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY})
        c.add_targets("chat", ["gpu-1:sim-small", "gpu:sim-small"])
        assert c._router is not None
        assert [t.name for t in c._router.routes["chat"].targets] == [
            "gpu:sim-small",
            "gpu-1:sim-small",
        ]
        plain = await c.chat.completions.create(
            model="sim-small", messages=[{"role": "user", "content": "hi"}]
        )
        assert plain.route is None  # other model names still go to base_url
        assert KEY not in repr(c._providers["gpu"])


async def test_bad_tables_are_named(sim: Simulator) -> None:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        with pytest.raises(ConfigError, match=r"providers\.gpu"):
            c.add_provider("gpu", {"kind": "sglang", "base_url": "ftp://x"})
        with pytest.raises(ConfigError, match="unknown provider 'nope'"):
            c.add_targets("chat", ["nope:m"])
        c.add_provider("gpu", {"kind": "sglang", "base_url": sim.base_url})
        with pytest.raises(ConfigError, match=r"models\.chat\.policy"):
            c.add_targets("chat", ["gpu:m"], policy="sometimes")
        c.add_targets("chat", ["gpu:m"])
        with pytest.raises(ConfigError, match="cannot change"):
            c.add_targets("chat", ["gpu:m"], policy="fastest")


async def test_a_started_sglang_server_registers_itself_as_targets(tmp_path: Any) -> None:
    from llmroute.sglang import SGLangServer
    from llmroute.testing import sglang_standin_path

    env = {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_WARMUP": "0.1"}
    async with (
        SGLangServer("org/reg-model", gpus=[0, 1], env=env, log_dir=tmp_path, grace=5) as server,
        AsyncOpenAI(api_key=KEY) as client,
    ):
        targets = server.register(client, "chat", provider="gpu", policy="least-loaded")
        assert targets == ["gpu:reg-model", "gpu-1:reg-model"]
        for _ in range(3):
            completion = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hello"}]
            )
            assert completion.route.winner in targets
        # The client read the servers' own /metrics in the background: their load is known.
        assert client._router is not None
        stats = client._router.stats
        with anyio.move_on_after(10):
            while any(stats.target(t).load.server is None for t in targets):
                await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "again"}]
                )
                await anyio.sleep(0.3)
        assert all(stats.target(t).load.server is not None for t in targets)
        assert all(client.stats()[t].server is not None for t in targets)
        assert server.api_key not in repr(client._providers["gpu"])


async def test_a_weighted_route_refuses_targets_without_weights(sim: Simulator) -> None:
    config = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {
            "chat": {"targets": ["sim:a", "sim:b"], "policy": "weighted", "weights": [1, 2]}
        },
    }
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
        with pytest.raises(ConfigError, match="weighted route"):
            c.add_targets("chat", ["sim:c"])
        answer = await c.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.route.winner in ("sim:a", "sim:b")


async def test_copies_share_one_metrics_reader(tmp_path: Any) -> None:
    from llmroute.sglang import SGLangServer
    from llmroute.testing import sglang_standin_path

    env = {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_WARMUP": "0.1"}
    async with (
        SGLangServer("org/one", env=env, log_dir=tmp_path, grace=5) as server,
        AsyncOpenAI(api_key=KEY) as client,
    ):
        server.register(client, "chat", provider="gpu")
        for _ in range(5):
            copy = client.with_options(timeout=30)
            await copy.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}]
            )
            assert copy._servers is client._servers
        assert client._servers._poller is not None


async def test_copies_made_before_a_route_is_added_see_it(sim: Simulator) -> None:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        early = c.with_options(timeout=30)
        c.add_provider("gpu", {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY})
        c.add_targets("chat", ["gpu:sim-small"])
        answer = await early.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.route.winner == "gpu:sim-small"
