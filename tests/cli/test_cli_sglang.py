"""``llmroute sglang launch`` and ``llmroute doctor``: real subprocesses on the SGLang stand-in."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from llmroute.sglang import install_commands
from llmroute.testing import Simulator, sglang_standin_path

from ..conftest import KEY


def standin_env(**knobs: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": sglang_standin_path(),
        "SGLANG_STANDIN_WARMUP": "0.2",
        **knobs,
    }


def group_gone(pgid: int, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def running_with(token: str) -> list[int]:
    """Live (not zombie) processes whose command line contains ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def none_left(token: str, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running_with(token):
            return True
        time.sleep(0.05)
    return False


def launch(tmp_path: Path, model: str, **knobs: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmroute.cli",
            "sglang",
            "launch",
            model,
            "--gpus",
            "0,1",
            "--log-dir",
            str(tmp_path),
            "--grace",
            "5",
            "--",
            "--mem-fraction-static",
            "0.8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=standin_env(**knobs),
        start_new_session=True,
    )


def read_config(proc: subprocess.Popen[str]) -> str:
    lines: list[str] = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith('policy = "prefix"'):
            break
    return "".join(lines)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_launch_prints_a_config_and_a_signal_stops_the_servers(
    tmp_path: Path, stop: signal.Signals
) -> None:
    model = f"org/tiny-{uuid.uuid4().hex[:8]}"
    proc = launch(tmp_path, model)
    try:
        text = read_config(proc)
        name = model.rsplit("/", 1)[1]
        assert "[providers.gpu]" in text and "[providers.gpu-1]" in text, text
        assert f'targets = ["gpu:{name}", "gpu-1:{name}"]' in text
        assert len(running_with(model)) >= 2
        key = (tmp_path / "api_key").read_text().strip()
        assert key and key not in text
        assert (tmp_path / "api_key").stat().st_mode & 0o077 == 0
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        # stdout is the config alone (> gpu.toml is valid TOML); the status lines on stderr.
        assert "SGLang stopped." in err and "SGLang stopped." not in out
        routed = tomllib.loads(text + out)
        assert routed["models"]["chat"]["targets"] == [f"gpu:{name}", f"gpu-1:{name}"]
        assert key not in out + err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert none_left(model)
    for log in tmp_path.glob("*.log"):
        assert "--mem-fraction-static" in log.read_text()  # the user's flag reached SGLang


def test_a_signal_during_the_warm_up_stops_the_servers(tmp_path: Path) -> None:
    model = f"org/warming-{uuid.uuid4().hex[:8]}"
    proc = launch(tmp_path, model, SGLANG_STANDIN_WARMUP="30")
    try:
        deadline = time.monotonic() + 30
        while len(running_with(model)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(running_with(model)) >= 2
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert none_left(model)


def test_a_server_that_dies_after_it_was_ready_ends_the_launch(tmp_path: Path) -> None:
    model = f"org/dying-{uuid.uuid4().hex[:8]}"
    proc = launch(tmp_path, model, SGLANG_STANDIN_WARMUP="0.1", SGLANG_STANDIN_EXIT_AFTER="2")
    try:
        assert "[providers.gpu]" in read_config(proc)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert "exited with status 1" in err and "the end of its log" in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert none_left(model)


def run_launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmroute.cli", "sglang", "launch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env if env is not None else standin_env(),
        check=False,
    )


def with_nvidia_smi(tmp_path: Path) -> dict[str, str]:
    """An environment without sglang whose PATH has an ``nvidia-smi`` listing one GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA Stand-in (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PYTHONPATH": str(tmp_path), "PATH": path}


def test_without_sglang_the_launch_says_how_to_get_it(tmp_path: Path) -> None:
    done = run_launch("org/m", env=with_nvidia_smi(tmp_path))  # a GPU host, no sglang
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # one paragraph
    assert "SGLang is not installed for the Python interpreter" in done.stderr
    for step in install_commands(sys.executable):
        assert step in done.stderr
    assert "--image" in done.stderr
    assert done.stdout == ""


def test_the_install_commands_are_the_docs_recipe() -> None:
    """The launcher's install hint and docs/sglang.md's recipe are one text."""
    docs = (Path(__file__).parents[2] / "docs" / "sglang.md").read_text("utf-8")
    for step in install_commands("~/sglang-venv/bin/python"):
        assert f"\n{step}\n" in docs, step


@pytest.mark.parametrize("gpu_host", [True, False])
def test_a_dry_run_needs_neither_sglang_nor_a_gpu(tmp_path: Path, gpu_host: bool) -> None:
    """It prints each command and the config (valid TOML on stdout alone); what is missing is
    said on stderr."""
    env = with_nvidia_smi(tmp_path) if gpu_host else no_gpu_env(tmp_path)
    done = run_launch("org/m", "--gpus", "0", "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    config = tomllib.loads(done.stdout)
    assert config["models"]["chat"]["targets"] == ["gpu:m"]
    assert config["providers"]["gpu"]["kind"] == "sglang"
    assert "serve --model-path org/m" in done.stdout and "--enable-metrics" in done.stdout
    assert "SGLang is not installed for the Python interpreter" in done.stderr
    assert ("nvidia-smi is not on this host's PATH" in done.stderr) is not gpu_host
    assert "Traceback" not in done.stderr


def no_gpu_env(tmp_path: Path) -> dict[str, str]:
    """An environment without sglang (or its stand-in) and without ``nvidia-smi``."""
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this host has nvidia-smi")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_a_launch_on_a_host_without_a_gpu_is_refused_in_a_sentence(tmp_path: Path) -> None:
    done = run_launch("org/m", env=no_gpu_env(tmp_path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "llmroute sglang launch: nvidia-smi is not on this host's PATH, so it shows no GPU; "
        "SGLang's server needs a CUDA GPU (NVIDIA's): launch on a host that has one (--dry-run "
        "shows the commands anywhere)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0,x"], "--gpus takes GPU numbers separated by commas"),
        (["--gpus", "0,0"], "gpus has duplicates"),
        (["--startup-timeout", "0"], "startup_timeout must be a positive number"),
    ],
)
def test_bad_arguments_are_a_sentence_before_anything_starts(args: list[str], message: str) -> None:
    done = run_launch("org/m", *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_the_launch_tells_what_each_server_is_doing_while_it_loads(tmp_path: Path) -> None:
    model = f"org/loading-{uuid.uuid4().hex[:8]}"
    proc = launch(tmp_path, model, SGLANG_STANDIN_LOAD="3", SGLANG_STANDIN_WARMUP="0.5")
    try:
        assert "[providers.gpu]" in read_config(proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert none_left(model)
    assert proc.returncode == 0
    lines = [line for line in err.splitlines() if line.startswith("llmroute sglang launch:")]
    assert "waiting until they are ready" in lines[0]
    progress = "\n".join(lines[1:])
    assert "worker 0 (GPU 0): loading the weights" in progress
    assert "worker 1 (GPU 1): loading the weights" in progress
    assert "Traceback" not in err


def test_launch_dry_run_and_a_server_that_dies_at_start(tmp_path: Path) -> None:
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmroute.cli",
            "sglang",
            "launch",
            "org/m",
            "--dry-run",
            "--api-key",
            "sk-visible-only-as-stars",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=standin_env(),
        check=False,
    )
    assert dry.returncode == 0, dry.stderr
    assert "--schedule-policy lpm" in dry.stdout and "--enable-metrics" in dry.stdout
    assert "sk-visible-only-as-stars" not in dry.stdout
    dead = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmroute.cli",
            "sglang",
            "launch",
            "org/m",
            "--log-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=standin_env(SGLANG_STANDIN_EXIT_AFTER="0.1", SGLANG_STANDIN_WARMUP="5"),
    )
    assert dead.returncode == 1
    assert "llmroute sglang launch:" in dead.stderr


@pytest.mark.anyio
async def test_doctor_splits_ttft_for_a_self_hosted_target(sim: Simulator, tmp_path: Path) -> None:
    from llmroute.sglang import SGLangServer

    env = {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_WARMUP": "0.1"}
    async with SGLangServer("org/doctor-model", env=env, log_dir=tmp_path, grace=5) as server:
        config = tmp_path / "llmroute.toml"
        config.write_text(
            f'[providers.gpu]\nkind = "sglang"\nbase_url = "{server.base_url}"\n'
            f'api_key = "{server.api_key}"\n'
            f'[models.chat]\ntargets = ["gpu:doctor-model"]\n'
        )
        result = subprocess.run(  # noqa: ASYNC221 - the server runs in its own processes
            [
                sys.executable,
                "-m",
                "llmroute.cli",
                "doctor",
                "--config",
                str(config),
                "--probes",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=dict(os.environ),
        )
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("gpu:doctor-model"))
    assert "client" in row and "server" in row and " ms" in row, row
    assert server.api_key not in result.stdout + result.stderr
    assert KEY not in result.stdout
