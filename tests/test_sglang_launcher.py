"""The SGLang launcher: commands by version (with fake interpreters), then real processes
against the SGLang stand-in, through the same code path as a real server."""

from __future__ import annotations

import logging
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

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


def test_container_command(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "0.5.5", help_text(*ALL_FLAGS))
    server = SGLangServer(
        "Qwen/Qwen2.5-7B-Instruct",
        image="lmsysorg/sglang:v0.5.5",
        python=str(python),
        gpus=[1, 3],
        api_key=KEY,
        env={"HF_TOKEN": "hf-SECRET"},
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
    assert argv[10:14] == [
        "HF_TOKEN",
        "-v",
        "/data/hf:/root/.cache/huggingface",
        "lmsysorg/sglang:v0.5.5",
    ]
    assert argv[14:17] == ["python3", "-m", "sglang.launch_server"]
    assert value_of(argv, "--host") == "0.0.0.0"  # inside the container; published on 127.0.0.1
    assert value_of(argv, "--api-key") == "***"
    assert "hf-SECRET" not in " ".join(server.command(1, reveal_key=True))
    assert server.version is None
    assert calls(python) == []  # the image is not probed
    # --gpus device=N shows the container that GPU alone: no CUDA_VISIBLE_DEVICES is added.
    assert server.worker_env(1).get("CUDA_VISIBLE_DEVICES") == os.environ.get(
        "CUDA_VISIBLE_DEVICES"
    )


# -- a missing sglang --------------------------------------------------------------------------


def test_missing_sglang_is_a_clear_error(tmp_path: Path) -> None:
    python = fake_python(tmp_path, None)
    server = SGLangServer("m", python=str(python))
    with pytest.raises(SGLangNotInstalled) as info:
        server.command()
    message = str(info.value)
    assert str(python) in message
    assert "pip install 'sglang[all]'" in message and "docs/sglang.md" in message
    assert isinstance(info.value, SGLangError)


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


needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
# Process lifecycle does not depend on the event loop beyond sleeping: one backend is enough
# where a test is slow; readiness, errors and cancellation run on both.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


async def get(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(trust_env=False) as http:
        try:
            return (await http.get(url, headers=headers, timeout=2.0)).status_code
        except httpx.HTTPError:
            return 0


@pytest.mark.anyio
async def test_ready_only_after_warmup_then_serves_chat(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "org/Qwen-standin",
        api_key=KEY,
        env=standin_env(standin, warmup=1.0),
        log_dir=tmp_path,
        startup_timeout=20,
    )
    root = server.base_url.removesuffix("/v1")
    models_ok_at: list[float] = []

    async def watch_models() -> None:
        while not models_ok_at:
            if await get(root + "/v1/models", KEY) == 200:
                models_ok_at.append(time.monotonic())
            await anyio.sleep(0.05)

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        group.start_soon(watch_models)
        await server.start()
        ready_at = time.monotonic()
        group.cancel_scope.cancel()
    try:
        assert ready_at - started >= 1.0
        # /v1/models answered while the server was still warming up: it is no readiness signal.
        assert models_ok_at and models_ok_at[0] < ready_at - 0.3
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
        env=standin_env(standin, warmup=30, exit_after=0.3),
        log_dir=tmp_path,
        startup_timeout=20,
    )
    started = time.monotonic()
    with pytest.raises(SGLangStartupError) as info:
        async with server:
            pytest.fail("the server cannot be ready")
    assert time.monotonic() - started < 10
    error = info.value
    assert error.returncode == 1 and error.worker == 0
    message = str(error)
    assert "exited with status 1 before it was ready" in message
    assert str(server.log_paths[0]) in message
    assert "error" in message.lower().split("last lines of", 1)[1]
    assert KEY not in message
    assert server.pids == []
    assert stat.S_IMODE(server.log_paths[0].stat().st_mode) == 0o600


@asyncio_only
@pytest.mark.anyio
async def test_startup_timeout_stops_the_server(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m", env=standin_env(standin, warmup=60), log_dir=tmp_path, startup_timeout=1.0
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
    assert seen and group_gone(seen[0])


@needs_proc
@asyncio_only
@pytest.mark.anyio
async def test_stop_leaves_no_process_of_the_group(tmp_path: Path, standin: str) -> None:
    server = SGLangServer(
        "m", env=standin_env(standin, children=2), log_dir=tmp_path, startup_timeout=20
    )
    await server.start()
    (pid,) = server.pids
    assert len(group_members(pid)) >= 3  # the server and its two children
    stopping = time.monotonic()
    await server.stop()
    assert time.monotonic() - stopping < 5
    assert group_members(pid) == set()
    assert group_gone(pid)


@needs_proc
@asyncio_only
@pytest.mark.anyio
async def test_sigterm_ignored_means_sigkill_after_the_grace(
    tmp_path: Path, standin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.sglang")
    server = SGLangServer(
        "m",
        env=standin_env(standin, ignore_sigterm=1, children=1),
        log_dir=tmp_path,
        grace=0.5,
        startup_timeout=20,
    )
    await server.start()
    (pid,) = server.pids
    stopping = time.monotonic()
    await server.stop()
    took = time.monotonic() - stopping
    assert 0.5 <= took < 5
    assert "SIGKILL" in caplog.text
    assert group_gone(pid)


@asyncio_only
@pytest.mark.anyio
async def test_drain_within_the_grace_needs_no_sigkill(
    tmp_path: Path, standin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.sglang")
    server = SGLangServer(
        "m", env=standin_env(standin, drain=0.4), log_dir=tmp_path, grace=5, startup_timeout=20
    )
    await server.start()
    (pid,) = server.pids
    stopping = time.monotonic()
    await server.stop()
    assert 0.3 <= time.monotonic() - stopping < 4
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
            "m", env=standin_env(standin), log_dir=tmp_path, startup_timeout=20
        ) as server:
            pids = server.pids
            scope.cancel()
            await anyio.sleep(30)
    assert pids and all(group_gone(pid) for pid in pids)


@pytest.mark.anyio
async def test_cancelled_while_starting_leaves_nothing(tmp_path: Path, standin: str) -> None:
    server = SGLangServer("m", env=standin_env(standin, warmup=30), log_dir=tmp_path)
    seen: list[int] = []
    async with anyio.create_task_group() as group:
        group.start_soon(server.start)
        while not seen:
            seen.extend(server.pids)
            await anyio.sleep(0.01)
        await anyio.sleep(0.2)
        group.cancel_scope.cancel()
    assert server.pids == []
    assert group_gone(seen[0])


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
        "m", env=standin_env(standin, ignore_sigterm=1), log_dir=tmp_path, startup_timeout=20
    )
    await server.start()
    (pid,) = server.pids
    server.kill()  # what runs at interpreter exit for servers still running
    assert server.pids == []
    assert group_gone(pid)
    await server.stop()  # nothing left to stop
