"""When a started SGLang server is ready, and what it is doing until then.

A worker is ready when ``GET /health_generate`` answers 200 while its process still runs, and
``GET /get_model_info`` with its key names its model while a wrong key is refused (see
:meth:`SGLangServer.start`). Its log tells the startup phase meanwhile (:data:`STARTUP_PHASES`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import anyio
import anyio.to_thread
import httpx

from ._command import _gpu_names
from ._process import SGLangStartupError, _describe_status

__all__ = ["STARTUP_PHASES", "StartupProgress", "startup_phase", "wait_ready"]

log = logging.getLogger("llmroute.sglang")

STARTUP_PHASES: Final = (
    ("downloading the weights", re.compile(r"Fetching \d+ files|Downloading ")),
    ("loading the weights", re.compile(r"Load weight begin|Loading safetensors checkpoint")),
    ("allocating the KV cache", re.compile(r"Load weight end|KV Cache is allocated")),
    ("capturing CUDA graphs", re.compile(r"Capture cuda graph begin|Capturing batches")),
    ("warming up", re.compile(r"Capture cuda graph end|Uvicorn running on")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
)
"""What an SGLang server is doing while it starts, by the lines of its log that begin each
phase (``sglang/srt/model_executor/model_runner.py`` logs ``Load weight begin``, ``Load weight
end``, ``Capture cuda graph begin`` and ``... end``; the HTTP server logs ``Uvicorn running on``
once the model is loaded, then warms up with one request and logs ``The server is fired up and
ready to roll!``)."""
_STARTING: Final = "starting"
_PROGRESS_LOOK: Final = 0.5  # seconds between looks at the logs for progress


def startup_phase(lines: Iterable[str], since: str = _STARTING) -> str:
    """The latest startup phase the log ``lines`` show (a name of :data:`STARTUP_PHASES`), never
    earlier than ``since``; ``"starting"`` before any phase began."""
    names = [_STARTING, *(name for name, _ in STARTUP_PHASES)]
    reached = names.index(since) if since in names else 0
    for line in lines:
        for index, (_, pattern) in enumerate(STARTUP_PHASES, start=1):
            if index > reached and pattern.search(line):
                reached = index
    return names[reached]


@dataclass(frozen=True, slots=True)
class StartupProgress:
    """Where a start stands: seconds since it began and each worker's phase (see
    :func:`startup_phase`), by worker index; ``labels`` name the workers (``"worker 0 (GPU
    0)"``)."""

    elapsed: float
    phases: dict[int, str]
    labels: dict[int, str]

    def __str__(self) -> str:
        parts = [
            f"{self.labels.get(i, f'worker {i}')}: {phase}" for i, phase in self.phases.items()
        ]
        return f"{self.elapsed:4.0f} s  " + "; ".join(parts)


@dataclass
class _Worker:
    index: int
    gpus: tuple[int, ...]  # empty: whatever the environment shows
    port: int
    auto_port: bool  # chosen by the launcher: another free one may replace it
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    pgid: int | None = None
    container: str | None = None
    ready: bool = False
    phase: str = _STARTING

    def describe(self) -> str:
        gpu = f", {_gpu_names(self.gpus)}" if self.gpus else ""
        return f"worker {self.index}{gpu}, port {self.port}"

    def label(self) -> str:
        return f"worker {self.index}" + (f" ({_gpu_names(self.gpus)})" if self.gpus else "")


class Starting(Protocol):
    """What the readiness waits read of the server they watch (an
    :class:`~llmroute.sglang.SGLangServer`; a protocol, so this module needs nothing above it)."""

    _workers: list[_Worker]

    @property
    def startup_timeout(self) -> float: ...
    @property
    def urls(self) -> list[str]: ...
    @property
    def api_key(self) -> str: ...
    @property
    def model_path(self) -> str: ...
    def log_tail(self, worker: int = 0, lines: int = ...) -> list[str]: ...
    def phases(self) -> dict[int, str]: ...
    def worker_env(self, worker: int = 0) -> dict[str, str]: ...


def startup_error(
    server: Starting, w: _Worker, what: str, returncode: int | None
) -> SGLangStartupError:
    quoted = "\n".join("  | " + line for line in server.log_tail(w.index))
    message = (
        f"SGLang server ({w.describe()}) {what}; "
        f"last lines of {w.log_path}:\n{quoted or '  (the log is empty)'}"
    )
    return SGLangStartupError(message, worker=w.index, returncode=returncode)


async def _report_progress(
    server: Starting, progress: Callable[[StartupProgress], object], every: float
) -> None:
    began = last_report = anyio.current_time()
    labels = {w.index: w.label() for w in server._workers}
    reported: dict[int, str] = {}
    while True:
        phases = await anyio.to_thread.run_sync(server.phases)
        now = anyio.current_time()
        if phases != reported or now - last_report >= every:
            progress(StartupProgress(now - began, phases, labels))
            reported, last_report = phases, now
        await anyio.sleep(_PROGRESS_LOOK)


async def wait_ready(
    server: Starting,
    progress: Callable[[StartupProgress], object] | None = None,
    every: float = 10.0,
) -> None:
    """Wait until every worker is ready (reporting ``progress``); raise the first failure."""
    failures: list[SGLangStartupError] = []
    with anyio.move_on_after(server.startup_timeout) as deadline:
        async with (
            httpx.AsyncClient(trust_env=False) as http,
            anyio.create_task_group() as group,
        ):
            if progress is not None:
                group.start_soon(_report_progress, server, progress, every)

            async def wait(w: _Worker) -> None:
                try:
                    await _wait_worker(server, w, http)
                except SGLangStartupError as exc:
                    failures.append(exc)
                    group.cancel_scope.cancel()

            async with anyio.create_task_group() as waits:
                for w in server._workers:
                    waits.start_soon(wait, w)
            group.cancel_scope.cancel()  # every worker is ready: the reports end
    if failures:
        raise failures[0]
    if deadline.cancelled_caught:
        slow = next(w for w in server._workers if not w.ready)
        raise startup_error(
            server, slow, f"was not ready within {server.startup_timeout:g} s (stopped)", None
        )


async def _wait_worker(server: Starting, w: _Worker, http: httpx.AsyncClient) -> None:
    process = w.process  # stop() clears w.process: this wait keeps its own
    assert process is not None
    root = server.urls[w.index].removesuffix("/v1")
    headers = {"Authorization": f"Bearer {server.api_key}"}
    interval = 0.2
    while True:
        _check_running(server, w, process)
        try:
            response = await http.get(root + "/health_generate", headers=headers, timeout=10.0)
            healthy = response.status_code == 200
        except httpx.HTTPError:
            healthy = False
        if healthy:
            # A 200 is ours only if our process still runs and the server knows our key
            # and model: another server that had the port first answers too.
            _check_running(server, w, process)
            if await _confirm_identity(server, w, process, http, root, headers):
                _check_running(server, w, process)
                w.ready = True
                log.info("SGLang worker %d is ready at %s", w.index, server.urls[w.index])
                return
        await anyio.sleep(interval)
        interval = min(interval * 1.5, 1.0)


def _check_running(server: Starting, w: _Worker, process: subprocess.Popen[bytes]) -> None:
    returncode = process.poll()
    if returncode is not None:
        raise startup_error(
            server, w, f"exited with {_describe_status(returncode)} before it was ready", returncode
        )


async def _confirm_identity(
    server: Starting,
    w: _Worker,
    process: subprocess.Popen[bytes],
    http: httpx.AsyncClient,
    root: str,
    headers: Mapping[str, str],
) -> bool:
    """Whether the server on ``w``'s port is ``w``: True when ``/get_model_info`` answers 200
    with this server's model to this server's key and refuses a wrong key (401 or 403), False
    when it cannot tell yet (no answer, 5xx). Raises when it is another server: it refuses the
    key, lacks the endpoint, serves another model, or takes any key (a server started without
    ``--api-key`` that happens to serve the same model)."""
    try:
        response = await http.get(root + "/get_model_info", headers=headers, timeout=10.0)
    except httpx.HTTPError:
        return False
    status = response.status_code
    if status >= 500:
        return False
    if status == 200:
        served = _served_model(response)
        if isinstance(served, str) and _same_model(server, w, served):
            verdict = await _refuses_a_wrong_key(http, root)
            if not isinstance(verdict, str):
                return verdict is True
            why = verdict
        else:
            why = f"it serves model_path {served!r}, not {server.model_path!r}"
    elif status in (401, 403):
        why = f"it refused this server's API key (GET /get_model_info: {status})"
    else:
        why = f"GET /get_model_info answered {status}"
    _check_running(server, w, process)
    raise startup_error(
        server, w, f"is not ready: another server answers on port {w.port} ({why}) (stopped)", None
    )


def _served_model(response: httpx.Response) -> object:
    try:
        info: Any = response.json()
    except ValueError:
        info = None
    return info.get("model_path") if isinstance(info, dict) else None


async def _refuses_a_wrong_key(http: httpx.AsyncClient, root: str) -> Literal[True] | str | None:
    """True when the server refuses a wrong key, ``None`` when it cannot tell yet, else why it
    is another server."""
    wrong = {"Authorization": f"Bearer wrong-{secrets.token_urlsafe(16)}"}
    try:
        refused = await http.get(root + "/get_model_info", headers=wrong, timeout=10.0)
    except httpx.HTTPError:
        return None
    if refused.status_code in (401, 403):
        return True
    if refused.status_code >= 500:
        return None
    return (
        f"it answered a wrong API key with {refused.status_code}: a server without "
        "this server's key, though it serves the same model"
    )


def _same_model(server: Starting, w: _Worker, served: str) -> bool:
    if served.rstrip("/") == server.model_path.rstrip("/"):
        return True
    with contextlib.suppress(OSError):
        if os.path.exists(served) and os.path.samefile(served, server.model_path):
            return True
    # SGLANG_USE_MODELSCOPE downloads the model and reports the download's directory.
    flag = server.worker_env(w.index).get("SGLANG_USE_MODELSCOPE", "")
    return flag.lower() in ("1", "true", "yes", "on")
