"""What ``llmroute top`` shows, as pure functions of Prometheus text: reading an exposition,
the figures between two scrapes, and the lines of a screen.

Percentiles come from the histogram buckets' growth between two scrapes, with Prometheus's
``histogram_quantile`` estimate (so a Grafana panel shows the same figure); counts are counter
deltas (a counter that shrank means the process restarted: it counts from zero). No I/O here:
``_top.py`` scrapes and draws.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ._format import ms

__all__ = [
    "Exposition",
    "Frame",
    "KeyRow",
    "NotMetrics",
    "ObjectiveRow",
    "RouteRow",
    "TargetRow",
    "TierRow",
    "build_frame",
    "histogram_quantile",
    "render",
]

SORTS = ("share", "p95", "errors", "name")
"""The orders the target table can take (``share``: most answers first)."""
ERROR_OUTCOMES = frozenset({"error", "timeout", "rate_limited", "interrupted"})
"""The attempt outcomes counted as a target's errors (a lost hedge, ``cancelled``, is not)."""


class NotMetrics(ValueError):
    """Raised when a page is not Prometheus text holding llmroute's metrics."""


# -- reading an exposition ----------------------------------------------------------------------

_Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Exposition:
    """The samples of one scrape: sample name -> {label set: value}."""

    samples: Mapping[str, Mapping[_Labels, float]]

    @classmethod
    def parse(cls, text: str) -> Exposition:
        """Read Prometheus text; :class:`NotMetrics` when it is not that or holds no
        ``llmroute_*`` series."""
        from prometheus_client.parser import text_string_to_metric_families

        samples: dict[str, dict[_Labels, float]] = {}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    labels = frozenset(sample.labels.items())
                    samples.setdefault(sample.name, {})[labels] = float(sample.value)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise NotMetrics(f"not Prometheus text ({' '.join(str(exc).split())[:80]})") from None
        if not any(name.startswith("llmroute_") for name in samples):
            raise NotMetrics("Prometheus text, but without llmroute's metrics (no llmroute_*)")
        return cls(samples)

    def series(self, name: str) -> Mapping[_Labels, float]:
        return self.samples.get(name, {})


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q``-quantile of a histogram given as (upper bound, cumulative count) pairs.

    Prometheus's ``histogram_quantile``: linear interpolation inside the bucket holding the rank
    (the first bucket starts at 0); a rank in the ``+Inf`` bucket gives the highest finite bound.
    None when the histogram is empty.
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = (bound if not math.isinf(bound) else lower), count
    return lower


class _Window:
    """Two scrapes (``before`` None: since the start) and the figures between them."""

    def __init__(self, now: Exposition, before: Exposition | None) -> None:
        self.now, self.before = now, before

    def deltas(self, name: str) -> Iterable[tuple[dict[str, str], float]]:
        """Each series' growth; a series that shrank (the process restarted) counts from 0."""
        earlier = self.before.series(name) if self.before is not None else {}
        for labels, value in self.now.series(name).items():
            old = earlier.get(labels, 0.0)
            yield dict(labels), value - old if value >= old else value

    def counter(self, name: str, by: Sequence[str]) -> dict[tuple[str, ...], float]:
        """The growth of counter ``name`` summed by the labels ``by``."""
        out: dict[tuple[str, ...], float] = {}
        for labels, delta in self.deltas(name):
            group = tuple(labels.get(label, "") for label in by)
            out[group] = out.get(group, 0.0) + delta
        return out

    def gauge(self, name: str, by: Sequence[str]) -> dict[tuple[str, ...], float]:
        """Gauge ``name`` now, summed by the labels ``by``."""
        out: dict[tuple[str, ...], float] = {}
        for labels, value in self.now.series(name).items():
            mapping = dict(labels)
            group = tuple(mapping.get(label, "") for label in by)
            out[group] = out.get(group, 0.0) + value
        return out

    def quantiles(
        self, histogram: str, by: Sequence[str], qs: Sequence[float]
    ) -> dict[tuple[str, ...], list[float | None]]:
        """The ``qs``-quantiles of ``histogram``'s growth, its buckets summed by ``by``."""
        grouped: dict[tuple[str, ...], dict[float, float]] = {}
        for labels, delta in self.deltas(f"{histogram}_bucket"):
            bound = float(labels.get("le", "+Inf"))
            group = tuple(labels.get(label, "") for label in by)
            counts = grouped.setdefault(group, {})
            counts[bound] = counts.get(bound, 0.0) + delta
        return {
            group: [histogram_quantile(q, list(counts.items())) for q in qs]
            for group, counts in grouped.items()
        }

    def whole(
        self, histogram: str, by: Sequence[str]
    ) -> dict[tuple[str, ...], tuple[float, list[float | None]]]:
        """A histogram of whole answers (requests not streamed): each group's count over the
        window and its p50, p95, p99; groups that grew only."""
        counts = self.counter(f"{histogram}_count", by)
        return {
            group: (counts[group], qs)
            for group, qs in self.quantiles(histogram, by, _Q).items()
            if counts.get(group)
        }


# -- the figures of one frame --------------------------------------------------------------------


@dataclass(slots=True)
class TargetRow:
    """One target: its answers and their share, TTFT of its attempts, hedges, errors, circuit."""

    name: str
    answers: float = 0.0
    share: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    router_p95: float | None = None
    hedges: float = 0.0
    hedges_won: float = 0.0
    errors: float = 0.0
    in_flight: float = 0.0
    state: str = "-"
    whole: float = 0.0
    """Answers of requests that were not streamed (``whole_p*``: their time to the answer)."""
    whole_p50: float | None = None
    whole_p95: float | None = None
    whole_p99: float | None = None


@dataclass(slots=True)
class RouteRow:
    """One route (a model name asked for): requests, the caller's TTFT, hedges, cache hits."""

    name: str
    requests: float = 0.0
    errors: float = 0.0
    cache_hits: float = 0.0
    hedges: float = 0.0
    hedges_won: float = 0.0
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    whole: float = 0.0
    """Answers of requests that were not streamed (``whole_p*``: their time to the answer)."""
    whole_p50: float | None = None
    whole_p95: float | None = None
    whole_p99: float | None = None


@dataclass(slots=True)
class KeyRow:
    """One gateway key, by name: requests (API calls), rejections, tokens, cache hits, in flight,
    spend (USD, where its targets have prices) and the part of it hedges, retries and
    continuations cost."""

    name: str
    requests: float = 0.0
    rejected: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    in_flight: float = 0.0
    cache_hits: float = 0.0
    spend: float = 0.0
    hedge_spend: float = 0.0


@dataclass(slots=True)
class ObjectiveRow:
    """One latency objective of a key (on a route, or ``*``): met share, burn rates."""

    key: str
    route: str
    target: float | None = None
    ratio: float | None = None
    requests: float = 0.0
    met: float = 0.0
    burn: dict[str, float] = field(default_factory=dict[str, float])


@dataclass(slots=True)
class TierRow:
    """One tier of a tiered model name: the requests it got."""

    model: str
    tier: str
    decisions: float = 0.0
    share: float | None = None


@dataclass(slots=True)
class Frame:
    """What one screen shows. ``seconds`` is the interval covered, None: since the start."""

    seconds: float | None
    targets: list[TargetRow]
    routes: list[RouteRow]
    keys: list[KeyRow]
    objectives: list[ObjectiveRow]
    tiers: list[TierRow]


_Q = (0.5, 0.95, 0.99)


def build_frame(now: Exposition, before: Exposition | None, seconds: float | None) -> Frame:
    """The figures between two scrapes (``before`` None: since the process started)."""
    w = _Window(now, before)
    return Frame(
        seconds=seconds if before is not None else None,
        targets=_targets(w),
        routes=_routes(w),
        keys=_keys(w),
        objectives=_objectives(w),
        tiers=_tiers(w),
    )


def _targets(w: _Window) -> list[TargetRow]:
    names: set[str] = set()
    for metric in ("llmroute_in_flight", "llmroute_breaker_state", "llmroute_attempts_total"):
        names.update(dict(labels).get("target", "") for labels in w.now.series(metric))
    names.discard("")
    rows = {name: TargetRow(name) for name in sorted(names)}
    for (target, outcome, reason), count in w.counter(
        "llmroute_attempts_total", ("target", "outcome", "reason")
    ).items():
        row = rows.get(target)
        if row is None:
            continue
        if outcome == "won":
            row.answers += count
        if outcome in ERROR_OUTCOMES:
            row.errors += count
        if reason == "hedge":
            row.hedges += count
            if outcome == "won":
                row.hedges_won += count
    total = sum(row.answers for row in rows.values())
    for (target,), qs in w.quantiles("llmroute_ttft_seconds", ("target",), _Q).items():
        if target in rows:
            rows[target].p50, rows[target].p95, rows[target].p99 = qs
    for (target,), (count, qs) in w.whole("llmroute_response_seconds", ("target",)).items():
        if target in rows:
            row = rows[target]
            row.whole, (row.whole_p50, row.whole_p95, row.whole_p99) = count, qs
    for (target,), value in w.gauge("llmroute_target_ttft_p95_seconds", ("target",)).items():
        if target in rows:
            rows[target].router_p95 = value
    for (target,), value in w.gauge("llmroute_in_flight", ("target",)).items():
        if target in rows:
            rows[target].in_flight = value
    for labels, value in w.now.series("llmroute_breaker_state").items():
        mapping = dict(labels)
        row = rows.get(mapping.get("target", ""))
        if row is not None and value:
            row.state = mapping.get("llmroute_breaker_state", "-")
    for row in rows.values():
        row.share = row.answers / total if total else None
    return list(rows.values())


def _routes(w: _Window) -> list[RouteRow]:
    rows: dict[str, RouteRow] = {}

    def row(name: str) -> RouteRow:
        return rows.setdefault(name, RouteRow(name))

    for (route, outcome), count in w.counter(
        "llmroute_requests_total", ("route", "outcome")
    ).items():
        row(route).requests += count
        if outcome in ("error", "interrupted"):
            row(route).errors += count
    for (route,), count in w.counter("llmroute_cache_hits_total", ("route",)).items():
        row(route).cache_hits += count
    for (route,), count in w.counter("llmroute_hedges_fired_total", ("route",)).items():
        row(route).hedges += count
    for (route,), count in w.counter("llmroute_hedges_won_total", ("route",)).items():
        row(route).hedges_won += count
    for (route,), qs in w.quantiles("llmroute_request_ttft_seconds", ("route",), _Q).items():
        row(route).p50, row(route).p95, row(route).p99 = qs
    for (route,), (count, qs) in w.whole("llmroute_request_seconds", ("route",)).items():
        found = row(route)
        found.whole, (found.whole_p50, found.whole_p95, found.whole_p99) = count, qs
    return [rows[name] for name in sorted(rows)]


def _keys(w: _Window) -> list[KeyRow]:
    rows: dict[str, KeyRow] = {}

    def row(name: str) -> KeyRow:
        return rows.setdefault(name, KeyRow(name))

    for labels, delta in w.deltas("llmroute_gateway_requests_total"):
        # API calls only, as /admin/usage counts them: not the page, /metrics or /admin reads.
        if labels.get("path", "").startswith("/v1/"):
            row(labels.get("key", "")).requests += delta
    for (key,), count in w.counter("llmroute_gateway_rejections_total", ("key",)).items():
        row(key).rejected += count
    for (key, kind), count in w.counter("llmroute_gateway_tokens_total", ("key", "kind")).items():
        if kind == "prompt":
            row(key).prompt_tokens += count
        elif kind == "completion":
            row(key).completion_tokens += count
    for (key,), value in w.gauge("llmroute_gateway_in_flight", ("key",)).items():
        row(key).in_flight += value
    for (key,), count in w.counter("llmroute_gateway_cache_hits_total", ("key",)).items():
        row(key).cache_hits += count
    for (key,), usd in w.counter("llmroute_gateway_spend_usd_total", ("key",)).items():
        row(key).spend += usd
    for (key,), usd in w.counter("llmroute_gateway_hedge_spend_usd_total", ("key",)).items():
        row(key).hedge_spend += usd
    return [rows[name] for name in sorted(rows)]


def _objectives(w: _Window) -> list[ObjectiveRow]:
    rows: dict[tuple[str, str], ObjectiveRow] = {}

    def row(key: str, route: str) -> ObjectiveRow:
        return rows.setdefault((key, route), ObjectiveRow(key, route))

    by = ("key", "route")
    for (key, route), count in w.counter("llmroute_gateway_slo_requests_total", by).items():
        row(key, route).requests += count
    for (key, route), count in w.counter("llmroute_gateway_slo_met_total", by).items():
        row(key, route).met += count
    for (key, route), value in w.gauge("llmroute_gateway_slo_ttft_target_seconds", by).items():
        row(key, route).target = value
    for (key, route), value in w.gauge("llmroute_gateway_slo_objective_ratio", by).items():
        row(key, route).ratio = value
    for (key, route, window), value in w.gauge(
        "llmroute_gateway_slo_burn_rate", ("key", "route", "window")
    ).items():
        row(key, route).burn[window] = value
    return [rows[pair] for pair in sorted(rows)]


def _tiers(w: _Window) -> list[TierRow]:
    counts = w.counter("llmroute_tier_decisions_total", ("model", "tier"))
    totals: dict[str, float] = {}
    for (model, _), count in counts.items():
        totals[model] = totals.get(model, 0.0) + count
    return [
        TierRow(model, tier, count, count / totals[model] if totals[model] else None)
        for (model, tier), count in sorted(counts.items())
    ]


# -- drawing --------------------------------------------------------------------------------------

_BOLD, _RED, _YELLOW, _RESET = "\x1b[1m", "\x1b[31m", "\x1b[33m", "\x1b[0m"
_MIN_NAME = 16
_NAME_CAP = 36


@dataclass(frozen=True, slots=True)
class _Column:
    title: str
    cells: list[str]
    drop: int = 0
    """Dropped first (highest first) when the table is wider than the terminal; 0: never."""
    left: bool = False


def _count(value: float) -> str:
    return f"{value:.0f}"


def _usd(value: float) -> str:
    """Dollars spent, to four figures (``-``: none priced)."""
    return f"${value:.4g}" if value > 0 else "-"


def _hedged(row: KeyRow) -> str:
    """The share of a key's spend its hedges, retries and continuations added."""
    return _share(row.hedge_spend / row.spend) if row.spend > 0 else "-"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _shorten(name: str, width: int) -> str:
    """``name`` cut in the middle to ``width`` characters (the provider and the model's end
    stay readable)."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "~" + name[len(name) - (width - 1 - head) :]


def _table(columns: list[_Column], width: int | None) -> list[str]:
    """Columns side by side. Too wide for ``width``: the first column (names) is cut to
    :data:`_NAME_CAP`, then the columns with the highest ``drop`` go, then the names are cut
    further, down to :data:`_MIN_NAME`."""
    cols = list(columns)

    def measure() -> list[int]:
        sizes = [max([len(col.title), *(len(cell) for cell in col.cells)]) for col in cols]
        sizes[0] = min(sizes[0], cap)
        return sizes

    def excess() -> int:
        return sum(measure()) + 2 * (len(cols) - 1) - (width or 0)

    cap = 1 << 30
    if width is not None:
        cap = max(_NAME_CAP, measure()[0] - excess())
        while excess() > 0 and any(c.drop for c in cols):
            cols.remove(max(cols, key=lambda c: c.drop))
        if excess() > 0:
            cap = max(_MIN_NAME, measure()[0] - excess())
    widths = measure()
    first = cols[0]
    lines = [
        "  ".join(
            [first.title.ljust(widths[0])]
            + [_align(col, col.title, size) for col, size in zip(cols[1:], widths[1:], strict=True)]
        ).rstrip()
    ]
    for index in range(len(first.cells)):
        cells = [_shorten(first.cells[index], widths[0]).ljust(widths[0])]
        cells += [
            _align(col, col.cells[index], size)
            for col, size in zip(cols[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _align(column: _Column, text: str, size: int) -> str:
    return text.ljust(size) if column.left else text.rjust(size)


def _sorted_targets(rows: list[TargetRow], sort: str) -> list[TargetRow]:
    slow = float("inf")
    if sort == "name":
        return sorted(rows, key=lambda r: r.name)
    if sort == "p95":
        return sorted(rows, key=lambda r: (-(r.p95 if r.p95 is not None else -slow), r.name))
    if sort == "errors":
        return sorted(rows, key=lambda r: (-r.errors, r.name))
    return sorted(rows, key=lambda r: (-r.answers, r.name))


def render(
    frame: Frame,
    *,
    source: str,
    interval: float | None,
    width: int | None = None,
    height: int | None = None,
    sort: str = "share",
    rows: int | None = None,
    color: bool = False,
    note: str | None = None,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """The lines of one screen: targets, routes, and where present keys, objectives, tiers.

    ``width``/``height`` (a terminal's) drop columns and target rows to fit; None: everything.
    ``interval``: the seconds the next frame will cover (None: no next frame).
    ``rows``: at most this many targets, whatever the height. Targets whose circuit is not
    closed are shown before any other is cut.
    """
    bold = (lambda s: f"{_BOLD}{s}{_RESET}") if color else (lambda s: s)
    stamp = time.strftime("%H:%M:%S", time.gmtime(clock()))
    if frame.seconds is not None:
        over = f"over the last {frame.seconds:.1f} s"
    elif interval is None:
        over = "since the process started (its totals)"
    else:
        over = f"since the process started (its totals; the next frame covers {interval:g} s)"
    head = [bold(_clip(f"llmroute top: {source}  {stamp} UTC", width)), f"figures {over}"]
    if note:
        head.append(note)
    sections: list[list[str]] = []
    if frame.routes:
        sections.append([bold("routes: the caller's TTFT"), *_routes_table(frame, width)])
    whole = _whole_section(frame, width)
    if whole:
        sections.append([bold("not streamed: time to the whole answer"), *whole])
    if frame.keys:
        sections.append([bold("gateway keys"), *_keys_table(frame, width)])
    if frame.objectives:
        title = "latency objectives (burn: 1.0 spends the budget on time)"
        sections.append([bold(title), *_objectives_table(frame, width)])
    if frame.tiers:
        sections.append(
            [bold("tiers: where each tiered name sent its requests"), *_tier_lines(frame)]
        )
    used = len(head) + sum(len(s) + 1 for s in sections) + 3
    targets = _target_section(frame, width, height, used, sort, rows, color, bold)
    out = [*head, "", *targets]
    for section in sections:
        out += ["", *section]
    # A terminal's line is cut rather than wrapped (which would push the screen down); the
    # painted lines were fitted before their colours went on.
    return [line if "\x1b" in line else _clip(line, width) for line in out]


def _routes_table(frame: Frame, width: int | None) -> list[str]:
    routes = frame.routes
    return _table(
        [
            _Column("route", [r.name for r in routes]),
            _Column("requests", [_count(r.requests) for r in routes]),
            _Column("errors", [_count(r.errors) for r in routes]),
            _Column("cache hits", [_count(r.cache_hits) for r in routes], 3),
            _Column("hedges", [_count(r.hedges) for r in routes], 2),
            _Column("won", [_count(r.hedges_won) for r in routes], 2),
            _Column("p50", [ms(r.p50) for r in routes], 4),
            _Column("p95", [ms(r.p95) for r in routes]),
            _Column("p99", [ms(r.p99) for r in routes], 1),
        ],
        width,
    )


def _keys_table(frame: Frame, width: int | None) -> list[str]:
    keys = frame.keys
    return _table(
        [
            _Column("key", [r.name if r.name != "-" else "(no valid key)" for r in keys]),
            _Column("requests", [_count(r.requests) for r in keys]),
            _Column("rejected", [_count(r.rejected) for r in keys]),
            _Column("tokens in", [_count(r.prompt_tokens) for r in keys], 2),
            _Column("tokens out", [_count(r.completion_tokens) for r in keys], 2),
            _Column("cache hits", [_count(r.cache_hits) for r in keys], 3),
            _Column("in flight", [_count(r.in_flight) for r in keys], 1),
            _Column("hedged", [_hedged(r) for r in keys], 5),
            _Column("spend", [_usd(r.spend) for r in keys], 4),
        ],
        width,
    )


def _objectives_table(frame: Frame, width: int | None) -> list[str]:
    objectives, windows = frame.objectives, ("5m", "1h")
    return _table(
        [
            _Column("key", [r.key for r in objectives]),
            _Column("route", [r.route for r in objectives], left=True),
            _Column("objective", [_objective(r) for r in objectives], left=True),
            _Column("requests", [_count(r.requests) for r in objectives]),
            _Column(
                "met", [_share(r.met / r.requests if r.requests else None) for r in objectives]
            ),
            *(
                _Column(
                    f"burn {window}",
                    [_burn(r.burn.get(window)) for r in objectives],
                    1 if window != "5m" else 0,
                )
                for window in windows
            ),
        ],
        width,
    )


def _tier_lines(frame: Frame) -> list[str]:
    """A line per tiered model name: each tier's share of its decisions."""
    models: dict[str, list[str]] = {}
    for row in frame.tiers:
        models.setdefault(row.model, []).append(
            f"{row.tier} {_share(row.share)} ({row.decisions:.0f})"
        )
    return [f"{model}: " + ", ".join(parts) for model, parts in models.items()]


def _target_section(
    frame: Frame,
    width: int | None,
    height: int | None,
    used: int,
    sort: str,
    rows: int | None,
    color: bool,
    bold: Callable[[str], str],
) -> list[str]:
    """The targets' title and table, cut to ``rows`` or to what ``height`` leaves after the
    ``used`` lines of the other sections (a line then counts the targets left out)."""
    targets = _sorted_targets(frame.targets, sort)
    limit = rows
    if limit is None and height is not None and len(targets) > max(3, height - used):
        limit = max(3, height - used) - 1  # and a line that counts the others
    hidden = 0
    if limit is not None and len(targets) > limit:
        targets = _keep(targets, limit)
        hidden = len(frame.targets) - len(targets)
    state = [_paint(r.state, color) for r in targets]
    lines = _table(
        [
            _Column("target", [r.name for r in targets]),
            _Column("answers", [_count(r.answers) for r in targets], 5),
            _Column("share", [_share(r.share) for r in targets]),
            _Column("p50", [ms(r.p50) for r in targets], 6),
            _Column("p95", [ms(r.p95) for r in targets]),
            _Column("p99", [ms(r.p99) for r in targets], 3),
            _Column("router p95", [ms(r.router_p95) for r in targets], 1),
            _Column("hedges", [_count(r.hedges) for r in targets], 2),
            _Column("won", [_count(r.hedges_won) for r in targets], 2),
            _Column("errors", [_count(r.errors) for r in targets]),
            _Column("in flight", [_count(r.in_flight) for r in targets], 4),
            _Column("state", [r.state for r in targets], left=True),
        ],
        width,
    )
    if color:  # painted after the widths were measured
        lines = lines[:1] + [
            line[: len(line) - len(row.state)] + painted if line.endswith(row.state) else line
            for line, row, painted in zip(lines[1:], targets, state, strict=True)
        ]
    section = [bold(f"targets ({len(frame.targets)}), by {sort}: TTFT of their attempts"), *lines]
    if hidden:
        section.append(
            f"... {hidden} more (a taller terminal, --rows or --sort shows others)"
            if rows is None
            else f"... {hidden} more (--rows or --sort shows others)"
        )
    return section


def _whole_section(frame: Frame, width: int | None) -> list[str]:
    """The routes' (the caller's view) and then the targets' times to the whole answer of
    requests that were not streamed; nothing when there were none."""
    named = [r for r in frame.routes if r.whole] + [r for r in frame.targets if r.whole]
    if not named:
        return []
    return _table(
        [
            _Column("route / target", [r.name for r in named]),
            _Column("answers", [_count(r.whole) for r in named]),
            _Column("p50", [ms(r.whole_p50) for r in named], 2),
            _Column("p95", [ms(r.whole_p95) for r in named]),
            _Column("p99", [ms(r.whole_p99) for r in named], 1),
        ],
        width,
    )


def _clip(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return text[: max(0, width - 3)] + "..."


def _keep(targets: list[TargetRow], limit: int) -> list[TargetRow]:
    """The first ``limit`` of ``targets``, except that those with an open or half-open circuit
    take the places of the last ones (in their order)."""
    flagged = [row for row in targets[limit:] if row.state not in ("closed", "-")][:limit]
    chosen = {id(row) for row in targets[: limit - len(flagged)]} | {id(row) for row in flagged}
    return [row for row in targets if id(row) in chosen]


def _paint(state: str, color: bool) -> str:
    if not color:
        return state
    if state == "open":
        return f"{_RED}{state}{_RESET}"
    if state == "half-open":
        return f"{_YELLOW}{state}{_RESET}"
    return state


def _objective(row: ObjectiveRow) -> str:
    if row.target is None or row.ratio is None:
        return "-"
    return f"{row.ratio * 100:g}% <= {row.target * 1000:.0f} ms"


def _burn(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.2f}"
