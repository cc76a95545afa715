"""The SGLang launcher: commands by version (with fake interpreters), then real processes
against the SGLang stand-in, through the same code path as a real server."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import llmroute
from llmroute.sglang import (
    SGLANG_SERVE_SINCE,
    SGLangError,
    SGLangNotInstalled,
    SGLangServer,
    SGLangStartupError,
    StartupProgress,
    _launcher,
    _process,
    startup_phase,
)
from llmroute.sglang._launcher import _SERVE_CODE, DEFAULT_FLAGS, parse_release

KEY = "sk-launcher-test-SECRET-0123456789"

ALL_FLAGS = (
    "--model-path MODEL_PATH, --model MODEL_PATH",
    "--served-model-name SERVED_MODEL_NAME",
    "--host HOST",
    "--port PORT",
    "--api-key API_KEY",
    "--schedule-policy {lpm,random,fcfs,dfs-weight,lof,priority}",
    "--enable-metrics",
    "--enable-cache-report",
    "--disable-radix-cache",
    "--disable-cuda-graph",
    "--tp-size TP_SIZE, --tp TP_SIZE",
)


def help_text(*flags: str) -> str:
    body = "\n".join(
        f"  {flag}\n                        Some help, with a-hyphen." for flag in flags
    )
    return (
        f"usage: launch_server.py [-h] --model-path MODEL_PATH\n\noptions:\n  -h, --help\n{body}\n"
    )


def fake_python(
    tmp_path: Path, version: str | None, help: str | None = None, *, name: str = "python"
) -> Path:
    """A stand-in interpreter: answers the version probe and ``--help``; logs every call."""
    path = tmp_path / name
    path.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""\
            import sys
            VERSION = {version!r}
            HELP = {help!r}
            with open({str(path) + ".calls"!r}, "a") as calls:
                calls.write(" ".join(sys.argv[1:]) + "\\n")
            if sys.argv[1:3] == ["-c", "import sglang; print(sglang.__version__)"]:
                if VERSION is None:
                    print("Traceback (most recent call last):", file=sys.stderr)
                    print("ModuleNotFoundError: No module named 'sglang'", file=sys.stderr)
                    sys.exit(1)
                print(VERSION)
                sys.exit(0)
            if "--help" in sys.argv:
                if HELP is None:
                    sys.exit(2)
                print(HELP)
                sys.exit(0)
            sys.exit(3)
            """
        )
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(python: Path) -> list[str]:
    log = Path(str(python) + ".calls")
    return log.read_text().splitlines() if log.exists() else []


def value_of(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        if token == flag:
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


# -- versions and entry points -----------------------------------------------------------------


def test_parse_release() -> None:
    assert parse_release("0.5.4.post3") == (0, 5, 4)
    assert parse_release("0.5.5rc0") == (0, 5, 5)
    assert parse_release("0.5.10") == (0, 5, 10)
    assert parse_release("v0.4.3") == (0, 4, 3)
    assert parse_release("unknown") == ()
    assert parse_release("0.5.10") > parse_release("0.5.5")  # numbers, not strings
    assert SGLANG_SERVE_SINCE == (0, 5, 5)


@pytest.mark.parametrize(
    ("version", "serve"),
    [
        ("0.4.3.post2", False),
        ("0.5.4.post3", False),
        ("0.5.5", True),
        ("0.5.5rc0", True),
        ("0.5.10.post1", True),
        ("1.0.0", True),
    ],
)
def test_entry_point_by_version(tmp_path: Path, version: str, serve: bool) -> None:
    python = fake_python(tmp_path, version, help_text(*ALL_FLAGS))
    server = SGLangServer("org/model", python=str(python), api_key=KEY)
    argv = server.command()
    assert server.version == version
    if serve:
        # `python -m sglang.cli.main` is a no-op (no __main__ guard): main() is called.
        assert argv[:4] == [str(python), "-c", _SERVE_CODE, "serve"]
    else:
        assert argv[:3] == [str(python), "-m", "sglang.launch_server"]
    assert argv[-len(DEFAULT_FLAGS) - 6 :] == [
        "--model-path",
        "org/model",
        "--served-model-name",
        "model",
        "--host",
        "127.0.0.1",
        "--port",
        str(server.ports[0]),
        "--api-key",
        "***",
        "--schedule-policy",
        "lpm",
        "--enable-metrics",
        "--enable-cache-report",
    ]
    assert "--disable-radix-cache" not in argv and "--disable-cuda-graph" not in argv
    assert value_of(server.command(reveal_key=True), "--api-key") == KEY


def test_flags_a_version_lacks_are_dropped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.sglang")
    old = [f for f in ALL_FLAGS if "cache-report" not in f and "schedule" not in f]
    python = fake_python(tmp_path, "0.3.0", help_text(*old))
    server = SGLangServer("m", python=str(python), extra_args=["--enable-cache-report"])
    argv = server.command()
    assert "--schedule-policy" not in argv
    # The user's own flags are passed as given: the server will say if it does not know one.
    assert argv.count("--enable-cache-report") == 1 and argv[-1] == "--enable-cache-report"
    assert "--enable-metrics" in argv
    assert "does not know --schedule-policy, --enable-cache-report" in caplog.text


def test_help_is_read_once_per_interpreter_and_version(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.6", help_text(*ALL_FLAGS))
    SGLangServer("m", python=str(python)).command()
    SGLangServer("n", python=str(python), gpus=[0, 1]).command(1)
    help_calls = [c for c in calls(python) if "--help" in c]
    assert len(help_calls) == 1
    assert help_calls[0].endswith("serve --help")
    assert len([c for c in calls(python) if "import sglang" in c]) == 2  # the version, each time


def test_unreadable_help_drops_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    python = fake_python(tmp_path, "0.5.6", None)
    argv = SGLangServer("m", python=str(python)).command()
    for flag in DEFAULT_FLAGS:
        assert flag in argv
    assert "listed no flags" in caplog.text


# -- user flags win ----------------------------------------------------------------------------


def test_user_flags_win_over_defaults(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.5", help_text(*ALL_FLAGS))
    extra = [
        "--schedule-policy=fcfs",
        "--enable-metrics",
        "--port",
        "40123",
        "--api-key",
        "user-key-SECRET",
        "--model",
        "other/Llama-3-8B",
        "--tp",
        "2",
    ]
    server = SGLangServer("org/model", python=str(python), api_key=KEY, extra_args=extra)
    argv = server.command(reveal_key=True)
    assert argv.count("--schedule-policy=fcfs") == 1 and "lpm" not in argv
    assert argv.count("--enable-metrics") == 1
    assert "--model-path" not in argv and value_of(argv, "--model") == "other/Llama-3-8B"
    assert argv.count("--port") == 1
    # What the user set is what the launcher waits on and reports.
    assert server.base_url == "http://127.0.0.1:40123/v1"
    assert server.api_key == "user-key-SECRET"
    assert server.served_model_name == "Llama-3-8B"
    assert argv[-len(extra) :] == extra
    shown = server.command()
    assert "user-key-SECRET" not in " ".join(shown)
    assert "user-key-SECRET" not in repr(server)


def test_api_key_defaults_to_a_random_key_argparse_can_read(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.5", help_text(*ALL_FLAGS))
    keys = {SGLangServer("m", python=str(python)).api_key for _ in range(20)}
    assert len(keys) == 20 and all(len(k) >= 32 and not k.startswith("-") for k in keys)
    dashed = SGLangServer("m", python=str(python), api_key="-starts-with-dash")
    assert "--api-key=-starts-with-dash" in dashed.command(reveal_key=True)
    assert "--api-key=***" in dashed.command()


def test_key_never_shown(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.5", help_text(*ALL_FLAGS))
    server = SGLangServer("m", python=str(python), api_key=KEY, log_dir=tmp_path / "logs")
    assert KEY not in repr(server) and "***" in repr(server)
    assert KEY not in " ".join(server.command())
    assert all(KEY not in str(p) for p in server.log_paths)
    assert server.provider_config()["api_key"] == KEY  # only where it is needed


# -- several GPUs, containers ------------------------------------------------------------------


def test_one_server_per_gpu(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.5", help_text(*ALL_FLAGS))
    server = SGLangServer("org/qwen", python=str(python), gpus=[2, 5], env={"HF_HOME": "/hf"})
    assert len(server) == 2
    assert len(set(server.ports)) == 2
    assert server.urls == [f"http://127.0.0.1:{p}/v1" for p in server.ports]
    for worker, gpu in enumerate([2, 5]):
        env = server.worker_env(worker)
        assert env["CUDA_VISIBLE_DEVICES"] == str(gpu)
        assert env["HF_HOME"] == "/hf" and env["PATH"] == os.environ["PATH"]
        assert value_of(server.command(worker), "--port") == str(server.ports[worker])
    assert len(set(server.log_paths)) == 2
    assert server.targets("gpu") == ["gpu:qwen", "gpu-1:qwen"]
    assert server.providers("gpu") == {
        "gpu": {"kind": "sglang", "base_url": server.urls[0], "api_key": server.api_key},
        "gpu-1": {"kind": "sglang", "base_url": server.urls[1], "api_key": server.api_key},
    }
    roots = [u.removesuffix("/v1") for u in server.urls]
    assert server.metrics_urls("gpu") == {"gpu:qwen": roots[0], "gpu-1:qwen": roots[1]}

    fixed = SGLangServer("m", python=str(python), gpus=[0, 1, 2], port=31000)
    assert fixed.ports == [31000, 31001, 31002]
    with pytest.raises(ValueError, match="port="):
        SGLangServer("m", gpus=[0, 1], extra_args=["--port", "1"])
    with pytest.raises(ValueError, match="duplicates"):
        SGLangServer("m", gpus=[0, 0])


def test_replicas_of_a_tensor_parallel_server(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.5", help_text(*ALL_FLAGS))
    server = SGLangServer("org/qwen", python=str(python), gpus=[0, 1, 2, 3], tp=2)
    assert len(server) == 2
    for worker, devices in enumerate(["0,1", "2,3"]):
        assert server.worker_env(worker)["CUDA_VISIBLE_DEVICES"] == devices
        assert value_of(server.command(worker), "--tp-size") == "2"
    # The size may come with SGLang's own flags instead, under any of its spellings.
    for flags in (["--tp", "2"], ["--tp-size=2"], ["--tensor-parallel-size", "2"]):
        same = SGLangServer("m", python=str(python), gpus=[4, 5, 6, 7], extra_args=flags)
        assert [same.worker_env(i)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["4,5", "6,7"]
        assert "--tp-size" not in same.command(0) or flags == ["--tp-size=2"]
        assert " ".join(flags) in " ".join(same.command(0))  # passed once, as given
    # Data parallel: each server takes tp x dp GPUs.
    both = SGLangServer("m", python=str(python), gpus=range(8), tp=2, extra_args=["--dp", "2"])
    assert [both.worker_env(i)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["0,1,2,3", "4,5,6,7"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": [0, 1, 2], "tp": 2}, r"3 GPU\(s\) \[0, 1, 2\] do not divide into servers of 2"),
        ({"gpus": [0, 1], "extra_args": ["--tp", "4"]}, "do not divide into servers of 4"),
        ({"gpus": [0, 1], "extra_args": ["--dp-size", "3"]}, "data parallel 3"),
        ({"tp": 2, "extra_args": ["--tp-size", "4"]}, "disagree"),
        ({"extra_args": ["--tp", "two"]}, "--tp takes a whole number"),
        ({"tp": 0}, "at least 1"),
    ],
)
def test_gpus_that_do_not_divide_are_an_error_before_anything_starts(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SGLangServer("m", **kwargs)


@pytest.mark.anyio
async def test_gpus_the_host_does_not_have_are_an_error_before_any_spawn(
    tmp_path: Path, standin: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)'\n"
        "echo 'GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-1)'\n"
    )
    smi.chmod(0o755)
    env = {**standin_env(standin), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    server = SGLangServer("m", gpus=[0, 1, 2, 3], tp=2, env=env, log_dir=tmp_path / "logs")
    with pytest.raises(SGLangError, match="GPUs 2,3 not on this host: nvidia-smi lists GPUs 0-1"):
        await server.start()
    assert server.pids == []
    assert not (tmp_path / "logs").exists()


def fake_docker(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A ``docker`` on PATH that runs ``docker run [options] IMAGE CMD...`` here (``python3``
    is this interpreter), honours ``--entrypoint``, accepts ``docker kill``, and logs each call
    as a JSON line. Returns the env that puts it first on PATH, and the log."""
    bin_dir = tmp_path / "docker-bin"
    bin_dir.mkdir(exist_ok=True)
    calls_log = tmp_path / "docker.calls"
    script = bin_dir / "docker"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""\
            import json, os, sys
            with open({str(calls_log)!r}, "a") as log:
                log.write(json.dumps(sys.argv[1:]) + "\\n")
            args = sys.argv[1:]
            if args[0] != "run":
                sys.exit(0)
            i, entry = 1, None
            while args[i].startswith("-"):
                if args[i] == "--entrypoint":
                    entry = args[i + 1]
                i += 2 if args[i] in ("--gpus", "-p", "--name", "-e", "-v", "--entrypoint") else 1
            command = ([entry] if entry else []) + args[i + 1 :]
            if command[0] == "python3":
                command[0] = sys.executable
            os.execvp(command[0], command)
            """
        )
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls_log


def docker_calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_container_command(tmp_path: Path, standin: str) -> None:
    path, calls_log = fake_docker(tmp_path)
    server = SGLangServer(
        "Qwen/Qwen2.5-7B-Instruct",
        image="lmsysorg/sglang:v0.5.5",
        gpus=[1, 3],
        api_key=KEY,
        env={**path, "PYTHONPATH": standin, "HF_TOKEN": "hf-SECRET"},
        container_args=["-v", "/data/hf:/root/.cache/huggingface"],
    )
    argv = server.command(1)
    port = server.ports[1]
    assert argv[:10] == [
        "docker",
        "run",
        "--gpus",
        "device=3",
        "--rm",
        "--init",
        "-p",
        f"127.0.0.1:{port}:{port}",
        "--ipc=host",
        "-e",
    ]
    # HF_TOKEN by name only, once; the caller's own mount of the cache replaces ours.
    assert argv.count("HF_TOKEN") == 1
    assert argv.count("-v") == 1
    image_at = argv.index("lmsysorg/sglang:v0.5.5")
    assert argv[image_at - 2 : image_at] == ["-v", "/data/hf:/root/.cache/huggingface"]
    assert argv[image_at + 1 : image_at + 3] == ["python3", "-c"]  # sglang serve, from 0.5.5
    assert argv[image_at + 4] == "serve"
    assert value_of(argv, "--host") == "0.0.0.0"  # inside the container; published on 127.0.0.1
    assert value_of(argv, "--api-key") == "***"
    assert "hf-SECRET" not in " ".join(server.command(1, reveal_key=True))
    assert server.version == "0.5.5"  # read in a throwaway container of the image
    probes = docker_calls(calls_log)
    assert probes[0][:6] == [
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        "lmsysorg/sglang:v0.5.5",
        "-c",
    ]
    assert probes[1][-1] == "--help"
    # --gpus device=N shows the container that GPU alone: no CUDA_VISIBLE_DEVICES is added.
    assert server.worker_env(1).get("CUDA_VISIBLE_DEVICES") == os.environ.get(
        "CUDA_VISIBLE_DEVICES"
    )
    tp = SGLangServer(
        "m", image="img", gpus=[0, 1, 2, 3], tp=2, env={**path, "PYTHONPATH": standin}
    )
    assert tp.command(1)[3] == '"device=2,3"'  # docker reads --gpus as CSV


def test_an_old_image_gets_launch_server_and_the_hf_cache(tmp_path: Path, standin: str) -> None:
    path, _ = fake_docker(tmp_path)
    env = {**path, "PYTHONPATH": standin, "SGLANG_STANDIN_VERSION": "0.4.0", "HF_HOME": ""}
    server = SGLangServer("m", image="lmsysorg/sglang:v0.4.0", env=env)
    argv = server.command()
    image_at = argv.index("lmsysorg/sglang:v0.4.0")
    assert argv[image_at + 1 : image_at + 4] == ["python3", "-m", "sglang.launch_server"]
    assert value_of(argv, "-v") == f"{Path.home() / '.cache/huggingface'}:/root/.cache/huggingface"
    mine = SGLangServer("m", image="img", env={**env, "HF_HOME": str(tmp_path / "hf")})
    assert f"{tmp_path / 'hf'}:/root/.cache/huggingface" in mine.command()
    given = SGLangServer("m", image="img", env=env, hf_cache=tmp_path / "mine")
    assert f"{tmp_path / 'mine'}:/root/.cache/huggingface" in given.command()
    assert "-v" not in SGLangServer("m", image="img", env=env, hf_cache=False).command()
    assert "HF_TOKEN" not in argv  # no token set, none passed


@pytest.mark.anyio
async def test_a_container_server_starts_stops_and_mounts_the_cache(
    tmp_path: Path, standin: str
) -> None:
    path, calls_log = fake_docker(tmp_path)
    cache = tmp_path / "hf-cache"
    server = SGLangServer(
        "org/m",
        image="lmsysorg/sglang:latest",
        env={**standin_env(standin), **path},
        hf_cache=cache,
        log_dir=tmp_path / "logs",
        startup_timeout=30,
        grace=2,
    )
    async with server:
        assert await get(server.base_url.removesuffix("/v1") + "/health_generate") == 200
    assert cache.is_dir()  # created before docker could create it as root
    runs = [c for c in docker_calls(calls_log) if "--name" in c]
    assert len(runs) == 1 and f"{cache}:/root/.cache/huggingface" in runs[0]
    assert server.pids == []


def test_an_image_without_sglang_is_a_clear_error(tmp_path: Path) -> None:
    path, _ = fake_docker(tmp_path)
    server = SGLangServer("m", image="ubuntu:24.04", env={**path, "PYTHONPATH": str(tmp_path)})
    with pytest.raises(SGLangNotInstalled, match="not installed in the container image ubuntu"):
        server.command()


# -- progress while starting -------------------------------------------------------------------

SGLANG_LOG = """\
[2026-12-01 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', ...)
Fetching 4 files: 100%|##########| 4/4 [00:41<00:00, 10.3s/it]
[2026-12-01 10:00:44 TP0] Load weight begin. avail mem=78.50 GB
Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:03<00:03,  1.52s/it]
[2026-12-01 10:00:51 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16
[2026-12-01 10:00:51 TP0] KV Cache is allocated. #tokens: 1007413, K size: 27.00 GB
[2026-12-01 10:00:52 TP0] Capture cuda graph begin. This can take up to several minutes.
Capturing batches (bs=160 avail_mem=9.81 GB):  40%|####      | 10/25 [00:03<00:04]
[2026-12-01 10:01:01 TP0] Capture cuda graph end. Time elapsed: 9.12 s. mem usage=0.72 GB
[2026-12-01 10:01:03] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-12-01 10:01:05] The server is fired up and ready to roll!
""".splitlines()


@pytest.mark.parametrize(
    ("upto", "phase"),
    [
        (1, "starting"),
        (2, "downloading the weights"),
        (3, "loading the weights"),
        (4, "loading the weights"),
        (6, "allocating the KV cache"),
        (8, "capturing CUDA graphs"),
        (9, "warming up"),
        (10, "warming up"),
        (11, "ready"),
    ],
)
def test_the_startup_phase_is_read_from_sglangs_log(upto: int, phase: str) -> None:
    assert startup_phase(SGLANG_LOG[:upto]) == phase


def test_the_startup_phase_never_goes_back() -> None:
    # The tail of a log may no longer hold the line that began the phase.
    assert startup_phase(["Loading safetensors checkpoint"], since="warming up") == "warming up"
    assert startup_phase([], since="capturing CUDA graphs") == "capturing CUDA graphs"


@pytest.mark.anyio
async def test_start_reports_each_workers_phase_while_it_loads(
    tmp_path: Path, standin: str
) -> None:
    server = SGLangServer(
        "m", gpus=[0, 1], env=standin_env(standin, load=60), log_dir=tmp_path, grace=2
    )
    reports: list[StartupProgress] = []

    def loading() -> bool:
        return any(set(report.phases.values()) == {"loading the weights"} for report in reports)

    error = await start_and_stop_with_progress(server, reports, loading)
    assert isinstance(error, SGLangStartupError)
    assert reports[0].labels == {0: "worker 0 (GPU 0)", 1: "worker 1 (GPU 1)"}
    assert "worker 1 (GPU 1): loading the weights" in str(reports[-1])
    assert server.pids == []


async def start_and_stop_with_progress(
    server: SGLangServer, reports: list[StartupProgress], when: Callable[[], bool]
) -> BaseException | None:
    raised: list[BaseException] = []

    async def starting() -> None:
        try:
            await server.start(progress=reports.append)
        except Exception as exc:
            raised.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(starting)
        await until(when, timeout=60)
        await server.stop()
    return raised[0] if raised else None


# -- a missing sglang --------------------------------------------------------------------------


def test_missing_sglang_is_a_clear_error(tmp_path: Path) -> None:
    python = fake_python(tmp_path, None)
    server = SGLangServer("m", python=str(python))
    with pytest.raises(SGLangNotInstalled) as info:
        server.command()
    message = str(info.value)
    assert str(python) in message
    assert f"{python} -m uv pip install --python {python} sglang" in message
    assert "docs/sglang.md" in message
    assert isinstance(info.value, SGLangError)
    # Without sglang, a dry run still has a command: the newest SGLang's, every default flag.
    planned = server.planned_command()
    assert planned[:4] == [str(python), "-c", planned[2], "serve"] and "sglang.cli" in planned[2]
    assert "--enable-metrics" in planned and "***" in planned


def test_real_interpreter_without_sglang(tmp_path: Path) -> None:
    server = SGLangServer("m", python=sys.executable, env={"PYTHONPATH": str(tmp_path)})
    with pytest.raises(SGLangNotInstalled, match="not installed"):
        server.command()


def test_missing_interpreter(tmp_path: Path) -> None:
    with pytest.raises(SGLangNotInstalled, match="does not exist"):
        SGLangServer("m", python=str(tmp_path / "nope" / "python")).command()


@pytest.mark.anyio
async def test_start_raises_not_installed(tmp_path: Path) -> None:
    server = SGLangServer("m", python=str(fake_python(tmp_path, None)), log_dir=tmp_path)
    with pytest.raises(SGLangNotInstalled):
        async with server:
            pass
    assert server.pids == []


def test_argument_checks() -> None:
    with pytest.raises(TypeError):
        SGLangServer("m", extra_args="--tp 2")
    with pytest.raises(ValueError):
        SGLangServer("m", startup_timeout=0)
    with pytest.raises(ValueError):
        SGLangServer("m", grace=-1)
    with pytest.raises(ValueError):
        SGLangServer("m", gpus=[])


# -- end to end, against the SGLang stand-in ---------------------------------------------------
#
# The stand-in is a real process that accepts SGLang's command line (``sglang serve`` and
# ``python -m sglang.launch_server``), found through PYTHONPATH exactly as a real install is.


@pytest.fixture(scope="module")
def standin() -> str:
    from llmroute.testing import sglang_standin_path

    return str(sglang_standin_path())


def standin_env(standin: str, **knobs: object) -> dict[str, str]:
    knobs.setdefault("warmup", 0)
    env = {"PYTHONPATH": standin}
    env.update({f"SGLANG_STANDIN_{name.upper()}": str(value) for name, value in knobs.items()})
    return env


def group_gone(pgid: int, timeout: float = 10.0) -> bool:
    """Whether process group ``pgid`` is gone (zombies reaped too) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def proc_argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def group_members(pgid: int) -> set[int]:
    members: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.add(int(entry.name))
    return members


HAS_PROC = Path("/proc/self/stat").exists()


def no_live_member(pgid: int, timeout: float = 10.0) -> bool:
    """Whether group ``pgid`` has no running process within ``timeout``. Zombies do not count:
    where PID 1 reaps orphans late, a group of orphans stays visible to killpg for a while."""
    if not HAS_PROC:
        return group_gone(pgid, timeout)
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def grandchildren(pgid: int) -> list[int]:
    """The stand-in's ``sglang::grandchild`` processes (SGLANG_STANDIN_GRANDCHILD) in the group:
    they outlive the server unless the whole group is signalled."""
    found: list[int] = []
    for pid in group_members(pgid):
        try:
            if "sglang::grandchild" in proc_argv(pid):
                found.append(pid)
        except OSError:
            continue
    return found


def has_grandchild(pgid: int) -> bool:
    """Whether the grandchild is there yet (always, where there is no /proc to tell)."""
    return not HAS_PROC or bool(grandchildren(pgid))


needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
# Process lifecycle does not depend on the event loop beyond sleeping: one backend is enough
# where a test is slow; readiness, errors and cancellation run on both.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


async def until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            if predicate():
                return
            await anyio.sleep(0.01)


async def get(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(trust_env=False) as http:
        try:
            return (await http.get(url, headers=headers, timeout=2.0)).status_code
        except httpx.HTTPError:
            return 0


@pytest.mark.anyio
async def test_ready_only_after_warmup_then_serves_chat(tmp_path: Path, standin: str) -> None:
    warm = tmp_path / "warm"  # the stand-in warms up when this file appears: the test decides
    server = SGLangServer(
        "org/Qwen-standin",
        api_key=KEY,
        env=standin_env(standin, warm_file=warm),
        log_dir=tmp_path,
        startup_timeout=120,  # generous: a loaded machine starts Python slowly
    )
    root = server.base_url.removesuffix("/v1")
    ready = anyio.Event()
    warming: list[tuple[int, bool]] = []  # (/health_generate, start() returned) at /v1/models 200

    async def warm_once_models_answers() -> None:
        with anyio.fail_after(120):  # a hang guard only
            while await get(root + "/v1/models", KEY) != 200:  # noqa: ASYNC110 - no event
                await anyio.sleep(0.05)
        warming.append((await get(root + "/health_generate", KEY), ready.is_set()))
        warm.touch()

    warmed_before_ready = False
    async with anyio.create_task_group() as group:
        group.start_soon(warm_once_models_answers)
        await server.start()
        ready.set()
        warmed_before_ready = warm.exists()
    try:
        # /v1/models answered while the server was still warming up: it is no readiness signal;
        # start() waited for the warm-up to end.
        assert warming == [(503, False)]
        assert warmed_before_ready
        assert await get(root + "/health_generate", KEY) == 200
        (pid,) = server.pids
        assert os.getpgid(pid) == pid  # a process group of its own

        client = llmroute.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        try:
            reply = await client.chat.completions.create(
                model=server.served_model_name,
                messages=[{"role": "user", "content": "Say hi"}],
                max_tokens=8,
            )
        finally:
            await client.close()
        assert reply.choices[0].message.content
    finally:
        await server.stop()
    assert server.pids == []
    assert group_gone(pid)
    await server.stop()  # idempotent


@pytest.mark.anyio
async def test_exit_before_ready_quotes_the_log(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m",
        api_key=KEY,
        env=standin_env(standin, warmup=600, exit_after=0.3, grandchild=1),
        log_dir=tmp_path,
        startup_timeout=600,  # the exit is noticed when it happens, not at the timeout
    )
    seen: list[int] = []

    async def watch() -> None:
        while not seen:
            seen.extend(server.pids)
            await anyio.sleep(0.01)

    with anyio.fail_after(60):  # a hang guard only: a launcher blind to the exit waits 600 s
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            with pytest.raises(SGLangStartupError) as info:
                async with server:
                    pytest.fail("the server cannot be ready")
            group.cancel_scope.cancel()
    error = info.value
    assert error.returncode == 1 and error.worker == 0
    message = str(error)
    assert "exited with status 1 before it was ready" in message
    assert str(server.log_paths[0]) in message
    assert "error" in message.lower().split("last lines of", 1)[1]
    assert KEY not in message
    assert server.pids == []
    assert stat.S_IMODE(server.log_paths[0].stat().st_mode) == 0o600
    # The crashed server left a descendant behind: stopping the group ended it too.
    assert seen and no_live_member(seen[0])


@asyncio_only
@pytest.mark.anyio
async def test_startup_timeout_stops_the_server(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m",
        env=standin_env(standin, warmup=60, grandchild=1),
        log_dir=tmp_path,
        startup_timeout=1.0,
    )
    seen: list[int] = []

    async def watch() -> None:
        while not seen:
            seen.extend(server.pids)
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        with pytest.raises(SGLangStartupError, match=r"not ready within 1 s \(stopped\)") as info:
            await server.start()
        group.cancel_scope.cancel()
    assert info.value.returncode is None
    assert server.pids == []
    assert seen and no_live_member(seen[0])


def record_stopping(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[signal.Signals], list[tuple[float, bool]]]:
    """The signals the launcher sends to a group, and each wait for the group to go (its
    timeout, whether the group went): what stop() did, told by events rather than by time."""
    signals: list[signal.Signals] = []
    waits: list[tuple[float, bool]] = []
    signal_group, wait_gone = _launcher._signal_group, _launcher._wait_gone

    def signalling(pgid: int, sig: signal.Signals) -> None:
        signals.append(sig)
        signal_group(pgid, sig)

    async def waiting(process: Any, pgid: int, timeout: float) -> bool:
        gone = await wait_gone(process, pgid, timeout)
        waits.append((timeout, gone))
        return gone

    monkeypatch.setattr(_launcher, "_signal_group", signalling)
    monkeypatch.setattr(_launcher, "_wait_gone", waiting)
    return signals, waits


@needs_proc
@asyncio_only
@pytest.mark.anyio
async def test_stop_leaves_no_process_of_the_group(
    tmp_path: Path, standin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = SGLangServer(
        "m",
        env=standin_env(standin, children=2, grandchild=1),
        log_dir=tmp_path,
        startup_timeout=20,
    )
    await server.start()
    (pid,) = server.pids
    assert len(group_members(pid)) >= 4  # the server, its two children and the grandchild
    assert len(grandchildren(pid)) == 1
    signals, waits = record_stopping(monkeypatch)
    await server.stop()
    assert signals == [signal.SIGTERM]  # SIGTERM to the group ended it all within the grace
    assert waits == [(server.grace, True)]
    assert group_members(pid) == set()


@needs_proc
@asyncio_only
@pytest.mark.anyio
async def test_sigterm_ignored_means_sigkill_after_the_grace(
    tmp_path: Path,
    standin: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.sglang")
    server = SGLangServer(
        "m",
        env=standin_env(standin, ignore_sigterm=1, children=1, grandchild=1),
        log_dir=tmp_path,
        grace=0.5,
        startup_timeout=20,
    )
    scans: list[bool] = []  # whether each /proc scan ran on the event loop's thread
    group_alive = _process._group_alive

    def recording(pgid: int) -> bool:
        scans.append(threading.current_thread() is threading.main_thread())
        return group_alive(pgid)

    monkeypatch.setattr(_process, "_group_alive", recording)
    await server.start()
    (pid,) = server.pids
    assert grandchildren(pid)
    signals, waits = record_stopping(monkeypatch)
    await server.stop()
    # The group lived through the whole grace after SIGTERM, then SIGKILL ended it.
    assert signals == [signal.SIGTERM, signal.SIGKILL]
    assert waits == [(0.5, False), (_launcher.KILL_TIMEOUT, True)]
    assert "SIGKILL" in caplog.text
    assert no_live_member(pid)
    # Every scan of the group ran in a worker thread, never on the event loop.
    assert scans and not any(scans)


@asyncio_only
@pytest.mark.anyio
async def test_drain_within_the_grace_needs_no_sigkill(
    tmp_path: Path, standin: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.sglang")
    server = SGLangServer(
        "m", env=standin_env(standin, drain=0.4), log_dir=tmp_path, grace=5, startup_timeout=20
    )
    await server.start()
    (pid,) = server.pids
    signals, waits = record_stopping(monkeypatch)
    await server.stop()
    # The server drained after SIGTERM and exited on its own, within the grace.
    assert signals == [signal.SIGTERM] and waits == [(5.0, True)]
    log = "\n".join(server.log_tail(0, lines=1000))
    assert "Received SIGTERM. Draining requests for 0.4s" in log
    assert "Shutdown complete." in log
    assert "SIGKILL" not in caplog.text
    assert group_gone(pid)


@needs_proc
@asyncio_only
@pytest.mark.anyio
async def test_two_workers_get_their_own_port_and_gpu(tmp_path: Path, standin: str) -> None:
    async with SGLangServer(
        "org/m", gpus=[0, 1], env=standin_env(standin), log_dir=tmp_path, startup_timeout=20
    ) as server:
        pids = server.pids
        assert len(pids) == 2 and len(set(server.ports)) == 2
        for worker, pid in enumerate(pids):
            assert proc_env(pid)["CUDA_VISIBLE_DEVICES"] == str(worker)
            argv = proc_argv(pid)
            assert value_of(argv, "--port") == str(server.ports[worker])
            root = server.urls[worker].removesuffix("/v1")
            assert await get(root + "/health_generate", server.api_key) == 200
        assert [p.exists() for p in server.log_paths] == [True, True]
    assert all(group_gone(pid) for pid in pids)


@needs_proc
@asyncio_only
@pytest.mark.anyio
async def test_an_old_version_gets_launch_server_without_cache_report(
    tmp_path: Path, standin: str
) -> None:
    async with SGLangServer(
        "m", env=standin_env(standin, version="0.3.0"), log_dir=tmp_path, startup_timeout=20
    ) as server:
        assert server.version == "0.3.0"
        argv = proc_argv(server.pids[0])
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        # 0.3.0 has neither switch (both came in 0.3.6); the rest of the defaults are passed.
        assert "--enable-cache-report" not in argv and "--enable-metrics" not in argv
        assert value_of(argv, "--schedule-policy") == "lpm"


@pytest.mark.anyio
async def test_a_cancelled_body_still_stops_the_server(tmp_path: Path, standin: str) -> None:
    pids: list[int] = []
    with anyio.CancelScope() as scope:
        async with SGLangServer(
            "m", env=standin_env(standin, grandchild=1), log_dir=tmp_path, startup_timeout=20
        ) as server:
            pids = server.pids
            scope.cancel()
            await anyio.sleep(30)
    assert pids and all(no_live_member(pid) for pid in pids)


@pytest.mark.anyio
async def test_cancelled_while_starting_leaves_nothing(tmp_path: Path, standin: str) -> None:
    server = SGLangServer("m", env=standin_env(standin, warmup=30, grandchild=1), log_dir=tmp_path)
    seen: list[int] = []
    async with anyio.create_task_group() as group:
        group.start_soon(server.start)
        while not seen:
            seen.extend(server.pids)
            await anyio.sleep(0.01)
        await until(lambda: has_grandchild(seen[0]))  # it outlives a server signalled alone
        group.cancel_scope.cancel()
    assert server.pids == []
    assert no_live_member(seen[0])


@asyncio_only
@pytest.mark.anyio
async def test_an_unknown_user_flag_is_the_server_s_error(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m", env=standin_env(standin), log_dir=tmp_path, extra_args=["--no-such-flag", "1"]
    )
    assert server.command()[-2:] == ["--no-such-flag", "1"]
    with pytest.raises(SGLangStartupError, match="exited with status 2") as info:
        await server.start()
    assert "unrecognized arguments: --no-such-flag 1" in str(info.value)


@asyncio_only
@pytest.mark.anyio
async def test_kill_is_immediate(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m",
        env=standin_env(standin, ignore_sigterm=1, grandchild=1),
        log_dir=tmp_path,
        startup_timeout=20,
    )
    await server.start()
    (pid,) = server.pids
    assert grandchildren(pid)
    server.kill()  # what runs at interpreter exit for servers still running
    assert server.pids == []
    assert no_live_member(pid)
    await server.stop()  # nothing left to stop


# -- a port that is not ours -------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on a free loopback port, as another server would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


@asyncio_only
@pytest.mark.anyio
async def test_a_given_port_in_use_fails_before_the_server_starts(
    tmp_path: Path, standin: str, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    server = SGLangServer("m", port=port, env=standin_env(standin), log_dir=tmp_path / "logs")
    with pytest.raises(SGLangStartupError, match=f"port {port} on 127.0.0.1 is already in use"):
        await server.start()
    assert server.pids == []
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


@asyncio_only
@pytest.mark.anyio
async def test_a_chosen_port_taken_meanwhile_is_replaced(
    tmp_path: Path, standin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.sglang")
    server = SGLangServer("m", env=standin_env(standin), log_dir=tmp_path, startup_timeout=20)
    chosen = server.ports[0]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", chosen))
        taken.listen()
        async with server:
            assert server.ports[0] != chosen
            assert server.base_url == f"http://127.0.0.1:{server.ports[0]}/v1"
            assert value_of(proc_argv(server.pids[0]), "--port") == str(server.ports[0])
            root = server.base_url.removesuffix("/v1")
            assert await get(root + "/health_generate", server.api_key) == 200
    assert f"port {chosen} was taken meanwhile" in caplog.text


class ForeignServer:
    """Another server on a port: ``/health_generate`` says 200, ``/get_model_info`` answers
    ``model_info``; ``before_health`` runs first in the handler's thread."""

    def __init__(
        self,
        model_info: tuple[int, bytes],
        before_health: Callable[[], None] = lambda: None,
    ) -> None:
        owner = self
        self.model_info = model_info
        self.before_health = before_health
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                if self.path == "/health_generate":
                    owner.before_health()
                    status, body = 200, b""
                elif self.path == "/get_model_info":
                    status, body = owner.model_info
                else:
                    status, body = 404, b'{"detail":"Not Found"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def port_taken_after_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another server takes the port between the launcher's check and its server's bind."""
    monkeypatch.setattr(_launcher, "_port_in_use", lambda host, port: False)


@asyncio_only
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("model_info", "why"),
    [
        ((401, b'{"error":"Unauthorized"}'), "it refused this server's API key"),
        ((200, b'{"model_path":"org/other-model"}'), "it serves model_path 'org/other-model'"),
    ],
)
@pytest.mark.usefixtures("port_taken_after_the_check")
async def test_another_server_on_the_port_is_not_taken_for_ours(
    tmp_path: Path, standin: str, model_info: tuple[int, bytes], why: str
) -> None:
    foreign = ForeignServer(model_info)
    try:
        server = SGLangServer(
            "org/m",
            port=foreign.port,
            api_key=KEY,
            env=standin_env(standin),
            log_dir=tmp_path,
            startup_timeout=20,
        )
        with pytest.raises(SGLangStartupError) as info:
            await server.start()
    finally:
        foreign.close()
    message = str(info.value)
    assert f"another server answers on port {foreign.port} ({why}" in message
    assert KEY not in message
    assert "/get_model_info" in foreign.paths
    assert server.pids == []


@asyncio_only
@pytest.mark.anyio
@pytest.mark.usefixtures("port_taken_after_the_check")
async def test_a_keyless_server_of_the_same_model_is_not_taken_for_ours(
    tmp_path: Path, standin: str
) -> None:
    """While ours loads (its port not bound yet), a server without an API key serving the same
    model answers on the port: it names our model to our key, but takes a wrong key too."""
    foreign = ForeignServer((200, b'{"model_path":"org/m"}'))
    try:
        server = SGLangServer(
            "org/m",
            port=foreign.port,
            api_key=KEY,
            env=standin_env(standin, load=60),
            log_dir=tmp_path,
            startup_timeout=20,
            grace=2,
        )
        with pytest.raises(SGLangStartupError) as info:
            await server.start()
    finally:
        foreign.close()
    message = str(info.value)
    assert f"another server answers on port {foreign.port} (it answered a wrong API key" in message
    assert KEY not in message
    assert foreign.paths.count("/get_model_info") == 2  # our key, then a wrong one
    assert server.pids == []


@needs_proc
@asyncio_only
@pytest.mark.anyio
@pytest.mark.usefixtures("port_taken_after_the_check")
async def test_a_200_once_our_process_died_is_not_readiness(tmp_path: Path, standin: str) -> None:
    server: SGLangServer | None = None

    def until_our_server_died() -> None:
        # Our stand-in cannot bind the foreign port and exits 1: answer only after that (a
        # zombie until the launcher reaps it), as a server on that port may always do.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = server.pids if server is not None else []
            try:
                if pids and Path(f"/proc/{pids[0]}/stat").read_text().split(") ")[1][0] in "ZX":
                    return
            except (OSError, IndexError):
                return
            time.sleep(0.02)

    # The same key and model: only the process tells it is not ours.
    foreign = ForeignServer((200, b'{"model_path":"org/m"}'), until_our_server_died)
    try:
        server = SGLangServer(
            "org/m",
            port=foreign.port,
            api_key=KEY,
            env=standin_env(standin),
            log_dir=tmp_path,
            startup_timeout=20,
        )
        with pytest.raises(SGLangStartupError, match="exited with status 1 before it was ready"):
            await server.start()
    finally:
        foreign.close()
    assert server.pids == []


# -- stop() during start() ---------------------------------------------------------------------


async def start_and_stop(server: SGLangServer, when: Callable[[], object]) -> BaseException | None:
    """Start ``server`` in a task, call stop() once ``when()``; what start() raised."""
    raised: list[BaseException] = []

    async def starting() -> None:
        try:
            await server.start()
        except BaseException as exc:
            raised.append(exc)
            if not isinstance(exc, Exception):
                raise

    async with anyio.create_task_group() as group:
        group.start_soon(starting)
        await until(when)
        await server.stop()
    return raised[0] if raised else None


@pytest.mark.anyio
async def test_stop_while_starting_makes_start_raise_cleanly(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m", env=standin_env(standin, warmup=30, grandchild=1), log_dir=tmp_path, grace=2
    )
    seen: list[int] = []

    def started() -> bool:
        seen.extend([] if seen else server.pids)
        return bool(seen) and has_grandchild(seen[0])  # it outlives a server signalled alone

    error = await start_and_stop(server, started)
    assert isinstance(error, SGLangStartupError), repr(error)
    assert "was stopped before it was ready" in str(error)
    assert error.worker == 0 and error.returncode is None
    assert server.pids == []
    assert no_live_member(seen[0])
    await server.stop()  # still idempotent


def slow_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter whose ``import sglang`` takes a minute; it writes its pid first."""
    path, pid_file = tmp_path / "python", tmp_path / "probe.pid"
    path.write_text(
        f"#!{sys.executable}\n"
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path, pid_file


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["cancel", "stop"])
async def test_a_slow_version_probe_does_not_hold_up_cancellation_or_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The probe sleeps 60 s and may be waited on for 600: a hang, if it cannot be cut short.
    monkeypatch.setattr(_launcher, "VERSION_TIMEOUT", 600.0)
    python, pid_file = slow_python(tmp_path)
    server = SGLangServer("m", python=str(python), log_dir=tmp_path)
    with anyio.fail_after(30):  # a hang guard only
        if how == "cancel":
            async with anyio.create_task_group() as group:
                group.start_soon(server.start)
                await until(lambda: pid_file.exists() and pid_file.read_text())
                group.cancel_scope.cancel()
        else:
            error = await start_and_stop(server, lambda: pid_file.exists() and pid_file.read_text())
            assert isinstance(error, SGLangStartupError), repr(error)
            assert "was stopped before it was ready" in str(error)
    assert gone(int(pid_file.read_text()))  # the probe was killed, not left running
    assert server.pids == []


# -- watching a running server -----------------------------------------------------------------


@asyncio_only
@pytest.mark.anyio
async def test_watch_a_worker_that_dies_after_it_was_ready(tmp_path: Path, standin: str) -> None:
    crash = tmp_path / "crash"  # the worker crashes once this file exists: when the test says
    server = SGLangServer(
        "m",
        api_key=KEY,
        env=standin_env(standin, exit_file=crash),
        log_dir=tmp_path,
        startup_timeout=120,
    )
    assert server.log_tail() == []  # not started yet
    with pytest.raises(SGLangError, match="no SGLang worker is running"):
        await server.wait_exited()
    async with server:
        assert server.exited() == {}
        with anyio.move_on_after(0.1) as scope:
            await server.wait_exited()
        assert scope.cancelled_caught  # cancellable while every worker runs
        crash.touch()
        with anyio.fail_after(60):  # a hang guard only
            assert await server.wait_exited() == (0, 1)
        assert server.exited() == {0: 1}
        assert await server.wait_exited() == (0, 1)  # at once, once it has ended
        tail = server.log_tail(0)
        assert len(tail) <= 20 and "CUDA out of memory" in "\n".join(tail)
        assert server.log_tail(0, lines=2) == tail[-2:]
        everything = server.log_tail(0, lines=1000)
        assert any("api_key='***'" in line for line in everything)
        assert not any(KEY in line for line in everything)
    assert server.exited() == {}  # stop() forgets the processes
    assert "CUDA out of memory" in "\n".join(server.log_tail(0))  # the log stays


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    # The keywords are one typed dict now (llmroute/sglang/_settings.py): a misspelt one must
    # still fail as a misspelt parameter did.
    with pytest.raises(TypeError, match="unexpected keyword argument 'gpu'"):
        SGLangServer("m", gpu=[0])  # type: ignore[call-arg]


def test_the_keywords_map_onto_read_only_settings(tmp_path: Path) -> None:
    server = SGLangServer(
        "org/m", python="/x/python", grace=1.5, extra_args=["--tp", "2"], log_dir=tmp_path
    )
    assert (server.python, server.grace, server.tp, server.dp) == ("/x/python", 1.5, 2, 1)
    assert server.extra_args == ("--tp", "2") and server.log_dir == tmp_path
    with pytest.raises(AttributeError):
        server.grace = 3.0  # type: ignore[misc]


def test_detection_is_a_pure_reading_of_the_probes_results() -> None:
    from llmroute.sglang._probe import Probe, _Ran, detection

    python = f"/probe-{time.monotonic_ns()}/python"  # not in the help cache
    steps = detection(Probe(python, None, {"PYTHONPATH": "p"}, 7.0))
    run = next(steps)
    assert run.argv[:2] == [python, "-c"] and run.timeout == 7.0
    run = steps.send(_Ran(0, b"noise\n0.5.5\n", b""))
    assert run.argv[0] == python and run.argv[-2:] == ["serve", "--help"]
    with pytest.raises(StopIteration) as stop:
        steps.send(_Ran(0, help_text("--port PORT", "--algo {EAGLE,EAGLE3}").encode(), b""))
    version, flags = stop.value.value
    assert version == "0.5.5"
    assert flags is not None and {"--port", "--algo", "EAGLE3"} <= flags
    again = detection(Probe(python, None, {"PYTHONPATH": "p"}, 7.0))
    next(again)
    with pytest.raises(StopIteration) as cached:  # the help is cached: no second --help
        again.send(_Ran(0, b"0.5.5\n", b""))
    assert cached.value.value == (version, flags)
