"""SGLang stand-in: a real process that takes SGLang's command line and answers like its server.

SGLang's server needs CUDA, so tests run llmroute's launcher against this stand-in. Put
:func:`sglang_standin_path` first on ``PYTHONPATH`` and the fake ``sglang`` package there offers
the real entry points (an emulated version comes from ``SGLANG_STANDIN_VERSION``, default 0.5.5)::

    python -c "import sglang; print(sglang.__version__)"   the version; imports nothing else
    python -m sglang.launch_server FLAGS                   the server, on every version
    python -m sglang.cli.main serve FLAGS                  the server from 0.5.5 on; before, no
                                                           sglang.cli (ModuleNotFoundError, exit 1)

Flags are parsed with argparse as SGLang does: an unknown flag exits 2 with argparse's error, and
``--help`` lists exactly the flags of the emulated version (:func:`supported_flags`). Knobs of the
stand-in itself come from ``SGLANG_STANDIN_*`` variables (:class:`StandInKnobs`), so the command
line stays SGLang's. The server logs SGLang-like lines to stderr: ``server_args=ServerArgs(...)``
first, ``The server is fired up and ready to roll!`` once warm.

HTTP/1.1 on ``--host``/``--port``: ``/health``, ``/health_generate`` (503 until the warm-up ends),
``/get_model_info``, ``/get_server_info`` (``/get_server_args`` before 0.4.0; the api key is never
shown), ``/flush_cache``, ``/v1/models`` (200 at once, even during warm-up, which is why a
launcher must wait on ``/health_generate``), ``/v1/models/{id}``, ``/v1/chat/completions`` and,
with ``--enable-metrics``, ``/metrics``. Chat requests queue behind ``--max-running-requests``
(default 8) and are served only once warm; ``--schedule-policy lpm`` admits the queued request
with the longest cached prefix first, other policies in arrival order (``random`` at random).

Prefix cache: each process keeps an LRU of 16-token blocks of the prompts it has prefilled (the
prompt is the messages rendered as ``<|im_start|> role words... <|im_end|>`` plus the generation
prompt; one word is one token), or of ``--page-size`` tokens when that is above 1 (SGLang's paged
radix cache matches whole pages). A request's cached tokens are its longest run of leading blocks
already seen (at least one token is always computed); the whole conversation, reply included, is
cached once it finishes, so the next turn hits. TTFT = queue wait + ``SGLANG_STANDIN_TTFT`` +
``SGLANG_STANDIN_PREFILL_MS_PER_1K`` x uncached tokens / 1000. ``--disable-radix-cache`` turns it
off; ``--max-total-tokens`` overrides the capacity (``SGLANG_STANDIN_CACHE_TOKENS``). A stream
sends ``--stream-interval`` tokens an event (one by default, as SGLang).

Data parallelism: with ``--dp-size N`` the server runs N ranks, each with its own queue, slots
and prefix cache; chat requests are dealt to them in turn (SGLang's default
``--load-balance-method round_robin``), and ``/metrics`` shows each rank's scheduler gauges with
a ``dp_rank`` label, the tokenizer's counters and histograms once for the whole server.

Faults: the simulator's ``x-sim-fault`` header (see :mod:`llmroute.testing`): ``429``, ``500``,
``503``, ``html502``, ``drop:K``, ``hang``, ``malformed:K``, ``slow:SECONDS`` (replaces the
TTFT after the queue), ``stall-between:K:SECS`` and ``stream-error:K``, which sends SGLang's
in-stream error ``data: {"error": {"object": "error", "message": ..., "type": "BadRequestError",
"param": null, "code": 400}}`` and then ``data: [DONE]``. ``x-sim-fault-times`` works as there.

What the real SGLang does, from its released wheels (0.3.0, 0.3.6, 0.4.0, 0.5.4, 0.5.5, 0.5.23):

- ``sglang serve`` (``sglang/cli/main.py``, console script ``sglang = sglang.cli.main:main``)
  first shipped in 0.5.5 (PyPI, 2025-11-06; added by sgl-project/sglang#12484); 0.5.4 has no
  ``sglang.cli``. Its ``main.py`` has no ``__main__`` guard (still so in 0.5.23; the fix
  sgl-project/sglang#22069 was closed), so ``python -m sglang.cli.main serve`` silently does
  nothing and exits 0 on a real install: run the ``sglang`` script or
  ``python -c "from sglang.cli.main import main; main()" serve ...`` instead.
  ``SGLANG_STANDIN_CLI_MAIN_GUARD=0`` reproduces the real no-op.
- ``--enable-metrics`` and ``--enable-cache-report`` are absent in 0.3.0 and present in 0.3.6;
  ``--model`` (alias of ``--model-path``) and the ``lof``/``priority`` policies appear by 0.5.4,
  where the default ``--schedule-policy`` changed from ``lpm`` to ``fcfs``. ``--tp`` is no alias:
  argparse's prefix matching takes it for ``--tp-size``.
- ``/health`` answered 200 always until sgl-project/sglang#8444 (2025-07-28) made it the same
  handler as ``/health_generate``: 503 while starting or shutting down (0.5.x here).
- With ``--api-key``, every path needs ``Authorization: Bearer <key>`` (else 401
  ``{"error": "Unauthorized"}``) except ``/health*`` and, from 0.5 on, ``/metrics``. The real
  ``/get_server_info`` and the ``server_args=`` log line both show the key in clear (the
  stand-in logs it too, so a launcher can test that it redacts quoted log lines).
- ``usage.prompt_tokens_details`` is ``{"cached_tokens": N}`` only with ``--enable-cache-report``
  and N > 0; otherwise it is null. The response's ``model`` echoes the request's.
- ``/metrics`` (prometheus_client text): gauges ``sglang:num_running_reqs``,
  ``sglang:num_used_tokens``, ``sglang:token_usage``, ``sglang:gen_throughput``,
  ``sglang:num_queue_reqs``, ``sglang:cache_hit_rate``; counters ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total`` (0.5: also ``cached_tokens_total``,
  ``num_requests_total``, ``num_aborted_requests_total``); histograms
  ``sglang:time_to_first_token_seconds``, ``sglang:e2e_request_latency_seconds`` and, from 0.5,
  ``sglang:queue_time_seconds`` and ``sglang:inter_token_latency_seconds`` (before:
  ``time_per_output_token_seconds``). Labels: ``model_name`` (the served name); from 0.5 the
  scheduler's series also carry ``engine_type="unified"``, ``tp_rank``, ``pp_rank``.
  ``cache_hit_rate`` is windowed, as in SGLang: the hit rate of the latest prefill (SGLang: of
  the latest prefill batch); ``cached_tokens_total / prompt_tokens_total`` is the cumulative one.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import llmroute.testing._server as _server

from ._sglang_app import _HANG_MAX, _LOG, DataParallelApp, SGLangApp
from ._sglang_prefix import PrefixCache, prompt_token_list
from ._sglang_settings import (
    _SERVE_USAGE,
    SERVE_CLI_SINCE,
    StandInKnobs,
    build_parser,
    parse_version,
    supported_flags,
)
from ._wire import pause

if TYPE_CHECKING:
    from ._app import SimApp

__all__ = [
    "SERVE_CLI_SINCE",
    "SGLANG_STANDIN_PATH",
    "PrefixCache",
    "StandInKnobs",
    "group_alive",
    "parse_version",
    "prompt_token_list",
    "sglang_standin_path",
    "supported_flags",
]

SGLANG_STANDIN_PATH = str(Path(__file__).resolve().parent / "sglang_standin")


def sglang_standin_path() -> str:
    """Absolute path of the directory holding the fake ``sglang`` package (for PYTHONPATH)."""
    return SGLANG_STANDIN_PATH


# -- the process -------------------------------------------------------------------------------
_CHILD_CODE = """\
import os, signal, time
if os.environ.get("SGLANG_STANDIN_IGNORE_SIGTERM", "").lower() in ("1", "true", "yes"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
parent = os.getppid()
while os.getppid() == parent:
    time.sleep(0.2)
"""
_OOM_TRACEBACK = """\
Scheduler hit an exception: Traceback (most recent call last):
  File "sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "sglang/srt/model_executor/model_runner.py", line 1530, in init_memory_pool
    self.req_to_token_pool = ReqToTokenPool(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.19 GiB of which 1.06 GiB is free. (simulated by SGLANG_STANDIN_EXIT_AFTER)
"""


_GRANDCHILD_CODE = """\
import os, signal, sys, time
if os.fork() > 0:
    os._exit(0)  # the intermediate: the grandchild is reparented at once
signal.signal(signal.SIGHUP, signal.SIG_IGN)
if os.environ.get("SGLANG_STANDIN_IGNORE_SIGTERM", "").lower() in ("1", "true", "yes"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    time.sleep(0.2)
"""


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes a child get SIGKILL when its parent dies (Linux only)."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform.startswith("linux") else None
    if prctl is None:
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGKILL)


def _spawn_children(count: int) -> list[subprocess.Popen[bytes]]:
    """Child processes in the server's process group that end when it does."""
    names = ["sglang::scheduler_TP0", "sglang::detokenizer"]
    names += [f"sglang::scheduler_TP{i}" for i in range(1, max(0, count - 1))]
    preexec = _parent_death_signal()
    return [
        subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD_CODE, name],
            stdin=subprocess.DEVNULL,
            preexec_fn=preexec,
        )
        for name in names[:count]
    ]


def _spawn_grandchild() -> None:
    """Start ``sglang::grandchild`` (see :attr:`StandInKnobs.grandchild`) and reap the
    intermediate process, so only the grandchild is left, untracked."""
    intermediate = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _GRANDCHILD_CODE, "sglang::grandchild", str(_HANG_MAX)],
        stdin=subprocess.DEVNULL,
    )
    intermediate.wait(10)


def _stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    """Kill and reap them (an unreaped child would stay a zombie of the group)."""
    for child in children:
        if child.poll() is None:
            child.kill()
    for child in children:
        child.wait(10)


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running. Zombies do not count: where PID 1
    reaps no orphans (as in some containers) a killed group's children stay zombies, and
    ``os.killpg(pgid, 0)`` still succeeds for them."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process just went away
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _configure_logging(level: str) -> logging.Logger:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    return _LOG


def _server_args(ns: argparse.Namespace) -> dict[str, Any]:
    args = vars(ns)
    args["tokenizer_path"] = args.get("tokenizer_path") or args["model_path"]
    args["served_model_name"] = args.get("served_model_name") or args["model_path"]
    return args


def main(argv: Sequence[str], *, entry: str, version: str) -> int:
    """Run the stand-in server: ``entry`` is "launch_server" or "serve" (``sglang serve``)."""
    parsed = parse_version(version)
    if entry == "serve" and ("-h" in argv or "--help" in argv):
        print(_SERVE_USAGE)
        build_parser(parsed).print_help()
        return 0
    ns = build_parser(parsed).parse_args(list(argv))  # exits 2 on a bad flag, 0 on --help
    args = _server_args(ns)
    knobs = StandInKnobs.from_env(os.environ)
    log = _configure_logging(args["log_level"])
    log.info("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")
    if knobs.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = _spawn_children(knobs.children)
    if knobs.grandchild:
        _spawn_grandchild()
    try:
        return asyncio.run(_serve(args, version, knobs, children, log))
    finally:
        _stop_children(children)


async def _serve(
    args: dict[str, Any],
    version: str,
    knobs: StandInKnobs,
    children: list[subprocess.Popen[bytes]],
    log: logging.Logger,
) -> int:
    loop = asyncio.get_running_loop()
    app: SGLangApp | DataParallelApp = SGLangApp(args, version, knobs, log)
    if int(args.get("dp_size") or 1) > 1:
        app = DataParallelApp(args, version, knobs, log)
    asgi = cast("SimApp", app)  # _server's helpers need only an ASGI app with close()
    shutdown = asyncio.Event()

    def on_signal(name: str) -> None:
        if app.draining:
            return
        log.info(f"Received {name}. Draining requests for {knobs.drain:g}s, then exiting.")
        app.draining = True
        loop.call_later(knobs.drain, _server._begin_shutdown, asgi, shutdown)

    if knobs.ignore_sigterm:
        loop.add_signal_handler(
            signal.SIGTERM, log.warning, "Received SIGTERM: ignored (SGLANG_STANDIN_IGNORE_SIGTERM)"
        )
    else:
        loop.add_signal_handler(signal.SIGTERM, on_signal, "SIGTERM")
    loop.add_signal_handler(signal.SIGINT, on_signal, "SIGINT")
    if await _load(args, knobs, log, shutdown):
        return 0
    try:
        sock = _server._listen(args["host"], args["port"])
    except OSError as exc:
        log.error(f"Failed to bind {args['host']}:{args['port']}: {exc}")
        return 1
    log.info(
        f"max_total_num_tokens={app.capacity}, max_running_requests={app.max_running}, "
        f"context_len={args.get('context_length') or 32768}"
    )
    log.info(f"Uvicorn running on http://{args['host']}:{args['port']} (Press CTRL+C to quit)")

    background = [asyncio.ensure_future(_warm_up(app, knobs, log))]
    if knobs.exit_after is not None or knobs.exit_file is not None:
        background.append(asyncio.ensure_future(_crash(knobs, log, children)))
    try:
        await _server._serve(asgi, sock, tls=False, http2=False, shutdown=shutdown)
    finally:
        for task in background:
            task.cancel()
    log.info("Shutdown complete.")
    return 0


async def _load(
    args: dict[str, Any], knobs: StandInKnobs, log: logging.Logger, shutdown: asyncio.Event
) -> bool:
    """Log the weights' loading and the CUDA graphs' capture, taking ``knobs.load`` seconds;
    True when a signal ended it (the server then exits 0 without binding its port)."""
    # As SGLang: the schedulers load the weights and capture CUDA graphs, and only then does
    # the HTTP server bind its port (a server that took the port meanwhile answers instead).
    log.info("Load weight begin. avail mem=78.50 GB")
    if await pause(knobs.load * 0.7, shutdown):
        return True
    log.info(
        f"Load weight end. type=StandIn, dtype=torch.bfloat16, avail mem=63.20 GB, "
        f"mem usage=15.30 GB. model={args['model_path']}"
    )
    if not args.get("disable_cuda_graph"):
        log.info("Capture cuda graph begin. This can take up to several minutes. avail mem=9.8 GB")
        if await pause(knobs.load * 0.3, shutdown):
            return True
        log.info(
            f"Capture cuda graph end. Time elapsed: {knobs.load * 0.3:.2f} s. mem usage=0.5 GB"
        )
    return False


async def _until_exists(path: str) -> None:
    for _ in range(15_000):  # at most 300 s, as the grandchild's safety net
        if os.path.exists(path):  # noqa: ASYNC240 - a stat, in a test server
            return
        await asyncio.sleep(0.02)


async def _warm_up(
    app: SGLangApp | DataParallelApp, knobs: StandInKnobs, log: logging.Logger
) -> None:
    if knobs.warm_file is None:
        await asyncio.sleep(knobs.warmup)
    else:
        await _until_exists(knobs.warm_file)
    app.set_warm()
    log.info("The server is fired up and ready to roll!")


async def _crash(
    knobs: StandInKnobs, log: logging.Logger, children: list[subprocess.Popen[bytes]]
) -> None:
    if knobs.exit_file is not None:
        await _until_exists(knobs.exit_file)
    else:
        assert knobs.exit_after is not None
        await asyncio.sleep(knobs.exit_after)
    log.error(_OOM_TRACEBACK.rstrip())
    log.error("Received sigquit from a child process. It usually means the child failed.")
    _stop_children(children)
    logging.shutdown()
    os._exit(1)
