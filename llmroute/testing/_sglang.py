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
import bisect
import ctypes
import dataclasses
import itertools
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import llmroute.testing._reply as _reply
import llmroute.testing._server as _server

from ._app import _Reply
from ._wire import STATUS_FAULTS, Fault, pause, read_body, status_fault, watch_disconnect

if TYPE_CHECKING:
    from ._app import SimApp

__all__ = [
    "SERVE_CLI_SINCE",
    "SGLANG_STANDIN_PATH",
    "StandInKnobs",
    "group_alive",
    "parse_version",
    "sglang_standin_path",
    "supported_flags",
]

SGLANG_STANDIN_PATH = str(Path(__file__).resolve().parent / "sglang_standin")

Version = tuple[int, ...]
SERVE_CLI_SINCE: Version = (0, 5, 5)
"""First SGLang release with ``sglang serve`` (module ``sglang.cli.main``)."""

DEFAULT_MAX_RUNNING = 8
BLOCK_TOKENS = 16
"""Tokens per prefix-cache block unless ``--page-size`` is above 1 (SGLang's default page is one
token; 16 keeps the stand-in's cache small and fast)."""
_V036, _V040, _V050, _V054 = (0, 3, 6), (0, 4, 0), (0, 5, 0), (0, 5, 4)
_EOS_TOKEN_ID = 151645  # Qwen2.5's <|im_end|>: SGLang reports the matched stop token's id
_HANG_MAX = 300.0
_LOG = logging.getLogger("sglang.srt")


def sglang_standin_path() -> str:
    """Absolute path of the directory holding the fake ``sglang`` package (for PYTHONPATH)."""
    return SGLANG_STANDIN_PATH


def parse_version(text: str) -> Version:
    """``"0.5.5.post3"`` -> ``(0, 5, 5)``; only leading numbers count."""
    return tuple(int(m) for m in re.findall(r"^\d+|(?<=\.)\d+", text)[:3])


# -- the stand-in's own knobs ------------------------------------------------------------------
@dataclass(frozen=True)
class StandInKnobs:
    """The stand-in's behaviour, read from ``SGLANG_STANDIN_<FIELD NAME IN CAPITALS>``."""

    load: float = 0.0
    """Seconds of loading before the port is bound, as SGLang loads the weights (70%) and
    captures CUDA graphs (30%; none with ``--disable-cuda-graph``) before its HTTP server
    listens, each phase logged with SGLang's lines."""
    warmup: float = 0.5
    """Seconds after the port is bound during which ``/health_generate`` answers 503."""
    warm_file: str | None = None
    """Instead of ``warmup``: the warm-up ends once this file exists, so a test decides when."""
    ttft: float = 0.02
    """Base time to first token in seconds (after any queue wait)."""
    prefill_ms_per_1k: float = 40.0
    """Extra TTFT in milliseconds per 1000 uncached prompt tokens."""
    inter_token: float = 0.002
    """Seconds between tokens."""
    reply_tokens: int = 16
    """Length of a full reply in tokens."""
    exit_after: float | None = None
    """Log a CUDA out-of-memory traceback and exit 1 this many seconds after start."""
    exit_file: str | None = None
    """Instead of ``exit_after``: crash that way once this file exists, so a test decides when."""
    ignore_sigterm: bool = False
    """Ignore SIGTERM (the server and its children), so only SIGKILL ends it."""
    children: int = 1
    """Child processes that just sleep, like SGLang's scheduler and detokenizer. They die with
    the server (PDEATHSIG), so killing the server alone ends them too."""
    grandchild: bool = False
    """Also start ``sglang::grandchild``, a descendant in the server's process group that does
    not die with it: its parent exits at once (it is an orphan from the start), it has no
    PDEATHSIG, ignores SIGHUP, and the server neither tracks nor stops it. Only a signal to the
    group (or to its pid) ends it, as with helpers a real server's workers may leave behind; it
    ignores SIGTERM too under ``ignore_sigterm``. A safety net ends it after 300 s."""
    drain: float = 0.1
    """Seconds from SIGTERM until the server stops serving and exits."""
    cache_tokens: int = 200_000
    """Capacity of the prefix cache in tokens (``--max-total-tokens`` overrides it)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StandInKnobs:
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(f"SGLANG_STANDIN_{field.name.upper()}", "")
            if not raw:
                continue
            if isinstance(field.default, bool):
                values[field.name] = raw.lower() in ("1", "true", "yes")
            elif field.name in ("reply_tokens", "children", "cache_tokens"):
                values[field.name] = int(raw)
            elif field.name in ("warm_file", "exit_file"):
                values[field.name] = raw
            else:
                values[field.name] = float(raw)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The variables that reproduce these knobs (fields left at None are omitted)."""
        env: dict[str, str] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                text = ("1" if value else "0") if isinstance(value, bool) else str(value)
                env[f"SGLANG_STANDIN_{field.name.upper()}"] = text
        return env


# -- command line ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Flag:
    name: str
    help: str
    kind: Callable[[str], Any] | None = str  # None: a store_true switch
    default: Any = None
    since: Version = (0, 3, 0)
    until: Version | None = None  # the first version without it
    aliases: tuple[tuple[str, Version], ...] = ()
    choices: tuple[tuple[str, Version], ...] = ()
    later_default: tuple[Version, Any] | None = None
    dest: str = ""
    required: bool = False

    def available(self, version: Version) -> bool:
        return self.since <= version and (self.until is None or version < self.until)

    def add_to(self, parser: argparse.ArgumentParser, version: Version) -> None:
        names = [self.name, *(alias for alias, since in self.aliases if version >= since)]
        dest = self.dest or self.name[2:].replace("-", "_")
        if self.kind is None:
            parser.add_argument(*names, dest=dest, action="store_true", help=self.help)
            return
        default = self.default
        if self.later_default is not None and version >= self.later_default[0]:
            default = self.later_default[1]
        choices = [choice for choice, since in self.choices if version >= since] or None
        parser.add_argument(
            *names,
            dest=dest,
            type=self.kind,
            default=default,
            choices=choices,
            required=self.required,
            help=self.help,
        )


def _switch(name: str, help: str, since: Version = (0, 3, 0), **kw: Any) -> _Flag:
    return _Flag(name, help, kind=None, default=False, since=since, **kw)


_ALWAYS: Version = (0, 3, 0)
_FLAGS: tuple[_Flag, ...] = (
    _Flag(
        "--model-path",
        "Path of the model weights: a local folder or a Hugging Face repo id.",
        aliases=(("--model", _V054),),
        required=True,
    ),
    _Flag("--tokenizer-path", "Path of the tokenizer (default: the model path)."),
    _Flag("--revision", "Model revision (branch, tag or commit).", since=_V040),
    _Flag("--host", "Host of the HTTP server.", default="127.0.0.1"),
    _Flag("--port", "Port of the HTTP server.", kind=int, default=30000),
    _Flag(
        "--tokenizer-mode",
        "Tokenizer mode.",
        default="auto",
        choices=(("auto", _ALWAYS), ("slow", _ALWAYS)),
    ),
    _switch("--skip-tokenizer-init", "Take token ids as input and return token ids."),
    _Flag("--load-format", "Format of the model weights.", default="auto"),
    _Flag(
        "--dtype",
        "Data type of the weights and activations.",
        default="auto",
        choices=tuple(
            (c, _ALWAYS) for c in ("auto", "half", "float16", "bfloat16", "float", "float32")
        ),
    ),
    _Flag("--kv-cache-dtype", "Data type of the KV cache.", default="auto"),
    _switch("--trust-remote-code", "Allow custom model code from the Hub."),
    _switch("--is-embedding", "Serve an embedding model."),
    _Flag("--context-length", "The model's maximum context length.", kind=int),
    _Flag("--quantization", "Quantization method."),
    _Flag("--served-model-name", "Model name returned by /v1/models (default: the model path)."),
    _Flag("--chat-template", "Chat template name or path."),
    _Flag("--device", "Device type (cuda, cpu, ...).", since=_V036),
    _Flag("--mem-fraction-static", "Fraction of GPU memory for weights and KV cache.", float),
    _Flag("--max-running-requests", "Maximum number of running requests.", int),
    _Flag("--max-queued-requests", "Maximum number of queued requests.", int, since=_V054),
    _Flag("--max-total-tokens", "Maximum number of tokens in the KV cache pool.", int),
    _Flag("--chunked-prefill-size", "Tokens per chunk of a chunked prefill (-1: off).", int),
    _Flag("--max-prefill-tokens", "Maximum tokens in one prefill batch.", int, default=16384),
    _Flag(
        "--schedule-policy",
        "Scheduling policy of the queued requests.",
        default="lpm",
        choices=(
            *((c, _ALWAYS) for c in ("lpm", "random", "fcfs", "dfs-weight")),
            ("lof", _V054),
            ("priority", _V054),
        ),
        later_default=(_V054, "fcfs"),
    ),
    _switch("--enable-priority-scheduling", "Schedule by request priority.", since=_V054),
    _Flag("--schedule-conservativeness", "How conservatively to schedule.", float, default=1.0),
    _Flag("--page-size", "Tokens per KV cache page.", int, default=1, since=_V054),
    _Flag(
        "--tensor-parallel-size",
        "Tensor parallelism size.",
        int,
        default=1,
        aliases=(("--tp-size", _ALWAYS),),
        dest="tp_size",
    ),
    _Flag(
        "--data-parallel-size",
        "Data parallelism size.",
        int,
        default=1,
        aliases=(("--dp-size", _ALWAYS),),
        dest="dp_size",
    ),
    _Flag("--stream-interval", "Tokens per streamed chunk.", int, default=1),
    _Flag("--random-seed", "Random seed.", int),
    _Flag(
        "--watchdog-timeout",
        "Seconds before a stuck batch kills the server.",
        float,
        300.0,
        since=_V036,
    ),
    _Flag("--download-dir", "Download directory of the model weights.", since=_V036),
    _Flag("--base-gpu-id", "First GPU id to use.", int, default=0, since=_V036),
    _Flag("--log-level", "Logging level of all loggers.", default="info"),
    _Flag("--log-level-http", "Logging level of the HTTP server."),
    _switch("--log-requests", "Log the inputs and outputs of all requests."),
    _switch("--show-time-cost", "Show the time cost of custom marks."),
    _switch("--enable-metrics", "Export Prometheus metrics on /metrics.", since=_V036),
    _Flag("--decode-log-interval", "Decode batches between log lines.", int, 40, since=_V036),
    _switch(
        "--enable-cache-report",
        "Return the number of cached prompt tokens in usage.prompt_tokens_details.",
        since=_V036,
    ),
    _switch(
        "--collect-tokens-histogram", "Collect prompt and generation token histograms.", since=_V054
    ),
    _Flag("--api-key", "API key of the server, also required by the OpenAI-compatible API."),
    _Flag(
        "--weight-version", "Version label of the loaded weights.", default="default", since=_V054
    ),
    _Flag("--preferred-sampling-params", "Default sampling parameters as JSON.", since=_V054),
    _Flag("--tool-call-parser", "Parser of tool calls in the model's output.", since=_V054),
    _Flag("--reasoning-parser", "Parser of reasoning content in the model's output.", since=_V054),
    _Flag("--dist-init-addr", "Address for distributed initialisation.", since=_V036),
    _Flag("--nnodes", "Number of nodes.", int, default=1),
    _Flag("--node-rank", "Rank of this node.", int, default=0),
    _Flag("--attention-backend", "Attention kernel backend.", since=_V036),
    _Flag("--sampling-backend", "Sampling kernel backend.", since=_V036),
    _Flag("--grammar-backend", "Grammar backend of constrained decoding.", since=_V036),
    _switch("--disable-radix-cache", "Disable RadixAttention prefix caching."),
    _switch("--enable-hierarchical-cache", "Extend the prefix cache to host memory.", since=_V054),
    _switch("--disable-cuda-graph", "Disable CUDA graphs."),
    _switch("--disable-cuda-graph-padding", "Disable CUDA graphs when padding is needed."),
    _Flag("--cuda-graph-max-bs", "Largest batch size captured by CUDA graphs.", int, since=_V036),
    _switch("--disable-custom-all-reduce", "Disable the custom all-reduce kernel."),
    _switch("--disable-flashinfer", "Disable FlashInfer kernels.", until=_V054),
    _switch("--disable-overlap-schedule", "Disable the overlap scheduler.", since=_V036),
    _switch("--enable-mixed-chunk", "Mix prefill and decode in one batch."),
    _switch("--enable-dp-attention", "Data parallelism for attention.", since=_V036),
    _switch("--enable-torch-compile", "Optimise the model with torch.compile."),
    _Flag("--torch-compile-max-bs", "Largest batch size for torch.compile.", int, 32, since=_V036),
    _switch("--enable-p2p-check", "Check P2P access between GPUs."),
    _Flag("--cpu-offload-gb", "GiB of weights to offload to CPU memory.", int, 0, since=_V040),
    _switch("--enable-lora", "Enable LoRA adapters.", since=_V054),
    _Flag(
        "--speculative-algorithm",
        "Speculative algorithm.",
        since=_V054,
        choices=tuple((c, _V054) for c in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")),
    ),
    _Flag(
        "--speculative-draft-model-path",
        "The path of the draft model weights (a local folder or a Hugging Face repo id).",
        since=_V054,
        aliases=(("--speculative-draft-model", _V054),),
    ),
    _Flag("--speculative-num-steps", "Draft steps before verification.", int, since=_V054),
    _Flag("--speculative-eagle-topk", "Tokens sampled per draft step.", int, since=_V054),
    _Flag("--speculative-num-draft-tokens", "Draft tokens verified at once.", int, since=_V054),
    _switch("--sleep-on-idle", "Reduce CPU use while idle.", since=_V054),
)


def build_parser(version: Version, prog: str | None = None) -> argparse.ArgumentParser:
    """SGLang's server argument parser, with the flags of `version`."""
    parser = argparse.ArgumentParser(prog=prog)
    for flag in _FLAGS:
        if flag.available(version):
            flag.add_to(parser, version)
    return parser


def supported_flags(version: str) -> list[str]:
    """Every option string (aliases included) the stand-in accepts for SGLang `version`."""
    parser = build_parser(parse_version(version))
    return sorted(
        option
        for action in parser._actions  # argparse has no public list of its actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    )


_SERVE_USAGE = """\
Usage: sglang serve --model-path <model-name-or-path> [additional-arguments]

This command can launch either a standard language model server or a diffusion model server.
The server type is determined by the model path.

--- Help for Standard Language Model Server ---"""


# -- the prefix cache --------------------------------------------------------------------------
def prompt_token_list(messages: Sequence[Any]) -> list[str]:
    """The prompt as tokens: each message as ``<|im_start|> role words... <|im_end|>``, then
    the generation prompt ``<|im_start|> assistant`` (one word is one token)."""
    tokens: list[str] = []
    for message in messages:
        if isinstance(message, dict):
            msg = cast("dict[str, Any]", message)
            role = str(msg.get("role", "user"))
            tokens += ["<|im_start|>", role, *_reply.message_text(msg).split(), "<|im_end|>"]
    return [*tokens, "<|im_start|>", "assistant"]


class PrefixCache:
    """An LRU of prompt-prefix blocks of BLOCK_TOKENS tokens, chained by hash (a block is only
    found after the blocks before it). A prefix is touched from its end to its start, so the
    ends of the least recent prefixes are evicted first, like the leaves of a radix tree."""

    def __init__(self, capacity_tokens: int, block: int = BLOCK_TOKENS) -> None:
        self.block = block
        self.capacity_blocks = max(1, capacity_tokens // block)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        """Tokens held."""
        return len(self._blocks) * self.block

    def _keys(self, tokens: Sequence[str]) -> Iterator[int]:
        key = 0
        for start in range(0, len(tokens) - self.block + 1, self.block):
            key = hash((key, *tokens[start : start + self.block]))
            yield key

    def match(self, tokens: Sequence[str], *, touch: bool = False) -> int:
        """Cached tokens of this prompt: its leading blocks already held (at most all but one
        token, which is always computed)."""
        hits: list[int] = []
        for key in self._keys(tokens):
            if key not in self._blocks:
                break
            hits.append(key)
        if touch:
            for key in reversed(hits):
                self._blocks.move_to_end(key)
        return min(len(hits) * self.block, max(0, len(tokens) - 1))

    def insert(self, tokens: Sequence[str]) -> None:
        for key in reversed(list(self._keys(tokens))):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


# -- metrics -----------------------------------------------------------------------------------
_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_E2E_BUCKETS = (*_TTFT_BUCKETS, 600, 1200, 1800, 2400)
_ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
    0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8,
)  # fmt: skip
_QUEUE_BUCKETS = (
    0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300,
    400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip


class _Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value


def _number(value: float) -> str:
    return repr(float(value)) if value != float("inf") else "+Inf"


def _labels(labels: Mapping[str, str]) -> str:
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


class _Exposition:
    """Prometheus text format 0.0.4, as prometheus_client writes it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def head(self, name: str, kind: str, help: str) -> None:
        self.lines += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]

    def value(self, name: str, kind: str, help: str, labels: Mapping[str, str], v: float) -> None:
        self.values(name, kind, help, [(labels, v)])

    def values(
        self, name: str, kind: str, help: str, samples: Sequence[tuple[Mapping[str, str], float]]
    ) -> None:
        self.head(name, kind, help)
        for labels, v in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(v)}")

    def histogram(self, name: str, help: str, labels: Mapping[str, str], h: _Histogram) -> None:
        self.head(name, "histogram", help)
        total = 0
        for bound, count in zip((*h.buckets, float("inf")), h.counts, strict=True):
            total += count
            bucket = _labels({**labels, "le": _number(bound)})
            self.lines.append(f"{name}_bucket{bucket} {_number(total)}")
        self.lines.append(f"{name}_count{_labels(labels)} {_number(total)}")
        self.lines.append(f"{name}_sum{_labels(labels)} {_number(h.sum)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class _Stats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    cache_hit_rate: float = 0.0
    ttft: _Histogram = dataclasses.field(default_factory=lambda: _Histogram(_TTFT_BUCKETS))
    itl: _Histogram = dataclasses.field(default_factory=lambda: _Histogram(_ITL_BUCKETS))
    e2e: _Histogram = dataclasses.field(default_factory=lambda: _Histogram(_E2E_BUCKETS))
    queue: _Histogram = dataclasses.field(default_factory=lambda: _Histogram(_QUEUE_BUCKETS))
    throughput_mark: tuple[float, int] = (0.0, 0)

    @staticmethod
    def merged(parts: Sequence[_Stats]) -> _Stats:
        """The counters and histograms of several data-parallel ranks, added up (the
        tokenizer, which keeps them in SGLang, sees every rank's requests)."""
        if len(parts) == 1:
            return parts[0]
        total = _Stats()
        for part in parts:
            for name in ("prompt_tokens", "generation_tokens", "cached_tokens", "requests"):
                setattr(total, name, getattr(total, name) + getattr(part, name))
            total.aborted += part.aborted
            for name in ("ttft", "itl", "e2e", "queue"):
                mine, theirs = getattr(total, name), getattr(part, name)
                mine.counts = [a + b for a, b in zip(mine.counts, theirs.counts, strict=True)]
                mine.sum += theirs.sum
        return total


_SCHEDULER_GAUGES = (
    ("num_running_reqs", "The number of running requests."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("cache_hit_rate", "The prefix cache hit rate."),
)


# -- the HTTP app ------------------------------------------------------------------------------
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]


@dataclass(eq=False)
class _Entry:
    """A chat request in the scheduler: queued, then running."""

    tokens: list[str]
    seq: int
    admitted: asyncio.Future[None]
    used_tokens: int = 0


def _error_body(message: str, status: int, type_: str = "BadRequestError") -> bytes:
    error = {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    return json.dumps(error).encode()


async def _send(
    send: Send, status: int, body: bytes = b"", content_type: bytes = b"application/json"
) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SGLangApp:
    """The ASGI app of one stand-in server (one "GPU worker" with its own prefix cache)."""

    def __init__(
        self,
        args: dict[str, Any],
        version: str,
        knobs: StandInKnobs,
        log: logging.Logger = _LOG,
        *,
        dp_rank: int | None = None,
    ) -> None:
        self.args = args
        self.dp_rank = dp_rank
        self.peers: list[SGLangApp] = [self]
        """Every data-parallel rank's app (itself alone without data parallelism): rank 0
        answers /metrics and /flush_cache for all of them."""
        self.version_text = version
        self.version = parse_version(version)
        self.knobs = knobs
        self.log = log
        self.model_name: str = args["served_model_name"]
        self.capacity: int = args.get("max_total_tokens") or knobs.cache_tokens
        page = args.get("page_size") or 1
        self.cache = PrefixCache(self.capacity, page if page > 1 else BLOCK_TOKENS)
        self.radix = not args.get("disable_radix_cache")
        self.max_running: int = args.get("max_running_requests") or DEFAULT_MAX_RUNNING
        self.warm = asyncio.Event()
        self.draining = False
        self.running: set[_Entry] = set()
        self.waiting: list[_Entry] = []
        self.stats = _Stats(throughput_mark=(time.monotonic(), 0))
        self._rng = random.Random(args.get("random_seed"))
        self._seq = itertools.count()
        self._gone: set[asyncio.Event] = set()
        self._fault_uses: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def set_warm(self) -> None:
        self.warm.set()
        self._dispatch()

    def close(self) -> None:
        """End queued, hanging and streaming handlers now (the server is shutting down)."""
        self.draining = True
        for event in list(self._gone):
            event.set()

    # -- scheduler ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        if not self.warm.is_set():
            return
        while self.waiting and len(self.running) < self.max_running:
            entry = self._pick()
            self.waiting.remove(entry)
            self.running.add(entry)
            entry.admitted.set_result(None)

    def _pick(self) -> _Entry:
        policy = self.args.get("schedule_policy")
        if policy == "lpm" and self.radix and len(self.waiting) > 1:
            return max(self.waiting, key=lambda e: (self.cache.match(e.tokens), -e.seq))
        if policy == "random":
            return self._rng.choice(self.waiting)
        return self.waiting[0]

    async def _admit(self, entry: _Entry, gone: asyncio.Event) -> bool:
        self.waiting.append(entry)
        self._dispatch()
        if not entry.admitted.done():
            leaving = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({entry.admitted, leaving}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # cancelled: give back the queue place or the slot
                if entry.admitted.done():
                    self._release(entry)
                else:
                    self.waiting.remove(entry)
                raise
            finally:
                leaving.cancel()
        if entry.admitted.done():
            return True
        self.waiting.remove(entry)
        return False

    def _release(self, entry: _Entry) -> None:
        self.running.discard(entry)
        self._dispatch()

    # -- ASGI entry -----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if body is None:
            return
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = self.args.get("api_key")
        if key and method != "OPTIONS" and not self._open_path(path):
            if headers.get("authorization") != f"Bearer {key}":
                await _send(send, 401, b'{"error":"Unauthorized"}')
                return
        await self._route(path, method, body, headers, receive, send)

    def _open_path(self, path: str) -> bool:
        """Paths that need no API key."""
        return path.startswith("/health") or (path.startswith("/metrics") and self.version >= _V050)

    async def _route(
        self,
        path: str,
        method: str,
        body: bytes,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
    ) -> None:
        gets: dict[str, Callable[[], Any]] = {
            "/health": self._health,
            "/health_generate": self._health_generate,
            "/get_model_info": self._model_info,
            "/v1/models": self._models,
            "/metrics": self._metrics,
        }
        gets["/get_server_info" if self.version >= _V040 else "/get_server_args"] = (
            self._server_info
        )
        if path == "/v1/chat/completions" and method == "POST":
            await self._chat(body, headers, receive, send)
        elif path == "/flush_cache" and (method == "POST" or self.version >= _V050):
            await self._flush_cache(send)
        elif path.startswith("/v1/models/") and method == "GET":
            await self._model_card(path.removeprefix("/v1/models/"), send)
        elif path in gets and method in ("GET", "HEAD"):
            status, payload, content_type = gets[path]()
            await _send(send, status, payload, content_type)
        elif path in gets or path == "/v1/chat/completions":
            await _send(send, 405, b'{"detail":"Method Not Allowed"}')
        else:
            await _send(send, 404, b'{"detail":"Not Found"}')

    # -- small endpoints ------------------------------------------------------------------------
    def _health(self) -> tuple[int, bytes, bytes]:
        if self.version >= _V050:
            return self._health_generate()
        return 200, b"", b""

    def _health_generate(self) -> tuple[int, bytes, bytes]:
        return (200 if self.warm.is_set() and not self.draining else 503), b"", b""

    def _json(self, obj: Any) -> tuple[int, bytes, bytes]:
        return 200, json.dumps(obj).encode(), b"application/json"

    def _model_info(self) -> tuple[int, bytes, bytes]:
        info: dict[str, Any] = {"model_path": self.args["model_path"]}
        if self.version >= _V036:
            info["tokenizer_path"] = self.args["tokenizer_path"]
        info["is_generation"] = True
        if self.version >= _V054:
            info["preferred_sampling_params"] = self.args.get("preferred_sampling_params")
            info["weight_version"] = self.args.get("weight_version", "default")
        return self._json(info)

    def _server_info(self) -> tuple[int, bytes, bytes]:
        info: dict[str, Any] = {**self.args, "api_key": None}
        if self.version < _V040:
            return self._json(info)
        info["max_total_num_tokens"] = self.capacity
        info["max_req_input_len"] = self.capacity - 1
        if self.version >= _V050:
            info["internal_states"] = [{"last_gen_throughput": self._throughput(peek=True)}]
        info["version"] = self.version_text
        return self._json(info)

    def _card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.args.get("context_length") or 32768,
        }

    def _models(self) -> tuple[int, bytes, bytes]:
        return self._json({"object": "list", "data": [self._card()]})

    async def _model_card(self, model: str, send: Send) -> None:
        if model == self.model_name:
            await _send(send, 200, json.dumps(self._card()).encode())
            return
        error = {
            "message": f"The model '{model}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        await _send(send, 404, json.dumps({"error": error}).encode())

    async def _flush_cache(self, send: Send) -> None:
        idle = all(not peer.running and not peer.waiting for peer in self.peers)
        if idle:
            for peer in self.peers:
                peer.cache.clear()
        text = (
            b"Cache flushed.\nPlease check backend logs for more details. (When there are "
            b"running or waiting requests, the operation will not be performed.)\n"
        )
        await _send(send, 200 if idle else 400, text, b"text/plain; charset=utf-8")

    # -- metrics --------------------------------------------------------------------------------
    def _throughput(self, *, peek: bool = False) -> float:
        now, total = time.monotonic(), self.stats.generation_tokens
        then, before = self.stats.throughput_mark
        if not peek:
            self.stats.throughput_mark = (now, total)
        return (total - before) / (now - then) if now > then else 0.0

    def _metrics(self) -> tuple[int, bytes, bytes]:
        if not self.args.get("enable_metrics"):
            return 404, b'{"detail":"Not Found"}', b"application/json"
        text = self.metrics_text().encode()
        return 200, text, b"text/plain; version=0.0.4; charset=utf-8"

    def metrics_text(self) -> str:
        """The /metrics page: SGLang's names, types and labels for this version."""
        new, s = self.version >= _V050, _Stats.merged([peer.stats for peer in self.peers])
        model = {"model_name": self.model_name}
        sched = model
        if new:
            sched = {"engine_type": "unified", **model, "pp_rank": "0", "tp_rank": "0"}
        # One scheduler per data-parallel rank, each with its gauges (labelled dp_rank).
        gauges: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
            (name, help, []) for name, help in _SCHEDULER_GAUGES
        ]
        for peer in self.peers:
            labels = sched if peer.dp_rank is None else {**sched, "dp_rank": str(peer.dp_rank)}
            used = sum(entry.used_tokens for entry in peer.running)
            values = (
                len(peer.running),
                used,
                used / peer.capacity,
                peer._throughput(),
                len(peer.waiting),
                peer.stats.cache_hit_rate,
            )
            for (_, _, samples), value in zip(gauges, values, strict=True):
                samples.append((labels, value))
        counters = [
            ("prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens),
            (
                "generation_tokens_total",
                "Number of generation tokens processed.",
                s.generation_tokens,
            ),
        ]
        if new:
            counters += [
                ("cached_tokens_total", "Number of cached prompt tokens.", s.cached_tokens),
                ("num_requests_total", "Number of requests processed.", s.requests),
                ("num_aborted_requests_total", "Number of requests aborted.", s.aborted),
            ]
        itl = ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")
        if not new:
            itl = (
                "time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
            )
        histograms = [
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
            (*itl, s.itl),
            (
                "e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                s.e2e,
            ),
        ]
        out = _Exposition()
        for name, help, samples in gauges:
            out.values(f"sglang:{name}", "gauge", help, samples)
        if new:
            help = "Histogram of queueing time in seconds."
            out.histogram("sglang:queue_time_seconds", help, sched, s.queue)
        for name, help, value in counters:
            out.value(f"sglang:{name}", "counter", help, model, value)
        for name, help, histogram in histograms:
            out.histogram(f"sglang:{name}", help, model, histogram)
        return out.text()

    # -- chat completions -----------------------------------------------------------------------
    def _fault(self, headers: dict[str, str]) -> Fault:
        spec = headers.get("x-sim-fault")
        if not spec:
            return Fault()
        fault = Fault.parse(spec)
        if "x-sim-fault-times" in headers:
            key = headers.get("x-sim-fault-key", spec)
            used = self._fault_uses.get(key, 0)
            self._fault_uses[key] = used + 1
            if used >= int(headers["x-sim-fault-times"]):
                return Fault()
        return fault

    async def _chat(
        self, body: bytes, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        req: dict[str, Any] = {}
        fault, retry_after = Fault(), 1.0
        try:
            parsed = json.loads(body)
            problem = _check_chat(parsed)
            if problem is None:
                req = cast("dict[str, Any]", parsed)
                fault = self._fault(headers)
                retry_after = float(headers.get("x-sim-retry-after", "1"))
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            await _send(send, 400, _error_body(problem, 400))
            return
        if fault.kind in STATUS_FAULTS:
            await status_fault(send, fault.kind, retry_after, "req_" + uuid.uuid4().hex[:24])
            return
        limit = self.args.get("max_queued_requests")
        if limit is not None and len(self.waiting) >= limit:
            msg = "The request queue is full."
            await _send(send, 503, _error_body(msg, 503, "Service Unavailable"))
            return
        loop = asyncio.get_running_loop()
        entry = _Entry(prompt_token_list(req["messages"]), next(self._seq), loop.create_future())
        gone = asyncio.Event()
        self._gone.add(gone)
        watcher = asyncio.ensure_future(watch_disconnect(receive, gone))
        try:
            await _Generation(self, req, entry, fault, gone, send).run()
        finally:
            watcher.cancel()
            self._gone.discard(gone)


class DataParallelApp:
    """A server with ``--dp-size N``: N ranks, each its own scheduler and prefix cache; chat
    requests go to them in turn (SGLang's default ``--load-balance-method round_robin``), every
    other path to rank 0, whose /metrics shows each rank's gauges with a ``dp_rank`` label."""

    def __init__(
        self, args: dict[str, Any], version: str, knobs: StandInKnobs, log: logging.Logger
    ) -> None:
        size = int(args.get("dp_size") or 1)
        self.ranks = [SGLangApp(args, version, knobs, log, dp_rank=i) for i in range(size)]
        for rank in self.ranks:
            rank.peers = self.ranks
        self._turn = itertools.count()
        self.capacity = self.ranks[0].capacity
        self.max_running = self.ranks[0].max_running

    @property
    def draining(self) -> bool:
        return self.ranks[0].draining

    @draining.setter
    def draining(self, value: bool) -> None:
        for rank in self.ranks:
            rank.draining = value

    def set_warm(self) -> None:
        for rank in self.ranks:
            rank.set_warm()

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rank = self.ranks[0]
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            rank = self.ranks[next(self._turn) % len(self.ranks)]
        await rank(scope, receive, send)


def _check_chat(req: Any) -> str | None:
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    body = cast("dict[str, Any]", req)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: a non-empty list of messages is required"
    if body.get("n") not in (None, 1):
        return "the llmroute stand-in supports only n=1"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            return f"{key} must be a positive integer"
    return None


class _Generation:
    """One chat completion: queue, prefill (TTFT), decode, streamed or as one JSON body."""

    def __init__(
        self,
        app: SGLangApp,
        req: dict[str, Any],
        entry: _Entry,
        fault: Fault,
        gone: asyncio.Event,
        send: Send,
    ) -> None:
        self.app, self.req, self.entry, self.fault, self.gone = app, req, entry, fault, gone
        self.send = send
        self.model: str = req.get("model") or "default"
        self.plan = _Reply.build(
            {**req, "tools": None}, self.model, req["messages"], app.knobs.reply_tokens
        )
        self.rid = uuid.uuid4().hex
        self.stream = bool(req.get("stream"))
        self.include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.arrival = time.monotonic()
        self.cached = 0
        self.sent = 0

    async def run(self) -> None:
        app, stats = self.app, self.app.stats
        if self.stream:
            headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
            await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        if not await app._admit(self.entry, self.gone):
            stats.aborted += 1
            return
        try:
            finished = await self._generate()
        finally:
            app._release(self.entry)
            stats.requests += 1
        if not finished:
            stats.aborted += 1
        else:
            stats.e2e.observe(time.monotonic() - self.arrival)

    async def _prefill(self) -> bool:
        app, stats, tokens = self.app, self.app.stats, self.entry.tokens
        stats.queue.observe(time.monotonic() - self.arrival)
        self.cached = app.cache.match(tokens, touch=True) if app.radix else 0
        uncached = len(tokens) - self.cached
        stats.prompt_tokens += len(tokens)
        stats.cached_tokens += self.cached
        stats.cache_hit_rate = self.cached / len(tokens)
        self.entry.used_tokens = len(tokens)
        usage = sum(e.used_tokens for e in app.running) / app.capacity
        app.log.info(
            f"Prefill batch. #new-seq: 1, #new-token: {uncached}, #cached-token: {self.cached}, "
            f"token usage: {usage:.2f}, #running-req: {len(app.running) - 1}, "
            f"#queue-req: {len(app.waiting)}"
        )
        delay = self.fault.slow
        if delay is None:
            delay = app.knobs.ttft + app.knobs.prefill_ms_per_1k * uncached / 1e6
        if self.fault.kind == "hang":
            delay = _HANG_MAX
        if await pause(delay, self.gone) or self.fault.kind == "hang":
            return False
        if app.radix:
            app.cache.insert(tokens)
        stats.ttft.observe(time.monotonic() - self.arrival)
        return True

    def _token_sent(self, last: float) -> float:
        now = time.monotonic()
        if self.sent:
            self.app.stats.itl.observe(now - last)
        self.sent += 1
        self.entry.used_tokens += 1
        self.app.stats.generation_tokens += 1
        return now

    def _finished(self) -> None:
        """Cache the whole conversation, reply included (the next turn starts with it)."""
        if self.app.radix:
            reply = "".join(self.plan.pieces[: self.sent]).split()
            self.app.cache.insert([*self.entry.tokens, *reply, "<|im_end|>"])

    def _usage(self) -> dict[str, Any]:
        prompt = len(self.entry.tokens)
        report = self.app.args.get("enable_cache_report") and self.cached > 0
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + self.sent,
            "completion_tokens": self.sent,
            "prompt_tokens_details": {"cached_tokens": self.cached} if report else None,
            "reasoning_tokens": 0,
        }

    def _matched_stop(self) -> int | None:
        return _EOS_TOKEN_ID if self.plan.finish == "stop" else None

    async def _generate(self) -> bool:
        if not await self._prefill():
            return False
        if self.stream:
            return await self._stream()
        return await self._complete()

    async def _complete(self) -> bool:
        pieces, fault, itl = self.plan.pieces, self.fault, self.app.knobs.inter_token
        last = self._token_sent(0.0)
        for i in range(1, len(pieces)):
            gap = fault.stall_seconds if i == fault.stall_after else itl
            if await pause(gap, self.gone):
                return False
            last = self._token_sent(last)
        if fault.kind == "stream-error":
            message = "The server had an error while processing your request (simulated)."
            await _send(self.send, 500, _error_body(message, 500, "InternalServerError"))
            return True
        message = {
            "role": "assistant",
            "content": "".join(pieces),
            "reasoning_content": None,
            "tool_calls": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": self.plan.finish,
            "matched_stop": self._matched_stop(),
        }
        response: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(),
        }
        if self.app.version >= _V054:
            response["metadata"] = {"weight_version": self.app.args.get("weight_version")}
        body = json.dumps(response).encode()
        if fault.kind == "malformed":
            body = b"{not json"
        if fault.kind == "drop":
            start = {"type": "http.response.start", "status": 200, "headers": []}
            await self.send(start)
            half = {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            await self.send(half)
            return False
        self._finished()
        await _send(self.send, 200, body)
        return True

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
            | delta,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": self._matched_stop() if finish else None,
        }
        return self._event([choice], None)

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        chunk = {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def _send_tokens(self, start: int, end: int, last: float) -> float:
        """Send the answer's tokens ``start`` to ``end`` as one event."""
        await self._emit(self._chunk({"content": "".join(self.plan.pieces[start:end])}))
        for _ in range(start, end):
            last = self._token_sent(last)
        return last

    async def _emit(self, data: bytes, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def _stream(self) -> bool:
        """Stream the answer, ``--stream-interval`` tokens an event (SGLang's default, one)."""
        pieces, fault, itl = self.plan.pieces, self.fault, self.app.knobs.inter_token
        interval = max(1, int(self.app.args.get("stream_interval") or 1))
        last, held, waited = 0.0, 0, 0.0  # tokens decoded but not sent yet, and their time
        await self._emit(self._chunk({"role": "assistant", "content": ""}))
        for i in range(len(pieces) + 1):
            if fault.kind in ("drop", "malformed", "stream-error") and i == min(
                fault.after, len(pieces)
            ):
                if held:  # the tokens before the fault go out first
                    if await pause(waited, self.gone):
                        return False
                    last, held, waited = await self._send_tokens(i - held, i, last), 0, 0.0
                if fault.kind == "drop":
                    return False  # no end of body: the connection is closed
                if fault.kind == "stream-error":
                    message = "The request was aborted by the server (simulated stream-error)."
                    error = {"error": json.loads(_error_body(message, 400))}
                    await self._emit(b"data: " + json.dumps(error).encode() + b"\n\n")
                    await self._emit(b"data: [DONE]\n\n", more=False)
                    return True
                await self._emit(b"data: {not json\n\n")
            if i == len(pieces):
                break
            if i > 0:
                waited += fault.stall_seconds if i == fault.stall_after else itl
            held += 1
            if held == interval or i == len(pieces) - 1:
                if await pause(waited, self.gone):
                    return False
                last, held, waited = await self._send_tokens(i + 1 - held, i + 1, last), 0, 0.0
        tail = self._chunk({}, self.plan.finish)
        if self.include_usage:
            tail += self._event([], self._usage())
        self._finished()
        await self._emit(tail + b"data: [DONE]\n\n", more=False)
        return True


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
    # As SGLang: the schedulers load the weights and capture CUDA graphs, and only then does
    # the HTTP server bind its port (a server that took the port meanwhile answers instead).
    log.info("Load weight begin. avail mem=78.50 GB")
    if await pause(knobs.load * 0.7, shutdown):
        return 0
    log.info(
        f"Load weight end. type=StandIn, dtype=torch.bfloat16, avail mem=63.20 GB, "
        f"mem usage=15.30 GB. model={args['model_path']}"
    )
    if not args.get("disable_cuda_graph"):
        log.info("Capture cuda graph begin. This can take up to several minutes. avail mem=9.8 GB")
        if await pause(knobs.load * 0.3, shutdown):
            return 0
        log.info(
            f"Capture cuda graph end. Time elapsed: {knobs.load * 0.3:.2f} s. mem usage=0.5 GB"
        )
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

    async def until_exists(path: str) -> None:
        for _ in range(15_000):  # at most 300 s, as the grandchild's safety net
            if os.path.exists(path):  # noqa: ASYNC240 - a stat, in a test server
                return
            await asyncio.sleep(0.02)

    async def warm_up() -> None:
        if knobs.warm_file is None:
            await asyncio.sleep(knobs.warmup)
        else:
            await until_exists(knobs.warm_file)
        app.set_warm()
        log.info("The server is fired up and ready to roll!")

    async def crash() -> None:
        if knobs.exit_file is not None:
            await until_exists(knobs.exit_file)
        else:
            assert knobs.exit_after is not None
            await asyncio.sleep(knobs.exit_after)
        log.error(_OOM_TRACEBACK.rstrip())
        log.error("Received sigquit from a child process. It usually means the child failed.")
        _stop_children(children)
        logging.shutdown()
        os._exit(1)

    background = [asyncio.ensure_future(warm_up())]
    if knobs.exit_after is not None or knobs.exit_file is not None:
        background.append(asyncio.ensure_future(crash()))
    try:
        await _server._serve(asgi, sock, tls=False, http2=False, shutdown=shutdown)
    finally:
        for task in background:
            task.cancel()
    log.info("Shutdown complete.")
    return 0
