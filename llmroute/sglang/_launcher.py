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
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, Self

import anyio
import anyio.to_thread
import httpx

from ._presets import Preset, preset_args
from ._process import (
    _LOG_TAIL_LINES,
    _REDACTED,
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

SGLANG_SERVE_SINCE: Final = (0, 5, 5)
"""The first SGLang release with the ``sglang serve`` command: 0.5.5 (November 2025) ships
``sglang/cli/main.py`` and the console script ``sglang = sglang.cli.main:main``; 0.5.4.post3, the
release before it, has no ``sglang.cli`` package (both wheels on PyPI; sgl-project/sglang#12484)."""

VERSION_TIMEOUT: Final = 60.0
"""Seconds allowed for ``import sglang`` in the chosen interpreter (a cold import is slow)."""
HELP_TIMEOUT: Final = 120.0
"""Seconds allowed for the entry point's ``--help`` (it imports the server's argument module)."""

_SERVE_CODE: Final = (
    "import sys; from sglang.cli.main import main; sys.argv[0] = 'sglang'; sys.exit(main())"
)
_VERSION_CODE: Final = "import sglang; print(sglang.__version__)"


def install_commands(python: str) -> list[str]:
    """The commands that install SGLang for the interpreter ``python``: the one text both the
    launcher's error and docs/sglang.md's recipe give (a test holds them together)."""
    return [
        f"{python} -m pip install --upgrade pip uv",
        f"{python} -m uv pip install --python {python} sglang",
    ]


def install_hint(python: str) -> str:
    """How to get SGLang for ``python``, or do without it, as one sentence."""
    return (
        "SGLang's server needs a Linux host with an NVIDIA GPU (CUDA). Install it into that "
        f"interpreter ({' && '.join(install_commands(python))}; SGLang's install guide has the "
        "variants for CUDA 13 hosts), or name an interpreter that has it (python=, --python), "
        "or run SGLang's container image instead (image=, --image lmsysorg/sglang:latest). "
        "See docs/sglang.md"
    )


_WATCH_INTERVAL: Final = 0.1  # seconds between wait_exited()'s looks at the workers
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_CHOICES = re.compile(r"\{([\w.,-]+)\}")

DEFAULT_FLAGS: Final = (
    "--model-path",
    "--served-model-name",
    "--host",
    "--port",
    "--api-key",
    "--schedule-policy",
    "--enable-metrics",
    "--enable-cache-report",
)
"""The flags the launcher sets itself, each explained in :meth:`SGLangServer.default_args`."""

_CONTAINER_HF_CACHE: Final = "/root/.cache/huggingface"
"""The Hugging Face cache inside SGLang's images (they run as root)."""
_HF_TOKENS: Final = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
"""Passed into a container by name when set (``-e NAME``): gated models need them."""

_ALIASES: Final = {"--model": "--model-path"}
"""Spellings SGLang accepts for the same option (``--model`` is ``--model-path``'s alias)."""


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


class RouteRegistry(Protocol):
    """What :meth:`SGLangServer.register` needs of a client (``llmroute.AsyncOpenAI``)."""

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None: ...

    def add_targets(self, model: str, targets: Any, **route: Any) -> None: ...


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


class SGLangNotInstalled(SGLangError):
    """Raised when the chosen Python interpreter cannot import sglang."""


class SGLangConfigError(SGLangError):
    """Raised before any server starts when what was asked for cannot work here: a preset the
    installed SGLang lacks, a GPU this host does not have."""


def parse_release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version string: ``"0.5.4.post3"`` -> ``(0, 5, 4)``.

    Pre-releases count as their release (``"0.5.5rc0"`` -> ``(0, 5, 5)``); an unreadable
    version is ``()``, older than any.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _flag_name(token: str) -> str | None:
    if not token.startswith("--") or token == "--":
        return None
    name = token.split("=", 1)[0]
    return _ALIASES.get(name, name)


def _user_value(args: Sequence[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag value`` or ``--flag=value``; the last wins)."""
    value: str | None = None
    for i, token in enumerate(args):
        if _flag_name(token) != flag:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
    return value


_PARALLEL_SPELLINGS: Final = {
    "--tp-size": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "--dp-size": ("--dp-size", "--data-parallel-size", "--dp"),
}
"""SGLang's spellings of the parallel sizes; ``--tp`` and ``--dp`` are argparse's prefix
matches of ``--tp-size`` and ``--dp-size``, which users write."""


def _parallel_size(args: Sequence[str], flag: str) -> int | None:
    """The value ``args`` give a parallel size under any of its spellings (the last wins)."""
    value: int | None = None
    spellings = _PARALLEL_SPELLINGS[flag]
    for i, token in enumerate(args):
        name, _, inline = token.partition("=")
        if name not in spellings:
            continue
        text = inline if "=" in token else (args[i + 1] if i + 1 < len(args) else "")
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} takes a whole number, got {text!r}") from None
    return value


def _gpu_names(gpus: Sequence[int]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


def _tokens(flag: str, value: str | None) -> list[str]:
    if value is None:
        return [flag]
    # argparse takes "--flag -x" for a missing value; "--flag=-x" is unambiguous.
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


# Help texts by (interpreter, version, PYTHONPATH): the flags each entry point lists, or None
# when the help could not be read (then no default flag is dropped).
_help_cache: dict[tuple[str, str, str, str], frozenset[str] | None] = {}
_help_lock = threading.Lock()

# Servers started and not yet stopped (held strongly: dropping a running server's object must not
# lose track of it). Those still running at interpreter exit are killed, so none outlives us.
_live: set[SGLangServer] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_live):
        server.kill()


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


class SGLangServer:
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

    def __init__(
        self,
        model_path: str,
        *,
        served_model_name: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        api_key: str | None = None,
        python: str | None = sys.executable,
        image: str | None = None,
        gpus: Sequence[int] | None = None,
        tp: int | None = None,
        extra_args: Sequence[str] = (),
        log_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 600.0,
        grace: float = 30.0,
        env: Mapping[str, str] | None = None,
        container_args: Sequence[str] = (),
        hf_cache: str | os.PathLike[str] | Literal[False] | None = None,
        gateway: bool = False,
        gateway_port: int | None = None,
        gateway_policy: str = "cache_aware",
        gateway_args: Sequence[str] = (),
        gateway_command: Sequence[str] | None = None,
        presets: Sequence[Preset] = (),
    ) -> None:
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of arguments, not one string")
        extra = [str(arg) for arg in extra_args]
        if not (startup_timeout > 0 and math.isfinite(startup_timeout)):
            raise ValueError(f"startup_timeout must be a positive number, got {startup_timeout!r}")
        if not (grace >= 0 and math.isfinite(grace)):
            raise ValueError(f"grace must be a non-negative number, got {grace!r}")
        user_tp = _parallel_size(extra, "--tp-size")
        if tp is not None and user_tp is not None and int(tp) != user_tp:
            raise ValueError(f"tp={tp} and the SGLang flag --tp-size {user_tp} disagree")
        self.tp = int(tp) if tp is not None else (user_tp or 1)
        self.dp = _parallel_size(extra, "--dp-size") or 1
        if self.tp < 1 or self.dp < 1:
            raise ValueError("the tensor- and data-parallel sizes must be at least 1")
        self._pass_tp = tp is not None and user_tp is None and self.tp > 1
        gpu_sets: list[tuple[int, ...]] = [()]
        if gpus is not None:
            gpu_list = [int(gpu) for gpu in gpus]
            if not gpu_list:
                raise ValueError("gpus must name at least one GPU (or be None)")
            if len(set(gpu_list)) != len(gpu_list):
                raise ValueError(f"gpus has duplicates: {list(gpus)}")
            per = self.tp * self.dp
            if len(gpu_list) % per:
                raise ValueError(
                    f"{len(gpu_list)} GPU(s) {gpu_list} do not divide into servers of "
                    f"{per} GPU(s) each (tensor parallel {self.tp} x data parallel {self.dp}): "
                    f"give a multiple of {per} GPUs"
                )
            gpu_sets = [tuple(gpu_list[i : i + per]) for i in range(0, len(gpu_list), per)]
        user_port = _user_value(extra, "--port")
        if user_port is not None:
            if len(gpu_sets) > 1:
                raise ValueError("with several servers give the first port as port=, not --port")
            port = int(user_port)
        self.model_path = _user_value(extra, "--model-path") or model_path
        self.served_model_name = (
            _user_value(extra, "--served-model-name")
            or served_model_name
            or self.model_path.rstrip("/").rsplit("/", 1)[-1]
        )
        self.host = _user_value(extra, "--host") or host
        self._api_key = (
            _user_value(extra, "--api-key") or api_key or "sk-" + secrets.token_urlsafe(32)
        )
        self.python = python or sys.executable
        self.image = image
        self.extra_args = tuple(extra)
        self.startup_timeout = float(startup_timeout)
        self.grace = float(grace)
        self.env = dict(env or {})
        self.container_args = tuple(container_args)
        self.presets = tuple(presets)
        self._hf_cache = hf_cache
        self._log_dir = Path(log_dir) if log_dir is not None else None
        ports = (
            [port + i for i in range(len(gpu_sets))]
            if port is not None
            else _free_ports(self._bind_host(), len(gpu_sets))
        )
        self._version: str | None = None
        self._flags: frozenset[str] | None = None
        self._detected = False
        self._workers = [
            _Worker(index=i, gpus=gpu_set, port=ports[i], auto_port=port is None)
            for i, gpu_set in enumerate(gpu_sets)
        ]
        self._gateway: SGLangGateway | None = None
        if gateway:
            from ._gateway import SGLangGateway

            self._gateway = SGLangGateway(
                self.urls,
                api_key=self._api_key,
                log_path=self.log_dir / "smg-gateway.log",
                host=self.host,
                port=gateway_port,
                policy=gateway_policy,
                extra_args=gateway_args,
                command=gateway_command,
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
        return self._api_key

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

    def _detect(self) -> None:
        """Probe the interpreter's SGLang version and its entry point's flags (blocking; for
        :meth:`command`: :meth:`start` uses :meth:`_detect_async`)."""
        if self._detected:
            return
        env = self._probe_env()
        try:
            done = subprocess.run(
                self._version_argv(),
                env=env,
                capture_output=True,
                timeout=self._version_timeout(),
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise self._no_interpreter() from exc
        except OSError as exc:
            raise self._cannot_run(exc) from exc
        except subprocess.TimeoutExpired as exc:
            raise self._import_too_slow() from exc
        self._version = self._read_version(done.returncode, done.stdout, done.stderr)
        key = self._help_key(env)
        with _help_lock:
            cached = key in _help_cache
            flags = _help_cache.get(key)
        if not cached:
            try:
                helped = subprocess.run(
                    self._probe_argv([*self._entry_point(), "--help"]),
                    env=dict(env),
                    capture_output=True,
                    timeout=HELP_TIMEOUT,
                    stdin=subprocess.DEVNULL,
                )
                flags = self._read_help(helped.stdout, helped.stderr)
            except subprocess.TimeoutExpired:
                flags = self._help_failed(f"it took over {HELP_TIMEOUT:.0f} s")
            except OSError as exc:
                flags = self._help_failed(str(exc))
            with _help_lock:
                _help_cache[key] = flags
        self._detected_as(flags)

    async def _detect_async(self) -> None:
        """:meth:`_detect` for :meth:`start`: the probes are child processes that cancellation
        kills (a cancelled start does not wait for a slow ``import sglang`` or ``--help``)."""
        if self._detected:
            return
        env = self._probe_env()
        try:
            with anyio.fail_after(self._version_timeout()):
                done = await anyio.run_process(
                    self._version_argv(),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    check=False,
                )
        except FileNotFoundError as exc:
            raise self._no_interpreter() from exc
        except TimeoutError as exc:  # an OSError: before it
            raise self._import_too_slow() from exc
        except OSError as exc:
            raise self._cannot_run(exc) from exc
        version = self._read_version(done.returncode, done.stdout, done.stderr)
        self._version = version
        key = self._help_key(env)
        with _help_lock:
            cached = key in _help_cache
            flags = _help_cache.get(key)
        if not cached:
            try:
                with anyio.fail_after(HELP_TIMEOUT):
                    helped = await anyio.run_process(
                        self._probe_argv([*self._entry_point(), "--help"]),
                        env=dict(env),
                        stdin=subprocess.DEVNULL,
                        check=False,
                    )
                flags = self._read_help(helped.stdout, helped.stderr)
            except TimeoutError:
                flags = self._help_failed(f"it took over {HELP_TIMEOUT:.0f} s")
            except OSError as exc:
                flags = self._help_failed(str(exc))
            with _help_lock:
                _help_cache[key] = flags
        self._detected_as(flags)

    def _check_gateway(self) -> None:
        if self._gateway is not None and self._gateway.command is None:
            from ._gateway import _INSTALL, SGLangGatewayNotInstalled, find_smg

            if find_smg() is None:
                raise SGLangGatewayNotInstalled(_INSTALL)

    async def _check_gpus(self) -> None:
        """Raise when a GPU asked for is not on this host, as ``nvidia-smi -L`` lists them
        (no check without ``nvidia-smi``)."""
        wanted = sorted({gpu for w in self._workers for gpu in w.gpus})
        env = self._probe_env()
        smi = shutil.which("nvidia-smi", path=env.get("PATH"))
        if not wanted or smi is None:
            return
        try:
            with anyio.fail_after(30):
                done = await anyio.run_process(
                    [smi, "-L"], env=env, stdin=subprocess.DEVNULL, check=False
                )
        except (OSError, TimeoutError):
            return
        if done.returncode != 0:
            return
        listed = done.stdout.decode("utf-8", "replace").splitlines()
        count = sum(1 for line in listed if line.startswith("GPU "))
        missing = [gpu for gpu in wanted if gpu >= count]
        if missing:
            have = f"GPUs 0-{count - 1}" if count > 1 else "GPU 0" if count else "no GPU"
            raise SGLangConfigError(
                f"{_gpu_names(missing)} not on this host: nvidia-smi lists {have}; "
                "choose GPUs from those (--gpus / gpus=)"
            )

    def _probe_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run where the server runs: here, or in a throwaway container of the image
        (``docker run --rm --entrypoint <argv[0]> <image> <argv[1:]>``, no GPU needed)."""
        if self.image is None:
            return list(argv)
        return ["docker", "run", "--rm", "--entrypoint", argv[0], self.image, *argv[1:]]

    def _version_argv(self) -> list[str]:
        python = "python3" if self.image is not None else self.python
        return self._probe_argv([python, "-c", _VERSION_CODE])

    def _version_timeout(self) -> float:
        # A container's first run may pull the image first.
        return VERSION_TIMEOUT if self.image is None else max(VERSION_TIMEOUT, self.startup_timeout)

    def _where(self) -> str:
        if self.image is not None:
            return f"the container image {self.image}"
        return f"the Python interpreter {self.python}"

    def _no_interpreter(self) -> SGLangError:
        if self.image is not None:
            return SGLangError(
                "docker is not on this host's PATH: a container image (image=, --image) needs "
                "Docker with the NVIDIA Container Toolkit; or run SGLang from a Python "
                "interpreter that has it (python=, --python)"
            )
        return SGLangNotInstalled(
            f"the Python interpreter {self.python!r} does not exist. " + install_hint("python")
        )

    def _cannot_run(self, exc: OSError) -> SGLangError:
        what = "docker" if self.image is not None else f"the Python interpreter {self.python!r}"
        return SGLangError(f"cannot run {what}: {exc}")

    def _import_too_slow(self) -> SGLangError:
        return SGLangError(
            f"importing sglang in {self._where()} took over {self._version_timeout():.0f} s"
        )

    def _read_version(self, returncode: int, stdout: bytes, stderr: bytes) -> str:
        """The version the probe printed; raises when it could not import sglang."""
        errors = stderr.decode("utf-8", "replace")
        if returncode != 0:
            if "No module named 'sglang'" in errors or "No module named sglang" in errors:
                if self.image is not None:
                    raise SGLangNotInstalled(
                        f"SGLang is not installed in the container image {self.image} (import "
                        "sglang fails): choose an SGLang image, such as lmsysorg/sglang:latest"
                    )
                raise SGLangNotInstalled(
                    f"SGLang is not installed for the Python interpreter {self.python} "
                    "(import sglang fails). " + install_hint(self.python)
                )
            tail = "\n".join("  " + line for line in errors.splitlines()[-_LOG_TAIL_LINES:])
            raise SGLangError(
                f"could not import sglang in {self._where()} (status {returncode}):\n{tail}"
            )
        lines = stdout.decode("utf-8", "replace").strip().splitlines()
        return lines[-1].strip() if lines else ""

    def _help_key(self, env: Mapping[str, str]) -> tuple[str, str, str, str]:
        """Help texts are cached by interpreter (or image), version, PYTHONPATH and entry
        point."""
        where = self.image if self.image is not None else self.python
        return (where, self._version or "", env.get("PYTHONPATH", ""), self._entry_point()[1])

    @staticmethod
    def _read_help(stdout: bytes, stderr: bytes) -> frozenset[str] | None:
        text = (stdout + b"\n" + stderr).decode("utf-8", "replace")
        flags = frozenset(_FLAG.findall(text)) or None
        if flags is not None:  # and the choices argparse lists, {EAGLE,EAGLE3,...}
            choices = (c.strip() for group in _CHOICES.findall(text) for c in group.split(","))
            flags |= {choice for choice in choices if choice}
        if flags is None:
            log.warning("SGLang's --help listed no flags; passing every default flag")
        return flags

    @staticmethod
    def _help_failed(why: str) -> None:
        log.warning("could not read the SGLang server's --help (%s); passing every flag", why)

    def _detected_as(self, flags: frozenset[str] | None) -> None:
        for preset in self.presets:
            missing = preset.missing(flags)
            if missing:
                raise SGLangConfigError(
                    f"the preset {preset.name} needs {', '.join(missing)}, which SGLang "
                    f"{self._version or '(this version)'} in {self._where()} does not have: "
                    "upgrade SGLang or leave the preset out"
                )
        self._flags = flags
        self._detected = True
        if flags is not None:
            unknown = [flag for flag in DEFAULT_FLAGS if flag not in flags]
            if unknown:
                log.info(
                    "SGLang %s does not know %s: not passed", self._version, ", ".join(unknown)
                )

    def _entry_point(self, version: str | None = None) -> list[str]:
        python = "python3" if self.image is not None else self.python
        if parse_release(version or self._version or "") >= SGLANG_SERVE_SINCE:
            return [python, "-c", _SERVE_CODE, "serve"]
        return [python, "-m", "sglang.launch_server"]

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
        return [token for pair in self._default_pairs(worker) for token in _tokens(*pair)]

    def _default_pairs(self, worker: int) -> list[tuple[str, str | None]]:
        w = self._workers[worker]
        listen = "0.0.0.0" if self.image is not None else self.host
        return [
            ("--model-path", self.model_path),
            ("--served-model-name", self.served_model_name),
            ("--host", listen),
            ("--port", str(w.port)),
            ("--api-key", self._api_key),
            ("--schedule-policy", "lpm"),
            ("--enable-metrics", None),
            ("--enable-cache-report", None),
            *([("--tp-size", str(self.tp))] if self._pass_tp else []),
        ]

    def _server_args(self, worker: int) -> list[str]:
        """The server's arguments for ``worker``: the defaults the version knows and the user
        did not give, then the user's."""
        user = {name for token in self.extra_args if (name := _flag_name(token)) is not None}
        chosen: list[str] = []
        for flag, value in self._default_pairs(worker):
            known = self._flags is None or flag in self._flags or flag == "--model-path"
            if flag not in user and known:
                chosen += _tokens(flag, value)
        return [*chosen, *preset_args(self.presets, user), *self.extra_args]

    def _argv(self, worker: int, version: str | None = None) -> list[str]:
        w = self._workers[worker]
        args = [*self._entry_point(version), *self._server_args(worker)]
        if self.image is None:
            return args
        # docker reads --gpus as CSV: several devices must be quoted ('"device=0,1"').
        devices = ",".join(map(str, w.gpus))
        gpus = (
            "all"
            if not w.gpus
            else f"device={devices}"
            if len(w.gpus) == 1
            else f'"device={devices}"'
        )
        docker = ["docker", "run", "--gpus", gpus]
        docker += ["--rm", "--init", "-p", f"{_url_host(self.host)}:{w.port}:{w.port}"]
        docker += ["--ipc=host"]
        if w.container is not None:
            docker += ["--name", w.container]
        hf_cache = self.hf_cache_dir()
        if hf_cache is not None:
            docker += ["-v", f"{hf_cache}:{_CONTAINER_HF_CACHE}"]
        # Values come from docker's environment, never the command line.
        passed = {**self.env, **dict.fromkeys(n for n in _HF_TOKENS if self._probe_env().get(n))}
        for name in passed:
            docker += ["-e", name]
        return [*docker, *self.container_args, self.image, *args]

    def hf_cache_dir(self) -> Path | None:
        """The host directory mounted as the container's Hugging Face cache, so weights are
        downloaded once: ``hf_cache``, else ``$HF_HOME``, else ``~/.cache/huggingface``;
        ``None`` outside a container, with ``hf_cache=False``, or when ``container_args``
        mount that place themselves."""
        if self.image is None or self._hf_cache is False:
            return None
        if any(_CONTAINER_HF_CACHE in arg for arg in self.container_args):
            return None
        if self._hf_cache is not None and self._hf_cache is not True:
            return Path(self._hf_cache).expanduser()
        home = self._probe_env().get("HF_HOME")
        return Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface"

    def command(self, worker: int = 0, *, reveal_key: bool = False) -> list[str]:
        """The argv that starts ``worker``, with the API key shown as ``***`` unless revealed.

        Probes the interpreter's SGLang version first (blocking) if :meth:`start` has not.
        """
        self._detect()
        argv = self._argv(worker)
        return argv if reveal_key else _redact(argv, self._api_key)

    def planned_command(self, worker: int = 0) -> list[str]:
        """The argv that would start ``worker`` with the newest SGLang (``sglang serve``, every
        default flag), without asking the interpreter: for a dry run where SGLang is not
        installed yet. The API key shows as ``***``."""
        if self._detected:
            return self.command(worker)
        newest = ".".join(map(str, SGLANG_SERVE_SINCE))
        return _redact(self._argv(worker, newest), self._api_key)

    def worker_env(self, worker: int = 0) -> dict[str, str]:
        """The environment ``worker`` runs with (``CUDA_VISIBLE_DEVICES`` set for its GPU)."""
        env = {**os.environ, **self.env}
        gpus = self._workers[worker].gpus
        if gpus and self.image is None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        return env

    # -- routing -------------------------------------------------------------------------------

    def provider_names(self, provider_name: str) -> list[str]:
        """One provider per worker: ``name``, ``name-1``, ``name-2``, ..."""
        return [provider_name if i == 0 else f"{provider_name}-{i}" for i in range(len(self))]

    def provider_config(self, worker: int = 0) -> dict[str, Any]:
        """A ``[providers.X]`` table for ``worker``: kind, base URL and key."""
        return {"kind": "sglang", "base_url": self.urls[worker], "api_key": self._api_key}

    @property
    def gateway_url(self) -> str | None:
        """The OpenAI base URL of SGLang's gateway in front of the workers (``gateway=True``),
        else ``None``."""
        return self._gateway.url if self._gateway is not None else None

    @property
    def gateway(self) -> SGLangGateway | None:
        return self._gateway

    def providers(self, provider_name: str) -> dict[str, dict[str, Any]]:
        """Every worker's ``[providers.X]`` table, by the names of :meth:`provider_names`; with
        a gateway, the gateway's alone (``kind = "sglang-gateway"``): it decides the worker."""
        if self._gateway is not None:
            table = {"kind": "sglang-gateway", "base_url": self._gateway.url}
            return {provider_name: {**table, "api_key": self._api_key}}
        names = self.provider_names(provider_name)
        return {name: self.provider_config(i) for i, name in enumerate(names)}

    def targets(self, provider_name: str) -> list[str]:
        """Each worker as a route target, ``"provider:served_model_name"``; with a gateway,
        the gateway alone."""
        if self._gateway is not None:
            return [f"{provider_name}:{self.served_model_name}"]
        return [f"{name}:{self.served_model_name}" for name in self.provider_names(provider_name)]

    def metrics_urls(self, provider_name: str) -> dict[str, str]:
        """Each worker's server root by target name, for :class:`MetricsPoller`."""
        roots = [url.removesuffix("/v1") for url in self.urls]
        return dict(zip(self.targets(provider_name), roots, strict=True))

    def metrics_keys(self, provider_name: str) -> dict[str, str]:
        """The API key by target name, for :class:`MetricsPoller`'s ``keys`` (SGLang before 0.5
        wants it on ``/metrics`` too)."""
        return dict.fromkeys(self.targets(provider_name), self._api_key)

    def register(
        self, client: RouteRegistry, model: str, *, provider: str = "sglang", **route: Any
    ) -> list[str]:
        """Make every worker a target of ``client``'s route ``model``; returns the targets.

        The workers become providers ``provider``, ``provider-1``, ... (``kind = "sglang"``,
        so the client reads their ``/metrics``). A route that does not exist yet is created
        from ``route`` (the keys of a ``[models.<name>]`` table, e.g. ``policy="prefix"``).
        """
        for name, table in self.providers(provider).items():
            client.add_provider(name, table)
        targets = self.targets(provider)
        client.add_targets(model, targets, **route)
        return targets

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
                    self._check_gateway()
                    await self._detect_async()
                    for w in self._workers:
                        self._spawn(w)
                    await self._wait_ready(progress, progress_every)
                    if self._gateway is not None:
                        for w in self._workers:  # a port the launcher had to change
                            self._gateway.worker_urls[w.index] = self.urls[w.index][: -len("/v1")]
                        await self._gateway.start()
            finally:
                self._start_scope = None
            if self._stop_requested:
                w = next((w for w in self._workers if not w.ready), self._workers[0])
                raise SGLangStartupError(
                    f"SGLang server ({self._describe(w)}) was stopped before it was ready",
                    worker=w.index,
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise

    def _describe(self, w: _Worker) -> str:
        gpu = f", {_gpu_names(w.gpus)}" if w.gpus else ""
        return f"worker {w.index}{gpu}, port {w.port}"

    def _claim_port(self, w: _Worker) -> None:
        """Make sure nothing listens on ``w``'s port yet (a free port chosen at ``__init__`` may
        have been taken since: then another is chosen)."""
        host = self._bind_host()
        if not _port_in_use(host, w.port):
            return
        if not w.auto_port:
            raise SGLangStartupError(
                f"SGLang server ({self._describe(w)}) cannot start: port {w.port} on {host} is "
                "already in use (another server is listening there); choose another port",
                worker=w.index,
            )
        others = {o.port for o in self._workers if o is not w}
        port = w.port
        while port == w.port or port in others:
            (port,) = _free_ports(host, 1)
        log.info(
            "port %d was taken meanwhile: SGLang worker %d gets port %d", w.port, w.index, port
        )
        w.port = port

    def _spawn(self, w: _Worker) -> None:
        self._claim_port(w)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        w.log_path = log_path = self.log_paths[w.index]
        if self.image is not None:
            w.container = f"llmroute-sglang-{w.port}-{secrets.token_hex(4)}"
        hf_cache = self.hf_cache_dir()
        if hf_cache is not None:  # else docker creates it, owned by root
            with contextlib.suppress(OSError):
                hf_cache.mkdir(parents=True, exist_ok=True)
        argv = self._argv(w.index)
        shown = shlex.join(_redact(argv, self._api_key))
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
                    env=self.worker_env(w.index),
                    start_new_session=True,
                )
            except OSError as exc:
                raise SGLangError(f"could not start {argv[0]!r}: {exc}") from exc
        w.process = process
        w.pgid = process.pid  # start_new_session: the child leads a new group
        _live.add(self)

    def phases(self) -> dict[int, str]:
        """Each worker's startup phase, read from its log (see :func:`startup_phase`); a ready
        worker is ``"ready"``."""
        phases: dict[int, str] = {}
        for w in self._workers:
            phase = "ready" if w.ready else startup_phase(self.log_tail(w.index, 200), w.phase)
            w.phase = phases[w.index] = phase
        return phases

    async def _report_progress(
        self, progress: Callable[[StartupProgress], object], every: float
    ) -> None:
        began = last_report = anyio.current_time()
        labels = {w.index: self._label(w) for w in self._workers}
        reported: dict[int, str] = {}
        while True:
            phases = await anyio.to_thread.run_sync(self.phases)
            now = anyio.current_time()
            if phases != reported or now - last_report >= every:
                progress(StartupProgress(now - began, phases, labels))
                reported, last_report = phases, now
            await anyio.sleep(_PROGRESS_LOOK)

    def _label(self, w: _Worker) -> str:
        return f"worker {w.index}" + (f" ({_gpu_names(w.gpus)})" if w.gpus else "")

    async def _wait_ready(
        self, progress: Callable[[StartupProgress], object] | None = None, every: float = 10.0
    ) -> None:
        failures: list[SGLangStartupError] = []
        with anyio.move_on_after(self.startup_timeout) as deadline:
            async with (
                httpx.AsyncClient(trust_env=False) as http,
                anyio.create_task_group() as group,
            ):
                if progress is not None:
                    group.start_soon(self._report_progress, progress, every)

                async def wait(w: _Worker) -> None:
                    try:
                        await self._wait_worker(w, http)
                    except SGLangStartupError as exc:
                        failures.append(exc)
                        group.cancel_scope.cancel()

                async with anyio.create_task_group() as waits:
                    for w in self._workers:
                        waits.start_soon(wait, w)
                group.cancel_scope.cancel()  # every worker is ready: the reports end
        if failures:
            raise failures[0]
        if deadline.cancelled_caught:
            slow = next(w for w in self._workers if not w.ready)
            raise self._startup_error(
                slow, f"was not ready within {self.startup_timeout:g} s (stopped)", None
            )

    async def _wait_worker(self, w: _Worker, http: httpx.AsyncClient) -> None:
        process = w.process  # stop() clears w.process: this wait keeps its own
        assert process is not None
        root = self.urls[w.index].removesuffix("/v1")
        headers = {"Authorization": f"Bearer {self._api_key}"}
        interval = 0.2
        while True:
            self._check_running(w, process)
            try:
                response = await http.get(root + "/health_generate", headers=headers, timeout=10.0)
                healthy = response.status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                # A 200 is ours only if our process still runs and the server knows our key
                # and model: another server that had the port first answers too.
                self._check_running(w, process)
                if await self._confirm_identity(w, process, http, root, headers):
                    self._check_running(w, process)
                    w.ready = True
                    log.info("SGLang worker %d is ready at %s", w.index, self.urls[w.index])
                    return
            await anyio.sleep(interval)
            interval = min(interval * 1.5, 1.0)

    def _check_running(self, w: _Worker, process: subprocess.Popen[bytes]) -> None:
        returncode = process.poll()
        if returncode is not None:
            raise self._startup_error(
                w, f"exited with {_describe_status(returncode)} before it was ready", returncode
            )

    async def _confirm_identity(
        self,
        w: _Worker,
        process: subprocess.Popen[bytes],
        http: httpx.AsyncClient,
        root: str,
        headers: Mapping[str, str],
    ) -> bool:
        """Whether the server on ``w``'s port is ``w``: True when ``/get_model_info`` answers 200
        with this server's model to this server's key and refuses a wrong key (401 or 403),
        False when it cannot tell yet (no answer, 5xx). Raises when it is another server: it
        refuses the key, lacks the endpoint, serves another model, or takes any key (a server
        started without ``--api-key`` that happens to serve the same model)."""
        try:
            response = await http.get(root + "/get_model_info", headers=headers, timeout=10.0)
        except httpx.HTTPError:
            return False
        status = response.status_code
        if status >= 500:
            return False
        served: object = None
        if status == 200:
            try:
                info: Any = response.json()
            except ValueError:
                info = None
            served = info.get("model_path") if isinstance(info, dict) else None
            if isinstance(served, str) and self._same_model(w, served):
                wrong = {"Authorization": f"Bearer wrong-{secrets.token_urlsafe(16)}"}
                try:
                    refused = await http.get(root + "/get_model_info", headers=wrong, timeout=10.0)
                except httpx.HTTPError:
                    return False
                if refused.status_code in (401, 403):
                    return True
                if refused.status_code >= 500:
                    return False
                why = (
                    f"it answered a wrong API key with {refused.status_code}: a server without "
                    "this server's key, though it serves the same model"
                )
            else:
                why = f"it serves model_path {served!r}, not {self.model_path!r}"
        elif status in (401, 403):
            why = f"it refused this server's API key (GET /get_model_info: {status})"
        else:
            why = f"GET /get_model_info answered {status}"
        self._check_running(w, process)
        raise self._startup_error(
            w, f"is not ready: another server answers on port {w.port} ({why}) (stopped)", None
        )

    def _same_model(self, w: _Worker, served: str) -> bool:
        if served.rstrip("/") == self.model_path.rstrip("/"):
            return True
        with contextlib.suppress(OSError):
            if os.path.exists(served) and os.path.samefile(served, self.model_path):
                return True
        # SGLANG_USE_MODELSCOPE downloads the model and reports the download's directory.
        flag = self.worker_env(w.index).get("SGLANG_USE_MODELSCOPE", "")
        return flag.lower() in ("1", "true", "yes", "on")

    def _startup_error(self, w: _Worker, what: str, returncode: int | None) -> SGLangStartupError:
        quoted = "\n".join("  | " + line for line in self.log_tail(w.index))
        message = (
            f"SGLang server ({self._describe(w)}) {what}; "
            f"last lines of {w.log_path}:\n{quoted or '  (the log is empty)'}"
        )
        return SGLangStartupError(message, worker=w.index, returncode=returncode)

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
        return [_scrub(line, self._api_key) for line in _tail(w.log_path, lines)]

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
                            group.start_soon(self._stop_worker, w)
                _live.discard(self)
            finally:
                self._stopping = None
                stopping.set()

    async def _stop_worker(self, w: _Worker) -> None:
        process, pgid = w.process, w.pgid
        assert process is not None and pgid is not None
        _signal_group(pgid, signal.SIGTERM)
        if not await _wait_gone(process, pgid, self.grace):
            log.info(
                "SGLang worker %d did not stop within %g s of SIGTERM: SIGKILL", w.index, self.grace
            )
            _signal_group(pgid, signal.SIGKILL)
            if w.container is not None:
                await self._kill_container(w.container)
            if not await _wait_gone(process, pgid, KILL_TIMEOUT):
                log.warning("SGLang worker %d: process group %d outlived SIGKILL", w.index, pgid)
        w.process = w.pgid = None
        w.container = None
        w.ready = False

    @staticmethod
    async def _kill_container(name: str) -> None:
        # SIGKILL to `docker run` cannot be forwarded: the container itself must be killed.
        with contextlib.suppress(OSError):
            await anyio.run_process(["docker", "kill", name], check=False)

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
