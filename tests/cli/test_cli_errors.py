"""The command line's first hour: --version, python -m llmroute, and a sentence (never a
traceback) for each wrong flag, path, port or name, run as real subprocesses on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmroute import __version__
from llmroute.cli import main
from llmroute.testing import Simulator

from ..conftest import KEY


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LLMROUTE_CONFIG", "OPENAI_BASE_URL", "SSL_CERT_FILE", "OPENAI_API_KEY")
    }
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, **(env or {})},
    )


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


@pytest.mark.parametrize("entry", [["-m", "llmroute"], ["-m", "llmroute.cli"]])
def test_version_and_python_dash_m(entry: list[str]) -> None:
    done = run(*entry, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"llmroute {__version__}"
    helped = run(*entry, "--help")
    assert helped.returncode == 0 and "doctor" in helped.stdout


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_refuses_a_port_out_of_range(port: str) -> None:
    done = run("-m", "llmroute", "serve", "--port", port)
    no_traceback(done)
    assert done.returncode == 2
    assert f"argument --port: expected a port from 0 to 65535, got '{port}'" in done.stderr


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("{bad", "--profile-json is not valid JSON"),
        ("[1]", "--profile-json must be a JSON object"),
        ('{"ttft_medain": 1}', "unknown field 'ttft_medain' (did you mean 'ttft_median'?)"),
        ('{"ttft_median": "fast"}', "ttft_median: expected a number, got 'fast'"),
        ('{"stall_range": [1]}', "stall_range: expected [low, high] seconds, got [1]"),
        ('{"rate_503": 2}', "rate_503: expected a probability from 0 to 1, got 2"),
        ('{"preset": "flakey"}', "no preset 'flakey' (did you mean 'flaky'?)"),
    ],
)
def test_simulator_profile_mistakes_are_sentences(profile: str, message: str) -> None:
    done = run("-m", "llmroute.testing", "serve", "--profile-json", profile)
    no_traceback(done)
    assert done.returncode == 2
    assert done.stderr.startswith("python -m llmroute.testing serve: ")
    assert message in done.stderr


def test_bench_checks_its_output_paths_before_probing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir" / "out.json"
    assert main(["bench", "--simulator", "--json", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert f"--json {missing}: the directory {missing.parent} does not exist" in err
    assert out == ""  # not one probe was sent
    assert main(["bench", "--simulator", "--plot", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_an_unexpected_error_is_one_line_and_debug_shows_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmroute.cli import _cache

    async def broken(*args: object) -> int:
        raise RuntimeError("the disk\nis on fire")

    monkeypatch.setattr(_cache, "_cache_command", broken)
    assert main(["cache", "stats"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llmroute cache: unexpected error: RuntimeError: the disk is on fire\n")
    assert "--debug" in err and "Traceback" not in err
    with pytest.raises(RuntimeError, match="on fire"):
        main(["--debug", "cache", "stats"])


def test_chat_simulator_answers_without_keys_or_config() -> None:
    done = run("-m", "llmroute", "chat", "--simulator", "Hello!", "--show-route")
    no_traceback(done)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "timings: HTTP/2" in done.stderr
    # It routes, over the demo's three simulated providers (route 'chat', hedge).
    first = done.stderr.splitlines()[0]
    assert first.startswith("route 'chat' (hedge): winner "), done.stderr
    winner = first.split("winner ", 1)[1].split(",")[0]
    assert winner in {"fast-but-spiky:sim-small", "steady-slow:sim-small", "flaky:sim-small"}
    # A name that is not a route is asked of one simulator, never of a vendor.
    plain = run(
        "-m", "llmroute", "chat", "--simulator", "--model", "sim-small", "Hi", "--show-route"
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() and "is not a route" in plain.stderr


def test_chat_ca_must_be_a_pem_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    for ca, message in [(tmp_path / "nope.pem", "no such file"), (empty, "not a CA file")]:
        done = run("-m", "llmroute", "chat", "--ca", str(ca), "hi")
        no_traceback(done)
        assert done.returncode == 2 and f"llmroute chat: --ca {ca}: {message}" in done.stderr


def test_doctor_reaches_tls_with_ca_and_fails_for_a_dead_target(
    sim: Simulator, tmp_path: Path
) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.live]\nbase_url = "{sim.base_url}"\napi_key = "{KEY}"\n'
        '[providers.dead]\nbase_url = "https://127.0.0.1:1/v1"\napi_key = "sk-dead"\n'
        '[models.chat]\ntargets = ["live:sim-small"]\n'
        '[models.other]\ntargets = ["dead:sim-small"]\n'
    )
    done = run("-m", "llmroute", "doctor", "--config", str(config), "--probes", "2", "--ca",
               sim.ca_pem_path)  # fmt: skip
    no_traceback(done)
    assert done.returncode == 1
    live = next(line for line in done.stdout.splitlines() if line.startswith("live:"))
    assert " ms" in live and "Error" not in live
    assert "llmroute doctor: 1 of 2 targets failed: dead:sim-small (APIConnectionError" in (
        done.stderr
    )
    # Without the CA the simulator's certificate is not trusted: both fail, each named.
    untrusted = run("-m", "llmroute", "doctor", "--config", str(config), "--probes", "1")
    assert untrusted.returncode == 1
    assert "2 of 2 targets failed: live:sim-small (" in untrusted.stderr
    assert KEY not in untrusted.stdout + untrusted.stderr
    # The provider's own verify in the config does what --ca did.
    config.write_text(
        f'[providers.live]\nbase_url = "{sim.base_url}"\napi_key = "{KEY}"\n'
        f'verify = "{sim.ca_pem_path}"\n[models.chat]\ntargets = ["live:sim-small"]\n'
    )
    trusted = run("-m", "llmroute", "doctor", "--config", str(config), "--probes", "1")
    assert trusted.returncode == 0, trusted.stderr


@pytest.mark.parametrize(
    "extra",
    [["--config", "llmroute.toml"], ["--workers", "2"], ["--certfile", "c", "--keyfile", "k"]],
)
def test_serve_simulator_refuses_what_it_replaces(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--simulator", "--port", "0", *extra]) == 2
    err = capsys.readouterr().err
    assert f"--simulator and {extra[0]} do not go together" in err
    assert ('kind = "simulator"' in err) == (extra[0] == "--config")  # what to write instead


def test_serve_on_a_port_in_use_says_what_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer's port 8000 is often taken: the sentence names the way out."""
    import socket

    monkeypatch.setenv("LLMROUTE_GATEWAY_KEY", KEY)
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.sim]\nbase_url = "https://127.0.0.1:1/v1"\napi_key = "{KEY}"\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n'
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--config", str(config), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"llmroute serve: cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "pass another --port, or --port 0 for any free one" in err


def test_serve_without_a_config_points_at_the_simulator(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMROUTE_CONFIG", raising=False)
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmroute serve: the gateway needs a config with routes: pass --config")
    assert "llmroute serve --simulator serves simulated providers without one" in err
