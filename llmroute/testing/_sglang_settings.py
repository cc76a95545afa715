"""What the SGLang stand-in is told: SGLang's server flags as each emulated version has them
(:func:`build_parser`, :func:`supported_flags`), and the stand-in's own knobs from
``SGLANG_STANDIN_*`` variables (:class:`StandInKnobs`). :mod:`llmroute.testing._sglang` says what
the stand-in does.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Version = tuple[int, ...]
SERVE_CLI_SINCE: Version = (0, 5, 5)
"""First SGLang release with ``sglang serve`` (module ``sglang.cli.main``)."""


_V036, _V040, _V050, _V054 = (0, 3, 6), (0, 4, 0), (0, 5, 0), (0, 5, 4)


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
