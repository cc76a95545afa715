"""The SGLang stand-in's ``/metrics``: its histograms and counters, and the Prometheus text
exposition they are written in (the series SGLang's versions have).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
