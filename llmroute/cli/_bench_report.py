"""``llmroute bench``'s results: the summary by target and length class, its tables, the run as
``--json`` writes it (without the targets' keys), its picture, and the check of a saved run
that ``--replot`` draws again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from ._bench_probe import LENGTHS, Probe, _Endpoint, _scrub
from ._format import ms, percentiles, table


def _saved_run_problem(data: Any) -> str | None:
    """Why ``data`` is not a bench run the pictures can draw, naming the field; else ``None``."""
    if not isinstance(data, dict):
        return "not a JSON object"
    fields: dict[str, type] = {"settings": dict, "targets": list, "samples": list}
    for name, kind in fields.items():
        if not isinstance(data.get(name), kind):
            return f"the field {name!r} is missing or not a {kind.__name__}"
    lengths = data["settings"].get("lengths")
    if not isinstance(lengths, dict) or not lengths:
        return "the field 'settings.lengths' is missing or empty (one length class at least)"
    for index, sample in enumerate(data["samples"]):
        if not isinstance(sample, dict) or not {"target", "length", "started"} <= sample.keys():
            return f"samples[{index}] lacks 'target', 'length' or 'started'"
        route = sample.get("route")
        if route is None:
            continue
        attempts = route.get("attempts") if isinstance(route, dict) else None
        if not isinstance(attempts, list) or not all(
            isinstance(a, dict) and {"target", "reason", "outcome", "started"} <= a.keys()
            for a in attempts
        ):
            return (
                f"samples[{index}].route lacks 'attempts' (each with 'target', 'reason', "
                "'outcome' and 'started')"
            )
    return None


def summarize(
    samples: Sequence[Probe], targets: Sequence[str], lengths: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per target and length class: probes, errors, TTFT p50/p95/p99, mean tokens/s,
    and for routed probes what 1,000 such requests cost (``None`` unless every one's cost is
    known)."""
    rows: list[dict[str, Any]] = []
    for target in targets:
        for length in lengths:
            group = [s for s in samples if s.target == target and s.length == length]
            ttfts = [s.ttft for s in group if s.ttft is not None and s.error is None]
            speeds = [s.tokens_per_s for s in group if s.tokens_per_s is not None]
            p50, p95, p99 = percentiles(ttfts)
            rows.append(
                {
                    "target": target,
                    "length": length,
                    "probes": len(group),
                    "ok": len(ttfts),
                    "errors": sum(s.error is not None for s in group),
                    "ttft_p50": p50,
                    "ttft_p95": p95,
                    "ttft_p99": p99,
                    "tokens_per_s_mean": sum(speeds) / len(speeds) if speeds else None,
                    **_cost_per_1000(group),
                }
            )
    return rows


def _cost_per_1000(group: Sequence[Probe]) -> dict[str, Any]:
    """What 1,000 of the group's routed requests cost, on their mean (hedges, retries and
    continuations included; failed requests too, since their attempts were billed)."""
    routed = [s for s in group if s.route is not None]
    currencies = {s.currency for s in routed}
    if not routed or any(s.cost is None for s in routed) or len(currencies) != 1:
        return {"cost_per_1000": None, "currency": None}
    total = sum((Decimal(s.cost or 0) for s in routed), Decimal(0))
    return {"cost_per_1000": str(total * 1000 / len(routed)), "currency": currencies.pop()}


def _summary_table(summary: list[dict[str, Any]], *, routed: bool = False) -> Any:
    def speed(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    def money(row: dict[str, Any]) -> str:
        value = row.get("cost_per_1000")
        return "unknown" if value is None else f"{Decimal(value):.4f} {row['currency']}"

    def cells(row: dict[str, Any]) -> list[Any]:
        return [
            row["target"],
            f"{row['length']} (~{LENGTHS[row['length']]} tok)",
            row["ok"],
            row["errors"],
            ms(row["ttft_p50"]),
            ms(row["ttft_p95"]),
            ms(row["ttft_p99"]),
            speed(row["tokens_per_s_mean"]),
            *([money(row)] if routed else []),
        ]

    columns = ["length", "n", "errors", "p50", "p95", "p99", "tokens/s"]
    if routed:
        return table(
            "Time to first token through the route, as the caller saw it",
            ["route", *columns, "cost/1k"],
            [cells(row) for row in summary],
        )
    return table(
        "Time to first token per target and prompt length (each target probed alone)",
        ["target", *columns],
        [cells(row) for row in summary],
    )


def _served_table(samples: list[Probe], targets: list[str]) -> Any:
    """A routed run by the target that served each request: its share, hedges it won, its TTFT."""
    served: dict[str, list[Probe]] = {name: [] for name in targets}
    for sample in samples:
        if sample.route is not None and sample.error is None and sample.route["winner"]:
            served.setdefault(sample.route["winner"], []).append(sample)
    rows: list[list[Any]] = []
    for name, group in served.items():
        ttfts = [s.ttft for s in group if s.ttft is not None]
        p50, p95, _ = percentiles(ttfts)
        hedge_wins = sum(
            any(a["reason"] == "hedge" and a["outcome"] == "won" for a in s.route["attempts"])
            for s in group
            if s.route is not None
        )
        rows.append([name, len(group), hedge_wins, ms(p50), ms(p95)])
    failed = sum(s.error is not None for s in samples)
    hedged = sum(s.route is not None and s.route["hedges"] > 0 for s in samples)
    rows.append(["(failed)", failed, "", "", ""])
    return table(
        f"Who served the routed requests ({hedged} of {len(samples)} hedged)",
        ["served by", "requests", "hedges won", "p50", "p95"],
        rows,
    )


def _run_data(
    samples: list[Probe],
    summary: list[dict[str, Any]],
    endpoints: list[_Endpoint],
    lengths: list[str],
    args: argparse.Namespace,
    wall: float,
    route_targets: list[str] | None,
) -> dict[str, Any]:
    """The run as ``--json`` writes it (and as ``--plot`` and ``--replot`` draw it)."""
    rows: list[dict[str, Any]] = []
    for sample in sorted(samples, key=lambda s: s.started):
        row = dataclasses.asdict(sample)
        if row["route"] is None:
            del row["route"]  # a direct probe: the file stays as it was before --routed
        rows.append(row)
    return {
        "version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {
            "probes": args.probes,
            "concurrency": args.concurrency,
            "lengths": {name: LENGTHS[name] for name in lengths},
            "max_tokens": args.max_tokens,
            "nonce": args.nonce,
            "repeat": args.repeat,
            "simulator": args.simulator,
            "timeout": args.timeout,
            "routed": endpoints[0].target if route_targets is not None else None,
        },
        "targets": route_targets if route_targets is not None else [e.target for e in endpoints],
        "wall_seconds": wall,
        "summary": summary,
        "samples": rows,
    }


def _json_text(data: dict[str, Any], endpoints: list[_Endpoint]) -> str:
    return _scrub(json.dumps(data, indent=2), [s for e in endpoints for s in e.secrets])


def _write_json(path: Path, data: dict[str, Any], endpoints: list[_Endpoint]) -> None:
    path.write_text(_json_text(data, endpoints) + "\n", encoding="utf-8")


def _plot(path: Path, data: dict[str, Any], scale: str) -> None:
    """The picture of a run: per-target TTFT ECDFs, or a routed run over time."""
    from ._bench_plot import ecdf_figure, is_routed, routed_figure, save

    figure = routed_figure(data, scale) if is_routed(data) else ecdf_figure(data, scale)
    save(figure, path)
