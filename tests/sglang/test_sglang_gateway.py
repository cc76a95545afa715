"""SGLang's model gateway (the real ``smg``) in front of stand-in workers, started by the
launcher: readiness and identity through it, routing through it, errors, nothing left running."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import anyio
import pytest

from llmroute import AsyncOpenAI
from llmroute.sglang import (
    SGLangError,
    SGLangGatewayNotInstalled,
    SGLangServer,
    SGLangStartupError,
    _gateway,
    find_smg,
)
from llmroute.testing import sglang_standin_path

pytestmark = pytest.mark.skipif(
    find_smg() is None,
    reason="SGLang's gateway (smg) is not installed: pip install 'llmroute[gateway]'",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the launcher's own tests cover trio; these start real processes


def standin_env(**knobs: str) -> dict[str, str]:
    return {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_WARMUP": "0", **knobs}


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def system_prompt(topic: str) -> str:
    return f"You are the {topic} assistant. " + f"Answer about {topic} with care. " * 40


@pytest.mark.anyio
async def test_the_gateway_fronts_the_workers_and_keeps_a_chat_on_its_cache(
    tmp_path: Path,
) -> None:
    server = SGLangServer(
        "org/m", gpus=[0, 1], env=standin_env(), log_dir=tmp_path, gateway=True, grace=2
    )
    async with server:
        gateway = server.gateway
        assert gateway is not None and gateway.pid is not None
        assert server.gateway_url == gateway.url
        pids = [*server.pids, gateway.pid]
        assert server.targets("gpu") == ["gpu:m"]
        assert server.providers("gpu")["gpu"]["kind"] == "sglang-gateway"
        async with AsyncOpenAI(api_key="unused", base_url=gateway.url) as client:
            assert server.register(client, "chat", provider="gpu") == ["gpu:m"]
            messages = [
                {"role": "system", "content": system_prompt("billing")},
                {"role": "user", "content": "What is my balance?"},
            ]
            first = await client.chat.completions.create(model="chat", messages=messages)
            messages += [
                {"role": "assistant", "content": first.choices[0].message.content or ""},
                {"role": "user", "content": "And last month?"},
            ]
            second = await client.chat.completions.create(model="chat", messages=messages)
        details = second.usage.prompt_tokens_details if second.usage else None
        # The gateway sent the second turn where the first one's prefix is cached.
        assert details is not None and (details.cached_tokens or 0) > 100
        assert "--policy cache_aware" in (tmp_path / "smg-gateway.log").read_text()
        assert server.api_key not in (tmp_path / "smg-gateway.log").read_text().splitlines()[0]
    with anyio.fail_after(20):
        while True:
            if all(gone(pid) for pid in pids):
                break
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_without_smg_the_gateway_is_an_error_before_any_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gateway, "find_smg", lambda: None)
    server = SGLangServer("org/m", env=standin_env(), log_dir=tmp_path, gateway=True)
    with pytest.raises(SGLangGatewayNotInstalled, match=r"pip install 'llmroute\[gateway\]'"):
        await server.start()
    assert server.pids == []
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".log")]


@pytest.mark.anyio
async def test_a_taken_gateway_port_stops_the_workers_and_names_the_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = SGLangServer(
            "org/m", env=standin_env(), log_dir=tmp_path, gateway=True, gateway_port=port, grace=2
        )
        with pytest.raises(SGLangStartupError, match=f"port {port} on 127.0.0.1 is already in use"):
            await server.start()
    assert server.pids == []


@pytest.mark.anyio
async def test_an_unknown_gateway_flag_is_an_error_within_seconds(tmp_path: Path) -> None:
    server = SGLangServer(
        "org/m",
        env=standin_env(),
        log_dir=tmp_path,
        gateway=True,
        gateway_args=["--no-such-flag"],
        grace=2,
    )
    with anyio.fail_after(60), pytest.raises(SGLangError, match="exited with status 2"):
        await server.start()
    assert server.pids == []
    assert server.gateway is not None and server.gateway.pid is None


def test_the_cli_shows_the_gateways_command_without_its_key() -> None:
    import subprocess
    import sys
    import tomllib

    done = subprocess.run(
        [
            *(sys.executable, "-m", "llmroute.cli", "sglang", "launch", "org/m", "--gpus", "0,1"),
            *("--gateway", "--dry-run", "--api-key", "sk-never-shown"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **standin_env()},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The commands as TOML comments (two workers, then the gateway), then the config.
    commands = [line for line in done.stdout.splitlines() if line.startswith("#   ")]
    assert len(commands) == 3
    assert " launch --worker-urls http://127.0.0.1:" in commands[2]
    assert "--policy cache_aware" in commands[2] and "--api-key '***'" in commands[2]
    assert tomllib.loads(done.stdout)["providers"]["gpu"]["kind"] == "sglang-gateway"
    assert "sk-never-shown" not in done.stdout + done.stderr
