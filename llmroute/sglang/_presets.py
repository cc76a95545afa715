"""Presets for the SGLang launcher beyond its TTFT-first defaults, and which one a measurement
points to.

The launcher's defaults stay TTFT-first (prefix cache on, ``--schedule-policy lpm``, metrics,
cache report). A :class:`Preset` adds documented SGLang flags for one situation:

- :func:`speculative_decoding`: a small draft model (100M-1B parameters) proposes tokens the big
  one verifies in one step: faster decoding (lower inter-token latency), at the cost of the
  draft's memory. ``EAGLE3`` takes an EAGLE3 draft head trained for the model; ``STANDALONE``
  any small model sharing the big one's tokenizer.
- :func:`chunked_prefill`: the prefill chunk (``--chunked-prefill-size``) sized for long prompts:
  fewer, larger chunks finish a long prompt's prefill sooner; smaller ones keep other requests'
  decoding smooth.
- :func:`memory_fraction`: ``--mem-fraction-static``, the share of GPU memory for weights and KV
  cache (a larger KV cache holds more prefixes; leave room for CUDA graphs and a draft model).

Each is checked against the installed SGLang's ``--help`` before any server starts: a flag, or an
algorithm, that version lacks is an error naming it. :func:`suggest_preset` turns ``llmroute
doctor``'s measurements into the preset they point to, with the figure that led to it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from ._diagnosis import PREFILL_SHARE, PREFILL_SLOW, QUEUE_SHARE, TTFTDiagnosis

__all__ = [
    "SLOW_DECODE",
    "SPECULATIVE_ALGORITHMS",
    "Preset",
    "chunked_prefill",
    "memory_fraction",
    "speculative_decoding",
    "suggest_preset",
]

SPECULATIVE_ALGORITHMS: Final = ("EAGLE3", "EAGLE", "STANDALONE")
"""The algorithms of ``--speculative-algorithm`` a draft model path serves (SGLang's
``server_args.py``: choices EAGLE, EAGLE3, NEXTN, STANDALONE, and NGRAM in later releases)."""

SLOW_DECODE: Final = 0.040
"""A median inter-token latency above this (seconds; under 25 tokens/s) is slow decoding."""


@dataclass(frozen=True, slots=True)
class Preset:
    """Flags for SGLang's server (``args``), the flags and choices its ``--help`` must list
    (``needs``), and why they help (``why``)."""

    name: str
    args: tuple[str, ...]
    needs: tuple[str, ...]
    why: str

    def missing(self, listed: Collection[str] | None) -> list[str]:
        """What the help text ``listed`` lacks (nothing when the help could not be read)."""
        return [] if listed is None else [need for need in self.needs if need not in listed]


def speculative_decoding(
    draft_model: str,
    *,
    algorithm: str = "EAGLE3",
    num_steps: int = 3,
    eagle_topk: int = 1,
    num_draft_tokens: int = 4,
) -> Preset:
    """Speculative decoding with ``draft_model`` (SGLang's documented starting point: 3 steps,
    top-k 1, 4 draft tokens; top-k 1 keeps the verification cheap at small batch sizes)."""
    if algorithm not in SPECULATIVE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)}")
    if not draft_model:
        raise ValueError("speculative decoding needs a draft model (a path or a Hugging Face id)")
    if min(num_steps, eagle_topk, num_draft_tokens) < 1:
        raise ValueError("num_steps, eagle_topk and num_draft_tokens must be at least 1")
    args = (
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        draft_model,
        "--speculative-num-steps",
        str(num_steps),
        "--speculative-eagle-topk",
        str(eagle_topk),
        "--speculative-num-draft-tokens",
        str(num_draft_tokens),
    )
    needs = (*(flag for flag in args if flag.startswith("--")), algorithm)
    why = f"speculative decoding ({algorithm}, draft {draft_model}): faster decoding"
    return Preset(f"speculative-{algorithm.lower()}", args, needs, why)


def chunked_prefill(size: int = 16384) -> Preset:
    """Prefill in chunks of ``size`` tokens (16384 suits prompts of tens of thousands of tokens;
    SGLang picks 2048-8192 by GPU)."""
    if size < 1:
        raise ValueError(f"the chunk must be a positive number of tokens, got {size!r}")
    args = ("--chunked-prefill-size", str(size))
    return Preset(
        "chunked-prefill", args, args[:1], f"long prompts: prefill in {size}-token chunks"
    )


def memory_fraction(fraction: float) -> Preset:
    """``--mem-fraction-static fraction`` (0 < fraction < 1)."""
    if not (0.0 < fraction < 1.0 and math.isfinite(fraction)):
        raise ValueError(f"the memory fraction must be between 0 and 1, got {fraction!r}")
    args = ("--mem-fraction-static", f"{fraction:g}")
    return Preset("memory-fraction", args, args[:1], f"{fraction:.0%} of GPU memory for the model")


def preset_args(presets: Sequence[Preset], user: Collection[str]) -> list[str]:
    """The presets' flags, in order, except those the user gave (``user``: flag names)."""
    chosen: list[str] = []
    for preset in presets:
        args = preset.args
        for i in range(0, len(args), 2):
            if args[i] not in user:
                chosen += args[i : i + 2]
    return chosen


def suggest_preset(diagnosis: TTFTDiagnosis, itl: float | None = None) -> str | None:
    """The preset a target's measurements point to, with the figure that led to it; ``None``
    when nothing stands out. In order: queueing (more replicas), long prefill (chunked prefill
    and the prefix cache), slow decoding (speculative decoding, from the median inter-token
    latency ``itl`` in seconds)."""
    server, queue = diagnosis.server_ttft, diagnosis.queue_time
    prefill = diagnosis.parts.get("prefill")
    if server is not None and queue is not None and queue > 0.05 and queue > QUEUE_SHARE * server:
        return (
            f"queueing: {queue * 1000:.0f} ms of the server's {server * 1000:.0f} ms TTFT is "
            "queue: start more replicas (--gpus with more GPUs, or --tp to fit larger batches)"
        )
    if (
        server is not None
        and prefill is not None
        and prefill > PREFILL_SLOW
        and prefill > PREFILL_SHARE * server
    ):
        return (
            f"long prefill: {prefill * 1000:.0f} ms of the server's TTFT: keep the prefix cache "
            'hot (policy = "prefix") and size chunked prefill for long prompts '
            "(--chunked-prefill-size 16384)"
        )
    if itl is not None and itl > SLOW_DECODE:
        return (
            f"slow decoding: {itl * 1000:.0f} ms between tokens ({1 / itl:.0f} tokens/s): "
            "speculative decoding with a small draft model (--speculative eagle3 --draft-model ...)"
        )
    return None
