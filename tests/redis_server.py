"""A real redis-server on a loopback port for the tests that need one.

``.ci/run`` installs redis-server and starts one, naming it in ``LLMROUTE_TEST_REDIS_URL``;
elsewhere a private server is started from ``redis-server`` on the PATH. Without either, the
Redis tests skip with a message, except under CI (``CI`` set), where they must run, so fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV_URL = "LLMROUTE_TEST_REDIS_URL"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(port: int, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"redis-server did not answer on 127.0.0.1:{port} within 10 s")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a running redis-server on 127.0.0.1 (database 0, flushed before use)."""
    url = os.environ.get(ENV_URL)
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        message = (
            "redis-server is not installed (apt-get install redis-server), and "
            f"{ENV_URL} is not set: the Redis tests are skipped"
        )
        if os.environ.get("CI"):
            pytest.fail(message + " -- but under CI they must run")
        pytest.skip(message)
    port = _free_port()
    workdir: Path = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port, proc, time.monotonic() + 10)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
