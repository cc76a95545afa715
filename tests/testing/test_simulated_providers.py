"""A config's ``kind = "simulator"`` providers (started and stopped with the client, the gateway
and the commands that read a config) and ``llmroute sim`` (simulators until Ctrl-C)."""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

from llmroute import AsyncOpenAI, ConfigError
from llmroute.config import load_config
from llmroute.testing import ca_pem_path

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Hello!"}]

SIMULATED = """
[providers.fast]
kind = "simulator"
profile = { preset = "fast-but-spiky", ttft_median = "5ms", stall_prob = 0 }

[providers.steady]
kind = "simulator"
profile = { ttft_median = "10ms", reply_tokens = 4 }

[models.chat]
targets = ["fast:sim-small", "steady:sim-small"]
policy = "hedge"
"""


def refuses(base_url: str) -> bool:
    """Whether nothing listens at ``base_url``'s port any more."""
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.anyio
async def test_a_simulated_provider_starts_and_stops_with_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No base_url, key or verify in the TOML, and no OPENAI_API_KEY: the client starts each
    simulator the routes use, trusts the simulators' CA for them, and stops them on close."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    path = tmp_path / "llmroute.toml"
    path.write_text(SIMULATED)
    with anyio.fail_after(60):  # a hang guard only
        async with AsyncOpenAI(config=str(path)) as client:
            simulators = dict(client._llmroute.simulated.simulators)
            assert sorted(simulators) == ["fast", "steady"]
            answer = await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert answer.choices[0].finish_reason == "stop"
            assert answer.route is not None and answer.route.winner in (
                "fast:sim-small",
                "steady:sim-small",
            )
            assert sum(s.stats()["chat_requests"] for s in simulators.values()) >= 1
            providers = client._llmroute.providers
            assert providers["fast"].verify == ca_pem_path()  # one CA for every simulator
            assert providers["fast"].kind == "simulator"
            assert simulators["steady"].profile.reply_tokens == 4
            assert simulators["steady"].profile.ttft_median == pytest.approx(0.01)
            assert simulators["fast"].profile.stall_range == (0.7, 1.4)  # the preset's
    assert not client._llmroute.simulated
    assert all(refuses(s.base_url) for s in simulators.values())


def test_a_phase_changes_the_profile_after_its_time() -> None:
    config = {
        "providers": {
            "sim": {
                "kind": "simulator",
                "profile": {"reply_tokens": 8},
                "phases": [{"after": "0s", "profile": {"reply_tokens": 3}}],
            }
        },
        "models": {"chat": {"targets": ["sim:sim-small"]}},
    }
    with llmroute_sync_client(config) as client:
        sim = client._llmroute.dispatch.simulated.simulators["sim"]
        for _ in range(3000):  # a hang guard only: the phase applies at once
            if sim.app.profile.reply_tokens == 3:
                break
            time.sleep(0.01)
        answer = client.chat.completions.create(model="chat", messages=MESSAGES)
        assert len((answer.choices[0].message.content or "").split()) == 3


def llmroute_sync_client(config: dict[str, Any]) -> Any:
    from llmroute import OpenAI

    return OpenAI(config=config, api_key="unused")


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (
            {"kind": "simulator", "base_url": "https://127.0.0.1:1/v1"},
            "providers.sim.base_url: a simulated provider has its own base_url",
        ),
        (
            {"kind": "simulator", "verify": False},
            "providers.sim.verify: a simulated provider has its own verify",
        ),
        (
            {"kind": "simulator", "profile": {"ttft_medain": "5ms"}},
            "profile: unknown field 'ttft_medain' (did you mean 'ttft_median'?)",
        ),
        (
            {"kind": "simulator", "profile": {"ttft_median": "soon"}},
            "providers.sim.profile.ttft_median: expected a duration",
        ),
        ({"kind": "simulator", "profile": "flakey"}, "no preset 'flakey' (did you mean 'flaky'?)"),
        (
            {"kind": "simulator", "profile": {"rate_503": 3}},
            "rate_503: expected a probability from 0 to 1",
        ),
        (
            {
                "kind": "simulator",
                "phases": [
                    {"after": "10s", "profile": {"rate_503": 1}},
                    {"after": "5s", "profile": {"rate_503": 0}},
                ],
            },
            "phases.1.after: the phases must come in time order",
        ),
        ({"kind": "simulatr"}, "did you mean 'simulator'?"),
        (
            {"kind": "openai", "profile": "flaky"},
            'providers.sim.profile: profile is for kind = "simulator" providers only',
        ),
    ],
)
def test_simulator_mistakes_name_the_key(provider: dict[str, Any], message: str) -> None:
    config = {"providers": {"sim": provider}, "models": {"chat": {"targets": ["sim:sim-small"]}}}
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert message in str(caught.value)


def test_a_simulator_that_is_not_running_is_a_sentence() -> None:
    from llmroute.config import resolve

    config = load_config(
        {
            "providers": {"sim": {"kind": "simulator"}},
            "models": {"chat": {"targets": ["sim:sim-small"]}},
        }
    )
    assert config is not None
    with pytest.raises(ConfigError, match=r"providers\.sim: a simulated provider runs while"):
        resolve(config)


def test_the_gateway_starts_the_simulators_of_its_config(tmp_path: Path) -> None:
    """``llmroute serve --config`` over simulated providers: no base URL or CA to copy."""
    from llmroute.server import Gateway

    config = {
        **tomllib_loads(SIMULATED),
        "gateway": {"keys": {"ci": "GW_KEY_CI"}},
    }
    key = "gw-ci-key-0123456789abcdef"
    with Gateway(config, environ={"GW_KEY_CI": key}) as gateway:
        simulators = dict(gateway.app.client._llmroute.simulated.simulators)
        with openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0) as client:
            answer = client.chat.completions.create(model="chat", messages=MESSAGES)
        assert answer.choices[0].finish_reason == "stop"
    assert all(refuses(s.base_url) for s in simulators.values())


def tomllib_loads(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)


# -- llmroute sim ----------------------------------------------------------------------------


def test_every_flag_of_llmroute_sim_has_help() -> None:
    from llmroute.cli import _sim

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    _sim.register(commands)
    sim = commands.choices["sim"]
    flags = [a for a in sim._actions if a.option_strings and a.dest != "help"]
    assert {f.option_strings[0] for f in flags} >= {"--profile", "--port", "--no-tls", "--json"}
    assert all(f.help and len(f.help) > 10 for f in flags), [f.dest for f in flags]


def test_llmroute_sim_serves_until_ctrl_c(tmp_path: Path) -> None:
    """It prints each simulator's base URL and the one CA file that trusts them all; a client
    that trusts that file is answered by each; SIGINT (Ctrl-C) stops it with status 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "LLMROUTE_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "llmroute", "sim", "--profile", "steady-slow"]
    command += ["--profile", 'quick={"reply_tokens": 3}']
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env
    )
    try:
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 60
        while b"Ctrl-C" not in seen:  # bounded: 60 s, and a closed pipe ends it
            left = deadline - time.monotonic()
            readable, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            chunk = os.read(proc.stdout.fileno(), 65536) if readable else b""
            assert chunk, seen
            seen += chunk
        lines = seen.decode().splitlines()
        urls = {
            line.split()[0]: line.split()[1]
            for line in lines
            if line.startswith("  ") and "//" in line
        }
        assert sorted(urls) == ["quick", "steady-slow"]
        ca = next(line.split(None, 1)[1] for line in lines if line.startswith("CA:"))
        import ssl

        import httpx

        trust = ssl.create_default_context(cafile=ca)  # the one CA, for every simulator
        for url in urls.values():
            http = httpx.Client(verify=trust)
            with openai.OpenAI(base_url=url, api_key="any", http_client=http) as client:
                answer = client.chat.completions.create(model="sim-small", messages=MESSAGES)
                assert answer.choices[0].finish_reason == "stop"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert b"llmroute sim: stopped" in out and b"Traceback" not in err
    assert all(refuses(url) for url in urls.values())


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("flakey", "no preset 'flakey' (did you mean 'flaky'?)"),
        ("{bad", "not a JSON object"),
        ('{"ttft_medain": 1}', "did you mean 'ttft_median'?"),
    ],
)
def test_llmroute_sim_profile_mistakes_are_sentences(flag: str, message: str) -> None:
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "llmroute", "sim", "--profile", flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("llmroute sim: --profile") and message in done.stderr
