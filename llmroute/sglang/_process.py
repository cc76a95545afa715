"""Processes, ports and logs of the servers the launchers start (SGLang's workers and its
model gateway): what both launchers share, so neither imports the other."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

__all__ = ["KILL_TIMEOUT", "SGLangError", "SGLangStartupError"]

KILL_TIMEOUT: Final = 10.0
"""Seconds to wait for a process group to vanish after SIGKILL."""
_LOG_TAIL_LINES: Final = 20
_REDACTED: Final = "***"


class SGLangError(Exception):
    """Raised when an SGLang server cannot be set up, started or run."""


class SGLangStartupError(SGLangError):
    """Raised when a server cannot become ready: it exited first, did not get ready in time, its
    port is taken (by a server already listening, or one that answers for it: see
    :meth:`SGLangServer.start`), or :meth:`SGLangServer.stop` was called while it started."""

    def __init__(self, message: str, *, worker: int, returncode: int | None = None) -> None:
        super().__init__(message)
        self.worker = worker
        self.returncode = returncode
        """The exit status, ``None`` when the launcher stopped it (a startup timeout, a taken
        port, a stop) or never started it."""


def _redact(argv: Sequence[str], secret: str) -> list[str]:
    shown: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            shown.append(_REDACTED)
            hide_next = False
        elif token == "--api-key":
            shown.append(token)
            hide_next = True
        elif token.startswith("--api-key="):
            shown.append("--api-key=" + _REDACTED)
        else:
            shown.append(token.replace(secret, _REDACTED) if secret else token)
    return shown


def _scrub(text: str, secret: str) -> str:
    return text.replace(secret, _REDACTED) if secret else text


def _free_ports(host: str, count: int) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_in_use(host: str, port: int) -> bool:
    """Whether a socket already listens on ``host:port``: a bind test with ``SO_REUSEADDR``, as
    servers set it, so connections of a closed server lingering in TIME_WAIT do not count. Other
    bind errors (an address the host does not have, a privileged port) are the server's to
    report: they read as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a live member (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


async def _group_alive_async(pgid: int) -> bool:
    """:func:`_group_alive` without blocking the event loop: the ``/proc`` scan runs in a worker
    thread, and only while ``killpg(pgid, 0)`` finds the group (the common end is cheap)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return await anyio.to_thread.run_sync(_group_alive, pgid)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-returncode).name}"
    return f"status {returncode}"


def _tail(path: Path | None, lines: int = _LOG_TAIL_LINES) -> list[str]:
    if path is None or lines <= 0:
        return []
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - 64 * 1024))
            data = file.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]


async def _wait_gone(process: subprocess.Popen[bytes], pgid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the group to vanish, reaping its leader. The ``/proc``
    scan of :func:`_group_alive` runs in a worker thread, never on the event loop."""
    deadline = time.monotonic() + timeout
    interval = 0.02
    while True:
        process.poll()  # reap the leader, so it does not linger as a zombie
        if not await _group_alive_async(pgid):
            if process.poll() is None:  # dead (the group is gone) but not reaped yet
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await anyio.to_thread.run_sync(process.wait, 1.0)
            return True
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(interval * 2, 0.2)
