"""Runs the docs' Python blocks for tests/docs/test_docs_snippets.py, each in a process of its own.

``python tests/snippet_runner.py MANIFEST`` reads a JSON list of ``{"name", "code", "cwd",
"timeout"}``, imports llmroute and openai once, then forks one child per block: the child runs
the block as a file would run (a block with a top-level ``await`` as ``python -m asyncio`` runs
it), with its output in ``cwd`` and sockets allowed to loopback only. Forking after the imports
keeps each block's start cheap (an import of llmroute is ~1.5 s on a loaded 2-core machine).
The result, per block, is written to ``MANIFEST.out`` as JSON: its exit status and output.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import ipaddress
import json
import os
import signal
import socket
import sys
import time
from typing import Any

import openai  # noqa: F401  (imported before the fork, for every child)

import llmroute
import llmroute.testing  # noqa: F401


def _loopback(host: object) -> bool:
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _loopback_only() -> None:
    """Any address but loopback is refused (a block must not reach the internet)."""
    getaddrinfo = socket.getaddrinfo
    connect = socket.socket.connect
    connect_ex = socket.socket.connect_ex

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _loopback(host.decode() if isinstance(host, bytes) else host):
            raise socket.gaierror(f"docs snippet test: {host!r} is not loopback")
        return getaddrinfo(host, *args, **kwargs)

    def guarded(method: Any) -> Any:
        def call(self: socket.socket, address: Any) -> Any:
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
                raise ConnectionRefusedError(f"docs snippet test: {address[0]} is not loopback")
            return method(self, address)

        return call

    socket.getaddrinfo = guarded_getaddrinfo
    socket.socket.connect = guarded(connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded(connect_ex)  # type: ignore[method-assign]


def _child(block: dict[str, Any]) -> None:
    os.chdir(block["cwd"])
    with open("output.txt", "wb", buffering=0) as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    sys.argv = [block["name"]]
    _loopback_only()
    code = compile(block["code"], block["name"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


def _run(block: dict[str, Any]) -> dict[str, Any]:
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            _child(block)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    deadline = time.monotonic() + block["timeout"]
    status: int | None = None
    while status is None:  # bounded by the block's timeout (a hang guard)
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = -9
        else:
            time.sleep(0.02)
    with open(os.path.join(block["cwd"], "output.txt"), errors="replace") as out:
        output = out.read()
    return {"status": status, "output": output, "timed_out": status == -9}


def main(manifest: str) -> int:
    with open(manifest) as file:
        blocks = json.load(file)
    results = {block["name"]: _run(block) for block in blocks}
    with open(manifest + ".out", "w") as file:
        json.dump(results, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
