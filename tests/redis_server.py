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


def _wait_ready(port: int, proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether ``proc`` answers on ``port``; False when it exited (the port was taken between
    :func:`_free_port` and its bind: other test runs share the machine). The answer must name
    ``proc``'s own pid, so another process's redis-server on that port is never taken for it."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"INFO server\r\n")
                if f"process_id:{proc.pid}\r\n".encode() in _read_reply(sock):
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"redis-server did not answer on 127.0.0.1:{port} within 60 s")


def _read_reply(sock: socket.socket) -> bytes:
    """A bulk reply (``$<length>\\r\\n<data>\\r\\n``) read whole, or what came before EOF."""
    reply = b""
    while b"\r\n" not in reply or len(reply) < _bulk_size(reply):
        part = sock.recv(4096)
        if not part:
            break
        reply += part
    return reply


def _bulk_size(reply: bytes) -> int:
    head, _, _ = reply.partition(b"\r\n")
    if not head.startswith(b"$") or not head[1:].isdigit():
        return len(reply)  # an error or another reply: nothing more to wait for
    return len(head) + 2 + int(head[1:]) + 2


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
    workdir: Path = tmp_path_factory.mktemp("redis")
    for _ in range(5):  # a port taken by another process before redis-server bound it: again
        port = _free_port()
        proc = _start(binary, port, workdir)
        try:
            if _wait_ready(port, proc, time.monotonic() + 60):
                break
        except BaseException:
            _stop(proc)
            raise
        _stop(proc)
    else:
        raise RuntimeError("redis-server could not bind a free loopback port in 5 tries")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


def _start(binary: str, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
