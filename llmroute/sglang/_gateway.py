"""SGLang's model gateway (``smg``, formerly ``sglang-router``) in front of launched workers.

:class:`SGLangGateway` runs ``smg launch --worker-urls ... --policy cache_aware`` as a child in a
process group of its own, with its output in a log file. The gateway keeps one radix tree per
worker of what it sent there, shared by every client that goes through it, so a fleet served by
many clients (or many llmroute gateways) routes prefixes with one picture instead of one per
client. It is ready when ``GET /readiness`` answers 200 with every worker healthy; it is ours
when ``GET /workers`` with our key lists our workers and a wrong key is refused (401). The
gateway's Prometheus listener gets a free port of its own (smg's default, 29000 on every
interface, would collide between gateways and open a port to other machines).

``smg`` 1.13 installs from PyPI without a GPU (``pip install 'llmroute[gateway]'``); the
launcher finds it beside this interpreter, then on ``PATH``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import httpx

from ._process import (
    KILL_TIMEOUT,
    SGLangError,
    SGLangStartupError,
    _describe_status,
    _free_ports,
    _port_in_use,
    _redact,
    _scrub,
    _signal_group,
    _tail,
    _url_host,
    _wait_gone,
)

__all__ = ["GATEWAY_POLICIES", "SGLangGateway", "SGLangGatewayNotInstalled", "find_smg"]

log = logging.getLogger("llmroute.sglang")

GATEWAY_POLICIES: Final = ("cache_aware", "round_robin", "random", "power_of_two", "least_load")
"""The gateway's routing policies llmroute offers (smg's ``--policy``); ``cache_aware``, the
default, keeps a radix tree per worker and sends a prompt to the worker holding its longest
prefix unless the load is out of balance."""

_INSTALL: Final = (
    "SGLang's model gateway (smg) is not installed: pip install 'llmroute[gateway]' (or pip "
    "install smg) in this environment, or give its command (gateway_command=)"
)


class SGLangGatewayNotInstalled(SGLangError):
    """Raised when the ``smg`` command cannot be found."""


def find_smg() -> list[str] | None:
    """The ``smg`` command: the script beside this interpreter (a venv's ``bin``), else the one
    on ``PATH``; ``None`` when neither exists."""
    beside = Path(sys.executable).parent / "smg"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("smg")
    return [found] if found else None


class SGLangGateway:
    """``smg launch`` in front of ``worker_urls`` (server roots), on ``host:port`` (a free port
    when ``None``), requiring ``api_key`` from clients and passing it to the workers.

    ``policy`` is smg's ``--policy``; ``extra_args`` go to ``smg launch`` as given, after
    llmroute's. Logs go to ``log_path``. :meth:`start` waits at most ``startup_timeout``
    seconds; :meth:`stop` sends SIGTERM to the process group, then SIGKILL after ``grace``.
    """

    def __init__(
        self,
        worker_urls: Sequence[str],
        *,
        api_key: str,
        log_path: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        policy: str = "cache_aware",
        extra_args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        startup_timeout: float = 120.0,
        grace: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        if policy not in GATEWAY_POLICIES:
            raise ValueError(f"gateway policy must be one of {', '.join(GATEWAY_POLICIES)}")
        self.worker_urls = [url.rstrip("/").removesuffix("/v1") for url in worker_urls]
        self.host = host
        bind = "0.0.0.0" if host in ("0.0.0.0", "::", "") else host
        ports = _free_ports(bind, 2)
        self.port = port if port is not None else ports[0]
        self._metrics_port = ports[1]
        self._api_key = api_key
        self.log_path = log_path
        self.policy = policy
        self.extra_args = tuple(extra_args)
        self.command = list(command) if command is not None else None
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.env = dict(env or {})
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The gateway's OpenAI base URL, ``http://host:port/v1``."""
        return f"http://{_url_host(self.host)}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def argv(self, *, reveal_key: bool = False) -> list[str]:
        """The command that starts the gateway (the key shown as ``***`` unless revealed)."""
        command = self.command or find_smg() or ["smg"]
        listen = "0.0.0.0" if self.host in ("0.0.0.0", "") else self.host
        argv = [
            *command,
            "launch",
            "--worker-urls",
            *self.worker_urls,
            "--policy",
            self.policy,
            "--host",
            listen,
            "--port",
            str(self.port),
            "--api-key",
            self._api_key,
            "--prometheus-host",
            listen,
            "--prometheus-port",
            str(self._metrics_port),
            *self.extra_args,
        ]
        return argv if reveal_key else _redact(argv, self._api_key)

    def log_tail(self, lines: int = 20) -> list[str]:
        return [_scrub(line, self._api_key) for line in _tail(self.log_path, lines)]

    async def start(self) -> None:
        """Start the gateway and wait until it is ready and ours; on any error it is stopped
        before this raises (:class:`SGLangGatewayNotInstalled`, :class:`SGLangStartupError`)."""
        if self.command is None and find_smg() is None:
            raise SGLangGatewayNotInstalled(_INSTALL)
        bind = "0.0.0.0" if self.host in ("0.0.0.0", "::", "") else self.host
        for port in (self.port, self._metrics_port):
            if _port_in_use(bind, port):
                raise self._error(f"cannot start: port {port} on {bind} is already in use")
        self._spawn()
        try:
            with anyio.fail_after(self.startup_timeout):
                await self._wait_ready()
        except TimeoutError:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise self._error(
                f"was not ready within {self.startup_timeout:g} s (stopped)"
            ) from None
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise

    def _spawn(self) -> None:
        argv = self.argv(reveal_key=True)
        shown = shlex.join(self.argv())
        log.info("starting SGLang's gateway: %s (log: %s)", shown, self.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as log_file:
            log_file.write(f"# llmroute: {shown}\n".encode())
            log_file.flush()
            try:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env, "NO_COLOR": "1"},
                    start_new_session=True,
                )
            except OSError as exc:
                raise SGLangGatewayNotInstalled(
                    f"could not start {argv[0]!r}: {exc}; {_INSTALL}"
                ) from exc

    def _error(self, what: str) -> SGLangStartupError:
        quoted = "\n".join("  | " + line for line in self.log_tail())
        where = f"; last lines of {self.log_path}:\n{quoted}" if quoted else ""
        returncode = self._process.poll() if self._process is not None else None
        return SGLangStartupError(
            f"SGLang's gateway (port {self.port}) {what}{where}", worker=-1, returncode=returncode
        )

    async def _wait_ready(self) -> None:
        root = self.url.removesuffix("/v1")
        ours = {"Authorization": f"Bearer {self._api_key}"}
        wrong = {"Authorization": f"Bearer wrong-{secrets.token_urlsafe(16)}"}
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as http:
            while True:
                process = self._process
                assert process is not None
                if (code := process.poll()) is not None:
                    raise self._error(f"exited with {_describe_status(code)} before it was ready")
                try:
                    ready = await http.get(root + "/readiness")
                    body: Any = ready.json() if ready.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    body = None
                healthy = body.get("healthy_workers") if isinstance(body, dict) else None
                if healthy == len(self.worker_urls) and await self._ours(http, root, ours, wrong):
                    log.info("SGLang's gateway is ready at %s", self.url)
                    return
                await anyio.sleep(0.2)

    async def _ours(
        self, http: httpx.AsyncClient, root: str, ours: dict[str, str], wrong: dict[str, str]
    ) -> bool:
        try:
            listed = await http.get(root + "/workers", headers=ours)
            refused = await http.get(root + "/workers", headers=wrong)
        except httpx.HTTPError:
            return False
        if listed.status_code >= 500 or refused.status_code >= 500:
            return False
        urls: set[str] = set()
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            urls = {str(w.get("url", "")).rstrip("/") for w in listed.json().get("workers", [])}
        if listed.status_code == 200 and refused.status_code in (401, 403):
            if set(self.worker_urls) <= urls:
                return True
        raise self._error(
            f"is not ready: another server answers on port {self.port} (GET /workers: "
            f"{listed.status_code} with our key, {refused.status_code} with a wrong one) (stopped)"
        )

    async def stop(self) -> None:
        """SIGTERM to the gateway's process group, SIGKILL after ``grace`` (idempotent)."""
        process = self._process
        if process is None:
            return
        pgid = process.pid
        _signal_group(pgid, signal.SIGTERM)
        if not await _wait_gone(process, pgid, self.grace):
            _signal_group(pgid, signal.SIGKILL)
            if not await _wait_gone(process, pgid, KILL_TIMEOUT):
                log.warning("SGLang's gateway: process group %d outlived SIGKILL", pgid)
        self._process = None

    def kill(self) -> None:
        """SIGKILL the gateway's process group now (blocking; for exit paths)."""
        process = self._process
        if process is not None:
            _signal_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1.0)
        self._process = None
