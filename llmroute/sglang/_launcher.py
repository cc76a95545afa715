"""Start local SGLang servers tuned for time to first token, know when they are ready, stop them.

:class:`SGLangServer` runs one SGLang server per GPU (or one on whatever GPUs the environment
shows) as a child process in a process group of its own, from a chosen Python interpreter or a
container image, with its output in a log file. It is ready when ``GET /health_generate``
answers 200: that endpoint runs a one-token generation, so it fails until the model is loaded and
warmed up, whereas ``/v1/models`` answers as soon as the HTTP server is up. A 200 counts only
while the worker's process still runs, once ``GET /get_model_info`` with the worker's API key
names the launched model and the same request with a wrong key is refused (401): another server
already on the port answers ``/health_generate`` too, and one started without a key may serve
the same model (each port is also checked free just before its worker starts). Stopping sends
SIGTERM to the whole group, waits for the drain, then SIGKILLs what is left. After
:meth:`SGLangServer.start`, :meth:`SGLangServer.exited` and :meth:`SGLangServer.wait_exited` tell
when a worker dies, and :meth:`SGLangServer.log_tail` what it said last.

The command follows the installed SGLang. From :data:`SGLANG_SERVE_SINCE` on it is the
``sglang serve`` console command, run as ``python -c "from sglang.cli.main import main; ..."
serve ...`` (``python -m sglang.cli.main`` does not work: that module has no ``__main__`` guard
and exits 0 without doing anything); older versions get ``python -m sglang.launch_server``.
Default flags the version's ``--help`` does not list are left out.

Its parts live beside it: ``_settings`` (the keyword arguments, resolved into frozen settings
by concern), ``_command`` (the argv), ``_probe`` (the installed SGLang's version and flags),
``_readiness`` (when a worker is ready, its startup phases), ``_routes`` (workers as routing
targets).

Errors::

    SGLangError
     +-- SGLangNotInstalled     the interpreter cannot import sglang
     +-- SGLangConfigError      a preset the version lacks, a GPU the host lacks (before spawning)
     +-- SGLangStartupError     the server exited, timed out, found its port taken, or was
                                stopped (by stop()) before it was ready
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import secrets
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self, Unpack

import anyio

from ._command import _SERVE_CODE as _SERVE_CODE  # tests pin the serve command
from ._command import (
    DEFAULT_FLAGS,
    SGLANG_SERVE_SINCE,
    _tokens,
    default_pairs,
    entry_point,
    hf_cache_dir,
    in_container,
    parse_release,
    server_args,
)
from ._probe import (
    HELP_TIMEOUT,
    Probe,
    SGLangConfigError,
    SGLangNotInstalled,
    accept,
    check_gpus,
    detect,
    detect_async,
    install_commands,
    install_hint,
)
from ._process import (
    _LOG_TAIL_LINES,
    _REDACTED,
    KILL_TIMEOUT,
    SGLangError,
    SGLangStartupError,
    _free_ports,
    _port_in_use,
    _redact,
    _scrub,
    _signal_group,
    _tail,
    _url_host,
    _wait_gone,
)
from ._readiness import (
    STARTUP_PHASES,
    StartupProgress,
    _Worker,
    startup_phase,
    wait_ready,
)
from ._routes import RouteRegistry as RouteRegistry
from ._routes import WorkerRoutes
from ._settings import SettingsView, SGLangOptions, resolve

if TYPE_CHECKING:
    from ._gateway import SGLangGateway


__all__ = [
    "DEFAULT_FLAGS",
    "HELP_TIMEOUT",
    "KILL_TIMEOUT",
    "SGLANG_SERVE_SINCE",
    "STARTUP_PHASES",
    "VERSION_TIMEOUT",
    "SGLangConfigError",
    "SGLangError",
    "SGLangNotInstalled",
    "SGLangServer",
    "SGLangStartupError",
    "StartupProgress",
    "install_commands",
    "install_hint",
    "parse_release",
    "startup_phase",
]

log = logging.getLogger("llmroute.sglang")

VERSION_TIMEOUT: Final = 60.0
"""Seconds allowed for ``import sglang`` in the chosen interpreter (a cold import is slow)."""

_WATCH_INTERVAL: Final = 0.1  # seconds between wait_exited()'s looks at the workers


# Servers started and not yet stopped (held strongly: dropping a running server's object must not
# lose track of it). Those still running at interpreter exit are killed, so none outlives us.
_live: set[SGLangServer] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_live):
        server.kill()


def check_installed(gateway: SGLangGateway | None) -> None:
    """Raise when the gateway asked for needs ``smg`` and it is not installed."""
    if gateway is not None and gateway.command is None:
        from ._gateway import _INSTALL, SGLangGatewayNotInstalled, find_smg

        if find_smg() is None:
            raise SGLangGatewayNotInstalled(_INSTALL)


class SGLangServer(SettingsView, WorkerRoutes):
    """SGLang servers, one per GPU or per set of ``tp`` x ``dp`` GPUs (or a single one on
    whatever GPUs the environment shows), started for low time to first token.

    ::

        async with SGLangServer("Qwen/Qwen2.5-7B-Instruct", gpus=[0, 1]) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)

    ``python`` is the interpreter that has sglang installed (default: this one); with ``image``
    the server runs in that container image instead (``docker run --gpus device=N ...``, with
    ``python3`` inside it). Either way the SGLang version is read first (in a throwaway
    container of the image) and the command and flags follow it. In a container the host's
    Hugging Face cache is mounted (``hf_cache``: a directory, default ``$HF_HOME`` or
    ``~/.cache/huggingface``; ``False``: none), and ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN``
    are passed by name when set. ``gpus`` starts one server per ``tp`` x ``dp`` GPUs, in
    order: with ``gpus=[0, 1, 2, 3]`` and ``tp=2``, two servers of tensor parallel 2 on GPUs
    {0, 1} and {2, 3}, each with ``CUDA_VISIBLE_DEVICES`` set to its GPUs (``--gpus
    '"device=0,1"'`` in a container) and a port of its own: ``port``, ``port + 1``, ... or free
    ports when ``port`` is ``None``. ``tp`` is passed as ``--tp-size``; it may also come from
    ``extra_args`` (``--tp-size``, ``--tensor-parallel-size`` or ``--tp``), as the data-parallel
    size does (``--dp-size``, ``--dp``). A GPU count that is not a multiple of ``tp`` x ``dp`` is
    a ``ValueError``. ``extra_args`` are passed to every server as given and win
    over the defaults (see :meth:`default_args`). ``env`` is added to this process's environment.
    ``api_key`` defaults to a random key; it is never logged, and ``repr`` and the command shown
    in logs and errors hide it (SGLang itself prints its arguments, key included, into its log:
    log files are created readable by their owner only). Each server writes stdout and stderr to
    ``log_dir`` (default: a new temporary directory). ``startup_timeout`` bounds the wait for
    readiness, ``grace`` the drain after SIGTERM before SIGKILL. ``container_args`` go to
    ``docker run`` before the image (e.g. ``-v`` for the Hugging Face cache).
    """

    def __init__(self, model_path: str, **options: Unpack[SGLangOptions]) -> None:
        settings = resolve(model_path, options)
        self._server_flags, self._process = settings.flags, settings.process
        self._log_dir = settings.process.log_dir
        placement = settings.placement
        port = placement.port
        ports = (
            [port + i for i in range(len(placement.gpu_sets))]
            if port is not None
            else _free_ports(self._bind_host(), len(placement.gpu_sets))
        )
        self._version: str | None = None
        self._flags: frozenset[str] | None = None
        self._detected = False
        self._workers = [
            _Worker(index=i, gpus=gpu_set, port=ports[i], auto_port=port is None)
            for i, gpu_set in enumerate(placement.gpu_sets)
        ]
        self._gateway: SGLangGateway | None = None
        if settings.gateway.enabled:
            from ._gateway import SGLangGateway

            self._gateway = SGLangGateway(
                self.urls,
                api_key=self.api_key,
                log_path=self.log_dir / "smg-gateway.log",
                host=self.host,
                port=settings.gateway.port,
                policy=settings.gateway.policy,
                extra_args=settings.gateway.args,
                command=settings.gateway.command,
                startup_timeout=self.startup_timeout,
                grace=self.grace,
                env=self.env,
            )
        self._start_scope: anyio.CancelScope | None = None  # set while start() runs
        self._stop_requested = False  # stop() was called while start() ran
        self._stopping: anyio.Event | None = None  # set while stop() runs

    def __repr__(self) -> str:
        state = "running" if self.pids else "stopped"
        return (
            f"SGLangServer(model_path={self.model_path!r}, "
            f"served_model_name={self.served_model_name!r}, urls={self.urls!r}, "
            f"api_key={_REDACTED!r}, {state})"
        )

    # -- what it is ----------------------------------------------------------------------------

    @property
    def api_key(self) -> str:
        """The key every worker requires (``Authorization: Bearer <key>``)."""
        return self._server_flags.api_key

    @property
    def urls(self) -> list[str]:
        """Each worker's OpenAI base URL, ``http://host:port/v1``."""
        return [f"http://{_url_host(self.host)}:{w.port}/v1" for w in self._workers]

    @property
    def base_url(self) -> str:
        """The first worker's OpenAI base URL."""
        return self.urls[0]

    @property
    def ports(self) -> list[int]:
        return [w.port for w in self._workers]

    @property
    def pids(self) -> list[int]:
        """The process ids of the running workers (each leads its own process group)."""
        return [w.process.pid for w in self._workers if w.process is not None]

    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="llmroute-sglang-"))
        return self._log_dir

    @property
    def log_paths(self) -> list[Path]:
        """Each worker's log file (stdout and stderr)."""
        safe = re.sub(r"[^\w.-]+", "_", self.served_model_name) or "model"
        return [self.log_dir / f"sglang-{safe}-{w.port}.log" for w in self._workers]

    @property
    def version(self) -> str | None:
        """The SGLang version of ``python``, once probed (``None`` in a container image)."""
        return self._version

    def __len__(self) -> int:
        return len(self._workers)

    def _bind_host(self) -> str:
        """The host address the workers' ports are taken on (in a container: where docker
        publishes them)."""
        if self.image is not None:
            return _url_host(self.host).strip("[]")
        return "0.0.0.0" if self.host in ("0.0.0.0", "::", "") else self.host

    # -- the command ---------------------------------------------------------------------------

    def _probe_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def _probe(self) -> Probe:
        # A container's first run may pull the image first.
        timeout = (
            VERSION_TIMEOUT if self.image is None else max(VERSION_TIMEOUT, self.startup_timeout)
        )
        return Probe(self.python, self.image, self._probe_env(), timeout)

    def _detected_as(self, probe: Probe, version: str, flags: frozenset[str] | None) -> None:
        self._version = version
        accept(flags, version, self.presets, probe.where())
        self._flags = flags
        self._detected = True

    def _detect(self) -> None:
        """Probe the interpreter's SGLang version and its entry point's flags (blocking; for
        :meth:`command`: :meth:`start` uses :meth:`_detect_async`)."""
        if not self._detected:
            probe = self._probe()
            self._detected_as(probe, *detect(probe))

    async def _detect_async(self) -> None:
        """:meth:`_detect` whose probes cancellation kills."""
        if not self._detected:
            probe = self._probe()
            self._detected_as(probe, *await detect_async(probe))

    async def _check_gpus(self) -> None:
        await check_gpus(sorted({gpu for w in self._workers for gpu in w.gpus}), self._probe_env())

    def default_args(self, worker: int = 0) -> list[str]:
        """The launcher's own flags for ``worker``, before user flags and version filtering.

        - ``--model-path``, ``--served-model-name`` (default: the path's last component), the
          name routes use as the target's model.
        - ``--host 127.0.0.1``: not reachable from other machines unless asked for.
        - ``--port``: one per worker.
        - ``--api-key``: a random one by default, so a server on a shared host is not open.
        - ``--schedule-policy lpm``: longest prefix match first. Waiting requests that share a
          prefix with the radix cache run first, so their prefill is mostly a cache hit and their
          first token comes sooner (SGLang's default is ``fcfs``; it falls back to ``fcfs`` by
          itself when the queue is very long).
        - ``--enable-metrics``: ``/metrics`` (queue depth, server-side TTFT, queue time, cache
          hit rate), which llmroute reads to route and to tell where time goes.
        - ``--enable-cache-report``: ``usage.prompt_tokens_details.cached_tokens`` in every
          response, which shows whether prefix affinity hits the cache.

        RadixAttention (prefix caching) and CUDA graphs are left on: both cut TTFT, so
        ``--disable-radix-cache`` and ``--disable-cuda-graph`` are never passed.
        """
        pairs = default_pairs(self._server_flags, self.image, self._workers[worker].port)
        return [token for pair in pairs for token in _tokens(*pair)]

    def _argv(self, worker: int, version: str | None = None) -> list[str]:
        w = self._workers[worker]
        point = entry_point(self.python, self.image, version or self._version or "")
        pairs = default_pairs(self._server_flags, self.image, w.port)
        args = [*point, *server_args(self._server_flags, pairs, self._flags)]
        if self.image is None:
            return args
        return in_container(
            self._process, self.host, w.gpus, w.port, w.container, args, self._probe_env()
        )

    def hf_cache_dir(self) -> Path | None:
        """The host directory mounted as the container's Hugging Face cache, so weights are
        downloaded once: ``hf_cache``, else ``$HF_HOME``, else ``~/.cache/huggingface``;
        ``None`` outside a container, with ``hf_cache=False``, or when ``container_args``
        mount that place themselves."""
        return hf_cache_dir(self._process, self._probe_env())

    def command(self, worker: int = 0, *, reveal_key: bool = False) -> list[str]:
        """The argv that starts ``worker``, with the API key shown as ``***`` unless revealed.

        Probes the interpreter's SGLang version first (blocking) if :meth:`start` has not.
        """
        self._detect()
        argv = self._argv(worker)
        return argv if reveal_key else _redact(argv, self.api_key)

    def planned_command(self, worker: int = 0) -> list[str]:
        """The argv that would start ``worker`` with the newest SGLang (``sglang serve``, every
        default flag), without asking the interpreter: for a dry run where SGLang is not
        installed yet. The API key shows as ``***``."""
        if self._detected:
            return self.command(worker)
        newest = ".".join(map(str, SGLANG_SERVE_SINCE))
        return _redact(self._argv(worker, newest), self.api_key)

    def worker_env(self, worker: int = 0) -> dict[str, str]:
        """The environment ``worker`` runs with (``CUDA_VISIBLE_DEVICES`` set for its GPU)."""
        env = {**os.environ, **self.env}
        gpus = self._workers[worker].gpus
        if gpus and self.image is None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        return env

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(
        self,
        *,
        progress: Callable[[StartupProgress], object] | None = None,
        progress_every: float = 10.0,
    ) -> None:
        """Start every worker and wait until each is ready.

        ``progress``, when given, is called with a :class:`StartupProgress` whenever a worker's
        phase changes (read from its log: loading the weights, capturing CUDA graphs, warming
        up, ...) and at least every ``progress_every`` seconds while the start lasts.

        A worker is ready when ``GET /health_generate`` answers 200 while its process still runs
        and ``GET /get_model_info`` (with the API key) names this server's ``model_path``, while
        a wrong key is refused. Just before a worker starts, its port is checked free: a port
        the launcher chose is replaced by another free one, a port given by the caller makes it
        an error. A server that answers on the port but refuses the key, names another model or
        takes any key is another server (one that took the port meanwhile): an error too, as
        the worker could never serve there.

        Raises :class:`SGLangStartupError` when a worker exits first (quoting its last log
        lines), is not ready within ``startup_timeout``, finds its port taken, or when
        :meth:`stop` is called meanwhile (``"... was stopped before it was ready"``); and
        :class:`SGLangNotInstalled` when the interpreter has no sglang. On any error or
        cancellation every worker started is stopped before this returns.
        """
        if self.pids or self._start_scope is not None:
            raise SGLangError("the server is already running")
        self._stop_requested = False
        try:
            try:
                with anyio.CancelScope() as self._start_scope:
                    await self._check_gpus()
                    check_installed(self._gateway)
                    await self._detect_async()
                    for w in self._workers:
                        _spawn(self, w)
                    await wait_ready(self, progress, progress_every)
                    if self._gateway is not None:
                        for w in self._workers:  # a port the launcher had to change
                            self._gateway.worker_urls[w.index] = self.urls[w.index][: -len("/v1")]
                        await self._gateway.start()
            finally:
                self._start_scope = None
            if self._stop_requested:
                w = next((w for w in self._workers if not w.ready), self._workers[0])
                raise SGLangStartupError(
                    f"SGLang server ({w.describe()}) was stopped before it was ready",
                    worker=w.index,
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise

    def phases(self) -> dict[int, str]:
        """Each worker's startup phase, read from its log (see :func:`startup_phase`); a ready
        worker is ``"ready"``."""
        phases: dict[int, str] = {}
        for w in self._workers:
            phase = "ready" if w.ready else startup_phase(self.log_tail(w.index, 200), w.phase)
            w.phase = phases[w.index] = phase
        return phases

    # -- watching ------------------------------------------------------------------------------

    def exited(self) -> dict[int, int]:
        """The workers whose process has ended since :meth:`start`: worker index -> exit status
        (negative: killed by that signal, as in :attr:`subprocess.Popen.returncode`).

        Empty while every worker runs, and after :meth:`stop` or :meth:`kill` (they forget the
        processes). Does not block.
        """
        ended: dict[int, int] = {}
        for w in self._workers:
            process = w.process
            if process is not None and (returncode := process.poll()) is not None:
                ended[w.index] = returncode
        return ended

    async def wait_exited(self) -> tuple[int, int]:
        """Wait until a worker's process ends; returns ``(worker index, exit status)``.

        Returns at once if one has ended already. For watching workers after :meth:`start`
        (a server that dies later, e.g. out of memory): cancel it before calling :meth:`stop`,
        whose own SIGTERM would otherwise count as an exit. Raises :class:`SGLangError` when no
        worker is running (not started, or stopped). Cancellable; it checks every 0.1 s.
        """
        watched = [(w.index, w.process) for w in self._workers if w.process is not None]
        if not watched:
            raise SGLangError("no SGLang worker is running")
        while True:
            for index, process in watched:
                returncode = process.poll()
                if returncode is not None:
                    return index, returncode
            await anyio.sleep(_WATCH_INTERVAL)

    def log_tail(self, worker: int = 0, lines: int = _LOG_TAIL_LINES) -> list[str]:
        """The last ``lines`` lines of ``worker``'s log (of its latest start), with the API key
        shown as ``***`` (SGLang logs its arguments, key included). Empty before the worker was
        first started. Reads at most the last 64 KiB of the file."""
        w = self._workers[worker]
        return [_scrub(line, self.api_key) for line in _tail(w.log_path, lines)]

    # -- stopping ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop every worker: SIGTERM to its process group, up to ``grace`` seconds to drain,
        then SIGKILL; returns once no process of the groups is left (bounded). Idempotent; a
        call made while another runs waits for that one.

        Called while :meth:`start` runs (from another task), it makes :meth:`start` raise
        :class:`SGLangStartupError` (``"... was stopped before it was ready"``).
        """
        if self._start_scope is not None:
            self._stop_requested = True
            self._start_scope.cancel()
        with anyio.CancelScope(shield=True):
            if self._stopping is not None:
                await self._stopping.wait()
                return
            self._stopping = stopping = anyio.Event()
            try:
                if self._gateway is not None:  # first: it stops sending to the workers
                    await self._gateway.stop()
                async with anyio.create_task_group() as group:
                    for w in self._workers:
                        if w.process is not None:
                            group.start_soon(_stop_worker, w, self.grace)
                _live.discard(self)
            finally:
                self._stopping = None
                stopping.set()

    def kill(self) -> None:
        """SIGKILL every worker's process group now, without a drain (blocking; for exit paths)."""
        if self._gateway is not None:
            self._gateway.kill()
        for w in self._workers:
            if w.pgid is not None:
                _signal_group(w.pgid, signal.SIGKILL)
                if w.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        w.process.wait(timeout=1.0)
            if w.container is not None:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    subprocess.run(["docker", "kill", w.container], capture_output=True, timeout=5)
            w.process = w.pgid = w.container = None
            w.ready = False
        _live.discard(self)


def _claim_port(server: SGLangServer, w: _Worker) -> None:
    """Make sure nothing listens on ``w``'s port yet (a free port chosen at ``__init__`` may
    have been taken since: then another is chosen)."""
    host = server._bind_host()
    if not _port_in_use(host, w.port):
        return
    if not w.auto_port:
        raise SGLangStartupError(
            f"SGLang server ({w.describe()}) cannot start: port {w.port} on {host} is "
            "already in use (another server is listening there); choose another port",
            worker=w.index,
        )
    others = {o.port for o in server._workers if o is not w}
    port = w.port
    while port == w.port or port in others:
        (port,) = _free_ports(host, 1)
    log.info("port %d was taken meanwhile: SGLang worker %d gets port %d", w.port, w.index, port)
    w.port = port


async def _stop_worker(w: _Worker, grace: float) -> None:
    process, pgid = w.process, w.pgid
    assert process is not None and pgid is not None
    _signal_group(pgid, signal.SIGTERM)
    if not await _wait_gone(process, pgid, grace):
        log.info("SGLang worker %d did not stop within %g s of SIGTERM: SIGKILL", w.index, grace)
        _signal_group(pgid, signal.SIGKILL)
        if w.container is not None:
            await _kill_container(w.container)
        if not await _wait_gone(process, pgid, KILL_TIMEOUT):
            log.warning("SGLang worker %d: process group %d outlived SIGKILL", w.index, pgid)
    w.process = w.pgid = None
    w.container = None
    w.ready = False


async def _kill_container(name: str) -> None:
    # SIGKILL to `docker run` cannot be forwarded: the container itself must be killed.
    with contextlib.suppress(OSError):
        await anyio.run_process(["docker", "kill", name], check=False)


def _spawn(server: SGLangServer, w: _Worker) -> None:
    _claim_port(server, w)
    server.log_dir.mkdir(parents=True, exist_ok=True)
    w.log_path = log_path = server.log_paths[w.index]
    if server.image is not None:
        w.container = f"llmroute-sglang-{w.port}-{secrets.token_hex(4)}"
    hf_cache = server.hf_cache_dir()
    if hf_cache is not None:  # else docker creates it, owned by root
        with contextlib.suppress(OSError):
            hf_cache.mkdir(parents=True, exist_ok=True)
    argv = server._argv(w.index)
    shown = shlex.join(_redact(argv, server.api_key))
    log.info("starting SGLang worker %d: %s (log: %s)", w.index, shown, log_path)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as log_file:
        log_file.write(f"# llmroute: {shown}\n".encode())
        log_file.flush()
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=server.worker_env(w.index),
                start_new_session=True,
            )
        except OSError as exc:
            raise SGLangError(f"could not start {argv[0]!r}: {exc}") from exc
    w.process = process
    w.pgid = process.pid  # start_new_session: the child leads a new group
    _live.add(server)
