"""Latency objectives per gateway key and route (llmroute/server/_slo.py): met counts and burn
rates over the alerting windows, driven by a fake clock; their Prometheus exposition; the alerting
rules docs/gateway.md gives operators."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmroute.server._metrics import GatewayMetrics
from llmroute.server._slo import ALL_ROUTES, WINDOWS, Objective, SloTracker

from ..clock import FakeClock

P95 = Objective(ttft_ms=300, percentile=95)
P99 = Objective(ttft_ms=300, percentile=99)
FAST = 0.1  # seconds: meets a 300 ms target
SLOW = 0.5  # seconds: misses it
START = 36_000.0  # a multiple of every bucket width (10 s, 60 s, 300 s)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def tracker(**kwargs: int) -> tuple[SloTracker, FakeClock, CollectorRegistry]:
    clock = FakeClock(START)
    registry = CollectorRegistry(auto_describe=True)
    return SloTracker(registry, clock=clock, **kwargs), clock, registry


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition text, parsed back: (name, labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


def test_one_percent_missed_at_p99_burns_at_one() -> None:
    slo, _, _ = tracker()
    for i in range(200):
        slo.record("alice", "chat", P99, SLOW if i % 100 == 0 else FAST, ok=True)
    for window in WINDOWS:
        assert slo.burn_rate("alice", "chat", window) == pytest.approx(1.0)


def test_all_missed_at_p95_burns_at_twenty() -> None:
    slo, _, _ = tracker()
    for _ in range(10):
        slo.record("alice", "chat", P95, SLOW, ok=True)
    assert {w: slo.burn_rate("alice", "chat", w) for w in WINDOWS} == {
        w: pytest.approx(20.0) for w in WINDOWS
    }


def test_errors_and_missing_first_tokens_count_as_misses() -> None:
    slo, _, _ = tracker()
    slo.record("alice", "chat", P95, FAST, ok=False)  # an error answer, however quick
    slo.record("alice", "chat", P95, None, ok=False)  # no first token at all
    slo.record("alice", "chat", P95, None, ok=True)  # ok without a first token: not met either
    slo.record("alice", "chat", P95, 0.3, ok=True)  # exactly the target: met
    assert slo.burn_rate("alice", "chat", "5m") == pytest.approx((3 / 4) / 0.05)
    series = slo.snapshot()["series"][0]
    assert (series["requests"], series["met"]) == (4, 1)


def test_no_request_no_burn_rate() -> None:
    slo, _, _ = tracker()
    assert slo.burn_rate("alice", "chat", "5m") is None
    slo.record("alice", "chat", P95, FAST, ok=True)
    assert slo.burn_rate("alice", "chat", "5m") == 0.0
    assert slo.burn_rate("bob", "chat", "5m") is None


def test_each_window_forgets_what_is_older() -> None:
    slo, clock, _ = tracker()
    for _ in range(4):
        slo.record("alice", "chat", P95, SLOW, ok=True)  # at START: all missed

    def rates() -> dict[str, float | None]:
        return {w: slo.burn_rate("alice", "chat", w) for w in WINDOWS}

    clock.advance(299)
    assert rates() == pytest.approx({"5m": 20.0, "30m": 20.0, "1h": 20.0, "6h": 20.0})
    clock.advance(1)
    assert rates() == pytest.approx({"5m": None, "30m": 20.0, "1h": 20.0, "6h": 20.0})
    slo.record("alice", "chat", P95, FAST, ok=True)  # 5 min in: met
    assert rates() == pytest.approx({"5m": 0.0, "30m": 16.0, "1h": 16.0, "6h": 16.0})
    clock.advance(1800 - 300)
    assert rates() == pytest.approx({"5m": None, "30m": 0.0, "1h": 16.0, "6h": 16.0})
    clock.advance(1800)
    assert rates() == pytest.approx({"5m": None, "30m": None, "1h": 0.0, "6h": 16.0})
    clock.advance(300)
    assert rates() == pytest.approx({"5m": None, "30m": None, "1h": None, "6h": 16.0})
    clock.advance(6 * 3600 - 3900)  # 6 h after START: its misses are out of every window
    assert rates() == pytest.approx({"5m": None, "30m": None, "1h": None, "6h": 0.0})
    clock.advance(300)
    assert rates() == pytest.approx({"5m": None, "30m": None, "1h": None, "6h": None})
    series = slo.snapshot()["series"][0]
    assert (series["requests"], series["met"]) == (5, 1)  # the counters never forget


def test_a_window_that_saw_a_burst_then_quiet_recovers_on_the_fast_window_first() -> None:
    # The point of two windows: the 5m one drops as soon as the burst stops, the 1h one later.
    slo, clock, _ = tracker()
    for _ in range(60):  # 10 minutes of misses, one every 10 s
        slo.record("alice", "chat", P95, SLOW, ok=True)
        clock.advance(10)
    for _ in range(30):  # then 5 minutes of met requests
        slo.record("alice", "chat", P95, FAST, ok=True)
        clock.advance(10)
    assert slo.burn_rate("alice", "chat", "5m") == pytest.approx(0.0)
    assert slo.burn_rate("alice", "chat", "1h") == pytest.approx((60 / 90) / 0.05)


def test_memory_and_work_per_series_stay_bounded() -> None:
    slo, clock, _ = tracker()
    series = slo._series  # pyright: ignore[reportPrivateUsage]

    def cells() -> list[tuple[int, int, int]]:
        (one,) = series.values()
        return [
            cell
            for ring in one.rings
            for cell in zip(ring.stamps, ring.requests, ring.misses, strict=True)
        ]

    changed = []
    for n in (10, 10_000):  # requests held before the one measured: the work must not grow
        for i in range(n):
            slo.record("alice", "chat", P95, SLOW if i % 7 == 0 else FAST, ok=True)
            clock.advance(4.0)  # 10,000 requests span 11 hours: every ring wraps
        before = cells()
        slo.record("alice", "chat", P95, FAST, ok=True)
        changed.append(sum(a != b for a, b in zip(before, cells(), strict=True)))
        assert len(before) == 30 + 60 + 72  # buckets per series, whatever the traffic
    assert changed == [3, 3]  # one bucket per ring, with 10 requests held or 10,000


def test_series_beyond_the_bound_are_not_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slo, _, registry = tracker(max_series=2)
    with caplog.at_level(logging.WARNING, logger="llmroute.server"):
        slo.record("alice", "chat", P95, FAST, ok=True)
        slo.record("bob", "chat", P95, FAST, ok=True)
        for _ in range(3):
            slo.record("carol", "chat", P95, FAST, ok=True)
        slo.record("alice", "chat", P95, FAST, ok=True)  # a known pair is still counted
    assert [r.getMessage() for r in caplog.records] == [
        "SLO: more than 2 (key, route) series; requests of new ones are not counted "
        "(first: key=carol route=chat)"
    ]
    values = samples(registry)
    assert values["llmroute_gateway_slo_requests_total", labels(key="alice", route="chat")] == 2
    assert not [k for k in values if ("key", "carol") in k[1]]


def test_observe_records_the_keys_objective_under_star_and_the_routes_under_its_name() -> None:
    slo, _, _ = tracker()
    mine = Objective(ttft_ms=1000, percentile=99)
    slo.observe("alice", "chat", 0.5, True, key_objective=mine, route_objective=P95)
    slo.observe("alice", "code", 0.5, True, key_objective=mine)
    slo.observe("bob", "chat", 0.5, True, route_objective=P95)
    slo.observe("carol", "chat", 0.5, True)  # no objective applies: nothing recorded
    got = {(s["key"], s["route"]): (s["requests"], s["met"]) for s in slo.snapshot()["series"]}
    assert got == {
        ("alice", ALL_ROUTES): (2, 2),  # within alice's 1 s on both routes
        ("alice", "chat"): (1, 0),  # above the route's 300 ms
        ("bob", "chat"): (1, 0),
    }


def test_objectives_refuse_bad_values_naming_the_field() -> None:
    for kwargs, field in [
        ({"ttft_ms": 0}, "ttft_ms"),
        ({"ttft_ms": -5}, "ttft_ms"),
        ({"ttft_ms": float("inf")}, "ttft_ms"),
        ({"ttft_ms": True}, "ttft_ms"),
        ({"ttft_ms": "300"}, "ttft_ms"),
        ({"ttft_ms": 100, "percentile": 100}, "percentile"),
        ({"ttft_ms": 100, "percentile": 0}, "percentile"),
    ]:
        with pytest.raises(ValueError, match=f"^{field} must"):
            Objective(**kwargs)
    assert Objective(250).percentile == 95.0


def test_exposition_has_counters_objective_and_burn_rates_labelled_by_names() -> None:
    slo, _, registry = tracker()
    for i in range(20):
        slo.record("alice", "chat", P95, SLOW if i < 2 else FAST, ok=True)
    slo.record("bob", ALL_ROUTES, Objective(ttft_ms=2000, percentile=99), 2.5, ok=True)
    values = samples(registry)
    alice = labels(key="alice", route="chat")
    bob = labels(key="bob", route="*")
    assert values["llmroute_gateway_slo_requests_total", alice] == 20
    assert values["llmroute_gateway_slo_met_total", alice] == 18
    assert values["llmroute_gateway_slo_requests_total", bob] == 1
    assert values["llmroute_gateway_slo_met_total", bob] == 0  # present at 0 for the rules
    assert values["llmroute_gateway_slo_objective_ratio", alice] == 0.95
    assert values["llmroute_gateway_slo_ttft_target_seconds", alice] == 0.3
    assert values["llmroute_gateway_slo_objective_ratio", bob] == 0.99
    assert values["llmroute_gateway_slo_ttft_target_seconds", bob] == 2.0
    for window in WINDOWS:
        burn = values[
            "llmroute_gateway_slo_burn_rate", labels(key="alice", route="chat", window=window)
        ]
        assert burn == pytest.approx((2 / 20) / 0.05)
        burn = values["llmroute_gateway_slo_burn_rate", labels(key="bob", route="*", window=window)]
        assert burn == pytest.approx(100.0)
    # Every label is one passed in: key names and routes, nothing else.
    keys = {dict(ls)["key"] for _, ls in values if ls}
    assert keys == {"alice", "bob"}
    assert {ls for name, ls in values if name == "llmroute_gateway_slo_burn_rate"} == {
        labels(key=k, route=r, window=w)
        for k, r in [("alice", "chat"), ("bob", "*")]
        for w in WINDOWS
    }


def test_burn_rates_leave_the_exposition_with_their_window() -> None:
    slo, clock, registry = tracker()
    slo.record("alice", "chat", P95, SLOW, ok=True)
    clock.advance(3600)
    windows = {
        dict(ls)["window"]
        for name, ls in samples(registry)
        if name == "llmroute_gateway_slo_burn_rate"
    }
    assert windows == {"6h"}


def test_a_changed_objective_shows_at_once_and_judges_new_requests() -> None:
    slo, _, registry = tracker()
    slo.record("alice", "chat", P95, 0.5, ok=True)  # missed at 300 ms
    looser = Objective(ttft_ms=1000, percentile=99)
    slo.record("alice", "chat", looser, 0.5, ok=True)  # met at 1 s
    values = samples(registry)
    assert (
        values["llmroute_gateway_slo_ttft_target_seconds", labels(key="alice", route="chat")] == 1.0
    )
    assert values["llmroute_gateway_slo_met_total", labels(key="alice", route="chat")] == 1
    # The earlier miss keeps its verdict, against the new objective's budget.
    assert slo.burn_rate("alice", "chat", "5m") == pytest.approx(0.5 / 0.01)


def test_forget_drops_a_revoked_keys_series() -> None:
    slo, _, registry = tracker()
    slo.record("alice", "chat", P95, FAST, ok=True)
    slo.record("alice", ALL_ROUTES, P95, FAST, ok=True)
    slo.record("bob", "chat", P95, FAST, ok=True)
    slo.forget("alice")
    assert {dict(ls)["key"] for _, ls in samples(registry) if ls} == {"bob"}
    assert [s["key"] for s in slo.snapshot()["series"]] == ["bob"]
    assert slo.burn_rate("alice", "chat", "5m") is None


def test_snapshot_is_json() -> None:
    slo, clock, _ = tracker()
    slo.record("alice", "chat", P95, SLOW, ok=True)
    clock.advance(600)
    snap = json.loads(json.dumps(slo.snapshot()))
    assert snap == {
        "windows": ["5m", "30m", "1h", "6h"],
        "series": [
            {
                "key": "alice",
                "route": "chat",
                "objective": {"ttft_ms": 300, "percentile": 95},
                "requests": 1,
                "met": 0,
                "burn_rate": {"5m": None, "30m": 20.0, "1h": 20.0, "6h": 20.0},
            }
        ],
    }


def test_the_gateway_registry_takes_the_tracker() -> None:
    metrics = GatewayMetrics()
    slo = SloTracker(metrics.registry, clock=FakeClock(START))
    slo.record("alice", "chat", P95, FAST, ok=True)
    text = metrics.exposition().decode()
    assert 'llmroute_gateway_slo_met_total{key="alice",route="chat"} 1.0' in text
    assert 'llmroute_gateway_slo_burn_rate{key="alice",route="chat",window="1h"} 0.0' in text


def _rules_block() -> str:
    text = DOCS.read_text()
    section = text.split("## Latency objectives (SLOs)", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1
    return blocks[0]


def test_the_documented_alerting_rules_parse_and_name_only_exported_metrics() -> None:
    yaml = pytest.importorskip("yaml")
    rules = yaml.safe_load(_rules_block())
    (group,) = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert set(alerts) == {"LlmrouteSloFastBurn", "LlmrouteSloSlowBurn", "LlmrouteSloBudgetDrain"}
    slo, _, registry = tracker()
    slo.record("alice", "chat", P95, FAST, ok=True)
    exported = {name for name, _ in samples(registry)}
    named: set[str] = set()
    for rule in alerts.values():
        assert set(rule["labels"]) >= {"severity"}
        named |= set(re.findall(r"llmroute_\w+", rule["expr"]))
    assert named == {
        "llmroute_gateway_slo_requests_total",
        "llmroute_gateway_slo_met_total",
        "llmroute_gateway_slo_objective_ratio",
    }
    assert named <= exported
    windows = {rule: set(re.findall(r"\[(\w+)\]", alerts[rule]["expr"])) for rule in alerts}
    assert windows == {
        "LlmrouteSloFastBurn": {"1h", "5m"},
        "LlmrouteSloSlowBurn": {"6h", "30m"},
        "LlmrouteSloBudgetDrain": {"3d", "6h"},
    }
