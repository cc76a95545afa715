"""The pictures of ``llmroute bench --plot``, drawn from the run's JSON (``--json``'s shape).

Two figures: per-target ECDFs of TTFT (a direct run), and a routed run over time (which target
served each request, hedges, failovers, continuations and cache hits marked, and every attempt on
its target's row). Both take the saved data, so ``--replot`` draws them again without traffic.
They build a ``matplotlib.figure.Figure`` (no pyplot, no global backend), so any caller may
inspect the axes before saving.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "HEAVY_TAIL",
    "SCALES",
    "choose_scale",
    "ecdf_figure",
    "is_routed",
    "routed_figure",
    "save",
    "time_label",
]

SCALES = ("auto", "linear", "log")
HEAVY_TAIL = 5.0
"""``auto`` draws TTFT on a log axis when the slowest first token is this many times the median
or more (a stall tail, or targets an order of magnitude apart): on a linear axis the body of
the distribution would be squeezed into its first few pixels."""

_CACHE = "cache"
_FAILOVER_REASONS = ("failover", "retry")


def choose_scale(ttfts_ms: Sequence[float], requested: str) -> str:
    """``linear`` or ``log`` for these TTFTs (milliseconds): ``requested`` unless it is ``auto``."""
    if requested not in SCALES:
        raise ValueError(f"plot scale must be one of {', '.join(SCALES)}, got {requested!r}")
    if requested != "auto":
        return requested
    values = sorted(v for v in ttfts_ms if v > 0)
    if len(values) < 2:
        return "linear"
    median = values[len(values) // 2]
    return "log" if values[-1] >= HEAVY_TAIL * median else "linear"


def time_label(value_ms: float, _position: object = None) -> str:
    """A tick label for a time in milliseconds: ``"50 ms"``, ``"1.5 s"``."""
    if value_ms <= 0:
        return "0"
    if value_ms < 1000:
        return f"{value_ms:.3g} ms"
    return f"{value_ms / 1000:.3g} s"


def _time_axis(axis: Axes, which: str, scale: str) -> None:
    """Put TTFT in milliseconds on ``axis``'s ``which`` (``"x"`` or ``"y"``), in ms or s."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    target = axis.xaxis if which == "x" else axis.yaxis
    if scale == "log":
        (axis.set_xscale if which == "x" else axis.set_yscale)("log")
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        target.set_minor_formatter(NullFormatter())
    else:
        target.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
    target.set_major_formatter(FuncFormatter(time_label))


def _colours(targets: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps["tab10" if len(targets) <= 10 else "tab20"]
    colours: dict[str, Any] = {t: palette(i % palette.N) for i, t in enumerate(targets)}
    colours[_CACHE] = (0.55, 0.55, 0.55, 1.0)
    return colours


def _ok_ttfts_ms(samples: Sequence[dict[str, Any]]) -> list[float]:
    return [s["ttft"] * 1000 for s in samples if s.get("ttft") is not None and not s.get("error")]


def is_routed(data: dict[str, Any]) -> bool:
    """Whether ``data`` (bench's JSON) is a routed run."""
    return bool(data.get("settings", {}).get("routed"))


def ecdf_figure(data: dict[str, Any], scale: str = "auto") -> Figure:
    """An ECDF of TTFT per target, one panel per length class."""
    from matplotlib.figure import Figure

    samples: list[dict[str, Any]] = data["samples"]
    targets: list[str] = data["targets"]
    lengths: dict[str, int] = data["settings"]["lengths"]
    scale = choose_scale(_ok_ttfts_ms(samples), scale)
    figure = Figure(figsize=(5 * len(lengths), 4))
    axes = figure.subplots(1, len(lengths), squeeze=False, sharey=True)
    for axis, (length, tokens) in zip(axes[0], lengths.items(), strict=True):
        for target in targets:
            group = [s for s in samples if s["target"] == target and s["length"] == length]
            values = sorted(_ok_ttfts_ms(group))
            if values:
                # Over every probe: a target whose probes failed never reaches 1.
                shares = [(i + 1) / len(group) for i in range(len(values))]
                axis.step(values, shares, where="post", label=target)
        axis.axhline(0.95, color="grey", linewidth=0.5, linestyle=":")
        _time_axis(axis, "x", scale)
        axis.set_title(f"{length} prompts (~{tokens} tokens)")
        axis.set_xlabel(f"time to first token ({'log scale' if scale == 'log' else 'linear'})")
        axis.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("share of probes at or below")
    if axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(loc="lower right", fontsize="small")
    figure.suptitle(
        "llmroute bench: TTFT distribution per target (failed probes never arrive; dotted: p95)"
    )
    figure.tight_layout()
    return figure


def _side_legend(axis: Axes) -> None:
    if axis.get_legend_handles_labels()[0]:  # nothing drawn (every request failed): no legend
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def _request_marks(samples: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The routed requests of each kind a marker shows (a request may be of several)."""
    marks: dict[str, list[dict[str, Any]]] = {
        "hedged": [],
        "failed over": [],
        "continued": [],
        "cache hit": [],
        "failed": [],
    }
    for sample in samples:
        route = sample.get("route") or {}
        attempts = route.get("attempts", [])
        if route.get("hedges", 0) > 0:
            marks["hedged"].append(sample)
        if any(a["reason"] in _FAILOVER_REASONS for a in attempts):
            marks["failed over"].append(sample)
        if route.get("continued_on"):
            marks["continued"].append(sample)
        if route.get("cache_hit"):
            marks["cache hit"].append(sample)
        if sample.get("error"):
            marks["failed"].append(sample)
    return marks


_START_MARKERS = {
    "first": "|",
    "race": "|",
    "explore": "1",
    "hedge": ">",
    "failover": "s",
    "retry": "s",
    "continuation": "D",
}
"""Where an attempt started, by its reason (the routed figure's bottom panel)."""


def _caller_ms(sample: dict[str, Any]) -> float | None:
    """Where a request sits on the TTFT axis: its first token, or when it failed."""
    value = sample.get("ttft") if not sample.get("error") else sample.get("total")
    return None if value is None else value * 1000


def routed_figure(data: dict[str, Any], scale: str = "auto") -> Figure:
    """A routed run over time: each request's TTFT coloured by the target that served it, with
    hedges, failovers, continuations, cache hits and failures marked (top), and every attempt
    on its target's row (bottom)."""
    from matplotlib.figure import Figure

    samples: list[dict[str, Any]] = sorted(data["samples"], key=lambda s: s["started"])
    targets: list[str] = list(data["targets"])
    route_name = data["settings"]["routed"]
    colours = _colours(targets)
    placed = [v for v in (_caller_ms(s) for s in samples) if v is not None]
    scale = choose_scale(placed, scale)
    figure = Figure(figsize=(11, 7.5))
    top, bottom = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [3, max(1.2, 0.45 * len(targets))]}
    )
    _caller_panel(top, samples, targets, colours, scale)
    _attempts_panel(bottom, samples, targets, colours)
    marks = _request_marks(samples)
    figure.suptitle(
        f"llmroute bench --routed {route_name}: {len(samples)} requests, "
        f"{len(marks['hedged'])} hedged, {len(marks['failed over'])} failed over, "
        f"{len(marks['continued'])} continued, {len(marks['cache hit'])} cache hits, "
        f"{len(marks['failed'])} failed"
    )
    figure.tight_layout()
    return figure


def _caller_panel(
    top: Any, samples: list[dict[str, Any]], targets: list[str], colours: dict[str, Any], scale: str
) -> None:
    """What the caller got, one point per request, coloured by the target that served it, with
    hedges, failovers, continuations, cache hits and failures marked."""
    served: dict[str, list[dict[str, Any]]] = {}
    for sample in samples:
        winner = (sample.get("route") or {}).get("winner")
        if winner is not None and not sample.get("error") and sample.get("ttft") is not None:
            served.setdefault(winner, []).append(sample)
    for winner in [*targets, *sorted(set(served) - set(targets))]:
        group = served.get(winner, [])
        if not group:
            continue
        top.scatter(
            [s["started"] for s in group],
            [s["ttft"] * 1000 for s in group],
            s=16,
            color=colours.get(winner, "black"),
            marker="*" if winner == _CACHE else "o",
            label=f"served by {winner} ({len(group)})",
            zorder=3,
        )
    styles = {
        "hedged": {"marker": "o", "s": 90, "facecolors": "none", "edgecolors": "black"},
        "failed over": {"marker": "s", "s": 110, "facecolors": "none", "edgecolors": "tab:red"},
        "continued": {"marker": "D", "s": 110, "facecolors": "none", "edgecolors": "tab:purple"},
        "cache hit": {"marker": "*", "s": 110, "facecolors": "none", "edgecolors": "dimgray"},
        "failed": {"marker": "x", "s": 60, "color": "tab:red"},
    }
    for kind, group in _request_marks(samples).items():
        points = [(s["started"], _caller_ms(s)) for s in group]
        points = [(x, y) for x, y in points if y is not None]
        if not points:
            continue
        top.scatter(
            [x for x, _ in points],
            [y for _, y in points],
            label=f"{kind} ({len(points)})",
            linewidths=1.0,
            zorder=4,
            **styles[kind],
        )
    _time_axis(top, "y", scale)
    top.set_ylabel(f"TTFT the caller saw ({'log scale' if scale == 'log' else 'linear'})")
    top.grid(True, which="major", alpha=0.3)
    _side_legend(top)


def _attempts_panel(
    bottom: Any, samples: list[dict[str, Any]], targets: list[str], colours: dict[str, Any]
) -> None:
    """Every attempt on its target's row, from its start to its first token (a loser: until the
    caller's first token, when it was cancelled); a marker where it started. A target outside
    ``targets`` gets a row (and a colour) of its own."""
    from matplotlib.collections import LineCollection

    rows = {target: index for index, target in enumerate(targets)}
    segments: dict[str, list[list[tuple[float, float]]]] = {"won": [], "lost": []}
    segment_colours: dict[str, list[Any]] = {"won": [], "lost": []}
    starts: dict[str, list[tuple[float, float, Any]]] = {}
    failures: list[tuple[float, float]] = []
    for sample in samples:
        route = sample.get("route") or {}
        for attempt in route.get("attempts", []):
            row = rows.get(attempt["target"])
            if row is None:
                row = rows[attempt["target"]] = len(rows)
                colours.setdefault(attempt["target"], "black")
            begin = sample["started"] + attempt["started"]
            if attempt.get("ttft") is not None:
                end = begin + attempt["ttft"]
            elif attempt["outcome"] == "cancelled" and sample.get("ttft") is not None:
                end = sample["started"] + sample["ttft"]
            else:
                end = begin
            kind = "won" if attempt["outcome"] == "won" else "lost"
            segments[kind].append([(begin, row), (max(end, begin), row)])
            segment_colours[kind].append(colours[attempt["target"]])
            starts.setdefault(attempt["reason"], []).append(
                (begin, row, colours[attempt["target"]])
            )
            if attempt["outcome"] not in ("won", "cancelled", "pending"):
                failures.append((begin, row))
    for kind, width, alpha in (("lost", 1.0, 0.45), ("won", 3.0, 0.9)):
        if segments[kind]:
            bottom.add_collection(
                LineCollection(
                    segments[kind], colors=segment_colours[kind], linewidths=width, alpha=alpha
                )
            )
    for reason, points in starts.items():
        bottom.scatter(
            [x for x, _, _ in points],
            [y for _, y, _ in points],
            s=28,
            marker=_START_MARKERS.get(reason, "."),
            color=[c for _, _, c in points],
            label=f"{reason} attempt ({len(points)})",
            zorder=3,
        )
    if failures:
        bottom.scatter(
            [x for x, _ in failures],
            [y for _, y in failures],
            s=60,
            marker="x",
            color="tab:red",
            label=f"attempt failed ({len(failures)})",
            zorder=4,
        )
    bottom.set_yticks(range(len(rows)), list(rows))
    bottom.set_ylim(len(rows) - 0.5, -0.5)
    bottom.set_xlabel("seconds since the run began (when each request was sent)")
    bottom.set_title(
        "attempts per target: thick = won, to its first token; thin = lost or cancelled",
        fontsize="small",
    )
    bottom.grid(True, axis="x", alpha=0.3)
    _side_legend(bottom)
    bottom.autoscale_view(scalex=True, scaley=False)


def save(figure: Figure, path: Path | str) -> None:
    """Write ``figure`` in the format its extension names (PNG at 100 dpi, SVG or PDF; see
    :func:`~._format.check_plot_path`)."""
    from ._format import plot_format

    where = os.fspath(path)
    figure.savefig(where, dpi=100, format=plot_format(where) or "png")
