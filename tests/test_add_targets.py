"""Targets added at run time: a provider and a route given in code, as a launched server does."""

from __future__ import annotations

import pytest

from llmroute import AsyncOpenAI, ConfigError
from llmroute.testing import Simulator

from .conftest import KEY

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
