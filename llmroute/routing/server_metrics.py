"""What self-hosted SGLang servers say of themselves on ``/metrics``, read into the live stats.

:func:`parse_prometheus` reads the Prometheus text exposition format; :func:`read_server_metrics`
turns one scrape into a :class:`~llmroute.routing.stats.ServerMetrics` (queue depth, running
requests, cache hit rate, KV pool usage, and the mean server-side TTFT and queue time since the
previous scrape); :class:`MetricsPoller` scrapes every self-hosted target into
:class:`~llmroute.routing.stats.LiveStats`, which the policies rank targets by
(``llmroute.sglang`` re-exports these names, and diagnoses a target's TTFT from them).

The SGLang names read here (``sglang/srt/metrics/collector.py``): the scheduler's gauges
``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:cache_hit_rate``,
``sglang:token_usage`` (labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank`` and, with
data parallelism, ``dp_rank``), the scheduler's histogram ``sglang:queue_time_seconds`` and the
tokenizer's ``sglang:time_to_first_token_seconds`` (label ``model_name``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

import anyio
import httpx

from .stats import LiveStats, ServerMetrics

__all__ = [
    "HistogramTotals",
    "MetricsPoller",
    "PrometheusSample",
    "PrometheusText",
    "ServerReading",
    "metrics_url",
    "parse_prometheus",
    "read_server_metrics",
]

log = logging.getLogger("llmroute.sglang")  # the logger it always had

QUEUE = "sglang:num_queue_reqs"
RUNNING = "sglang:num_running_reqs"
CACHE_HIT_RATE = "sglang:cache_hit_rate"
TOKEN_USAGE = "sglang:token_usage"
TTFT = "sglang:time_to_first_token_seconds"
QUEUE_TIME = "sglang:queue_time_seconds"


# -- the text format ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrometheusSample:
    """One sample line: ``name{labels} value [timestamp_ms]``."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


class PrometheusText(dict[str, list[PrometheusSample]]):
    """Samples by sample name (a histogram's ``_sum``, ``_count`` and ``_bucket`` are each their
    own name), with the ``# TYPE`` and ``# HELP`` lines and the count of malformed lines."""

    def __init__(self) -> None:
        super().__init__()
        self.types: dict[str, str] = {}
        self.help: dict[str, str] = {}
        self.malformed = 0


_UNESCAPE: Final = {"\\": "\\", '"': '"', "n": "\n"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text) and text[i + 1] in _UNESCAPE:
            out.append(_UNESCAPE[text[i + 1]])
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _parse_labels(line: str, start: int) -> tuple[dict[str, str], int]:
    """Labels from ``line[start]`` (just after ``{``) to the closing ``}``; the index after it."""
    labels: dict[str, str] = {}
    i, n = start, len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        eq = line.find("=", i)
        if eq < 0:
            raise ValueError("a label without '='")
        name = line[i:eq].strip()
        if not name or not (name[0].isalpha() or name[0] == "_"):
            raise ValueError(f"bad label name {name!r}")
        i = eq + 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise ValueError("a label value must be quoted")
        i += 1
        value_start = i
        while i < n and line[i] != '"':
            i += 2 if line[i] == "\\" else 1
        if i >= n:
            raise ValueError("an unterminated label value")
        labels[name] = _unescape(line[value_start:i])
        i += 1
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == ",":
            i += 1
        elif i < n and line[i] == "}":
            return labels, i + 1
        else:
            raise ValueError("expected ',' or '}' after a label")


def _parse_value(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    if "_" in text:
        raise ValueError(f"bad value {text!r}")
    return float(text)


def _parse_sample(line: str) -> PrometheusSample:
    i, n = 0, len(line)
    while i < n and (line[i].isalnum() or line[i] in "_:"):
        i += 1
    name = line[:i]
    if not name or name[0].isdigit():
        raise ValueError("a sample must start with a metric name")
    labels: dict[str, str] = {}
    j = i
    while j < n and line[j] in " \t":
        j += 1
    if j < n and line[j] == "{":
        labels, i = _parse_labels(line, j + 1)
    rest = line[i:].split()
    if not rest or len(rest) > 2 or (i < n and line[i] not in " \t"):
        raise ValueError("expected a value and an optional timestamp")
    timestamp = int(rest[1]) if len(rest) == 2 else None
    return PrometheusSample(name, labels, _parse_value(rest[0]), timestamp)


def parse_prometheus(text: str) -> PrometheusText:
    """Samples of a Prometheus text exposition, by sample name, in the order they appear.

    Tolerant: a malformed line is skipped and counted in ``.malformed``; other ``#`` comments
    and blank lines are ignored. Label values may hold escaped quotes, backslashes and newlines;
    values may be ``+Inf``, ``-Inf`` or ``NaN``.
    """
    result = PrometheusText()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 2)
            if len(parts) >= 2 and parts[0] == "TYPE":
                result.types[parts[1]] = parts[2].strip() if len(parts) > 2 else "untyped"
            elif len(parts) >= 2 and parts[0] == "HELP":
                result.help[parts[1]] = _unescape(parts[2]) if len(parts) > 2 else ""
            continue
        try:
            sample = _parse_sample(line)
        except ValueError:
            result.malformed += 1
            continue
        result.setdefault(sample.name, []).append(sample)
    return result


# -- one reading -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistogramTotals:
    """A histogram's cumulative ``_sum`` and ``_count`` at one reading."""

    sum: float
    count: float

    def mean_since(self, previous: HistogramTotals | None) -> float | None:
        """The mean of the observations since ``previous`` (all of them after a reset)."""
        total, count = self.sum, self.count
        if previous is not None and previous.count <= count:
            total, count = total - previous.sum, count - previous.count
        return total / count if count > 0 and math.isfinite(total) else None


@dataclass(frozen=True, slots=True)
class ServerReading:
    """One scrape: the :class:`ServerMetrics` it yields, and the histogram totals that the next
    reading's means are taken from (``ServerMetrics`` keeps none: it is what routing reads)."""

    metrics: ServerMetrics
    ttft: HistogramTotals | None = None
    queue_time: HistogramTotals | None = None


def _lead_rank(sample: PrometheusSample) -> bool:
    # Every tensor/pipeline rank may report the same scheduler state (with
    # --enable-metrics-for-all-schedulers): only rank 0 counts, data-parallel ranks all do.
    return sample.labels.get("tp_rank", "0") == "0" and sample.labels.get("pp_rank", "0") == "0"


def _values(samples: Mapping[str, list[PrometheusSample]], name: str) -> list[float]:
    return [s.value for s in samples.get(name, ()) if _lead_rank(s) and not math.isnan(s.value)]


def _rank_loads(samples: Mapping[str, list[PrometheusSample]]) -> tuple[int, ...]:
    """Queued + running requests per ``dp_rank`` label, in rank order; ``()`` when the gauges
    carry no such label or a single rank."""
    loads: dict[int, float] = {}
    for name in (QUEUE, RUNNING):
        for sample in samples.get(name, ()):
            rank = sample.labels.get("dp_rank")
            if rank is None or not _lead_rank(sample) or math.isnan(sample.value):
                continue
            try:
                loads[int(rank)] = loads.get(int(rank), 0.0) + sample.value
            except ValueError:
                continue
    if len(loads) < 2:
        return ()
    return tuple(round(loads[rank]) for rank in sorted(loads))


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _totals(samples: Mapping[str, list[PrometheusSample]], name: str) -> HistogramTotals | None:
    sums, counts = _values(samples, name + "_sum"), _values(samples, name + "_count")
    if not counts:
        return None
    return HistogramTotals(math.fsum(sums), math.fsum(counts))


def read_server_metrics(
    samples: Mapping[str, list[PrometheusSample]],
    previous: ServerReading | None = None,
    *,
    read_at: float,
) -> ServerReading:
    """The server's state from one scrape; the TTFT and queue-time means since ``previous``.

    Queue depth and running requests are summed over label sets (data-parallel ranks each have
    a queue) and also kept per ``dp_rank`` (:attr:`ServerMetrics.ranks`); cache hit rate and
    token usage, being ratios, are averaged over them. Samples of tensor or pipeline ranks
    other than 0 are left out. Missing gauges read as 0 requests and ``None`` ratios. When a
    histogram's count went down (the server restarted), the mean is over everything since the
    restart.
    """
    ttft = _totals(samples, TTFT)
    queue_time = _totals(samples, QUEUE_TIME)
    metrics = ServerMetrics(
        ranks=_rank_loads(samples),
        read_at=read_at,
        queued=round(math.fsum(_values(samples, QUEUE))),
        running=round(math.fsum(_values(samples, RUNNING))),
        cache_hit_rate=_mean(_values(samples, CACHE_HIT_RATE)),
        token_usage=_mean(_values(samples, TOKEN_USAGE)),
        ttft_mean=ttft.mean_since(previous.ttft if previous else None) if ttft else None,
        queue_time_mean=(
            queue_time.mean_since(previous.queue_time if previous else None) if queue_time else None
        ),
    )
    return ServerReading(metrics, ttft, queue_time)


# -- polling -----------------------------------------------------------------------------------


def metrics_url(url: str) -> str:
    """``/metrics`` of the server at ``url`` (its root or its ``/v1`` OpenAI base URL)."""
    root = url.rstrip("/")
    if root.endswith("/metrics"):
        return root
    return root.removesuffix("/v1") + "/metrics"


class MetricsPoller:
    """Scrapes each target's ``/metrics`` into ``stats.target(name).load.server``.

    ``urls_by_target`` maps a target name (``"provider:model"``) to its server's root or
    ``/v1`` URL. ``keys`` maps target names to their server's API key, sent as
    ``Authorization: Bearer <key>``: SGLang before 0.5 wants it on ``/metrics`` when the server
    has ``--api-key`` (from 0.5 on ``/metrics`` is open; the key does no harm). Targets without
    a key send none; keys of other names are ignored. Keys are never logged nor shown in
    ``repr``. A failed scrape keeps the previous reading; it is logged at DEBUG, and once at
    WARNING until the target answers again. ``clock`` must be the stats' clock
    (``time.monotonic`` unless the stats were given another).

    Without ``http`` the poller makes its own client, which ignores proxy environment variables
    (``trust_env=False``): the servers it scrapes are the caller's own, usually on loopback.
    """

    def __init__(
        self,
        urls_by_target: Mapping[str, str],
        stats: LiveStats,
        *,
        keys: Mapping[str, str] | None = None,
        interval: float = 1.0,
        timeout: float = 1.0,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        self.urls = {name: metrics_url(url) for name, url in urls_by_target.items()}
        self.stats = stats
        self.interval = float(interval)
        self.timeout = float(timeout)
        self._keys = {name: key for name, key in (keys or {}).items() if key and name in self.urls}
        self._own_http = http is None
        self._http = (
            http if http is not None else httpx.AsyncClient(timeout=timeout, trust_env=False)
        )
        self._clock = clock
        self._readings: dict[str, ServerReading] = {}
        self._failing: set[str] = set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client, if the poller made it."""
        if self._own_http:
            await self._http.aclose()

    def reading(self, target: str) -> ServerReading | None:
        """The latest successful reading of ``target``."""
        return self._readings.get(target)

    async def poll_once(self) -> dict[str, ServerMetrics]:
        """Scrape every target concurrently; the new metrics of those that answered."""
        fresh: dict[str, ServerMetrics] = {}
        async with anyio.create_task_group() as group:
            for target in self.urls:
                group.start_soon(self._poll_target, target, fresh)
        return fresh

    async def _poll_target(self, target: str, fresh: dict[str, ServerMetrics]) -> None:
        url = self.urls[target]
        key = self._keys.get(target)
        headers = {"Authorization": f"Bearer {key}"} if key else None
        # The reading is dated when the scrape is sent: a request started later is not in it.
        sent_at = self._clock()
        try:
            response = await self._http.get(url, headers=headers, timeout=self.timeout)
            response.raise_for_status()
            text = response.text
        except httpx.HTTPError as exc:
            problem = str(exc).replace(key, "***") if key else str(exc)
            if key is None and isinstance(exc, httpx.HTTPStatusError):
                if exc.response.status_code in (401, 403):
                    problem += " (the server wants an API key: give it in keys=)"
            log.debug(
                "metrics of %s from %s failed: %s: %s", target, url, type(exc).__name__, problem
            )
            if target not in self._failing:
                self._failing.add(target)
                log.warning("cannot read the metrics of %s from %s: %s", target, url, problem)
            return
        samples = parse_prometheus(text)
        previous = self._readings.get(target)
        if previous is not None and previous.metrics.read_at > sent_at:
            return  # a later scrape (of an overlapping poll) already answered
        reading = read_server_metrics(samples, previous, read_at=sent_at)
        self._readings[target] = reading
        self.stats.target(target).load.observe_server(reading.metrics)
        fresh[target] = reading.metrics
        if target in self._failing:
            self._failing.discard(target)
            log.info("the metrics of %s can be read again", target)

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled."""
        while True:
            started = anyio.current_time()
            await self.poll_once()
            await anyio.sleep(max(0.0, self.interval - (anyio.current_time() - started)))
