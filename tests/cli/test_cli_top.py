"""``llmroute top``: the figures from recorded exposition text, then ``--once`` against a real
gateway (simulators behind it) and against nothing, no terminal needed."""

from __future__ import annotations

import http.server
import io
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
import trustme

from llmroute.cli import main
from llmroute.cli._top import ONCE_REQUESTS, TopError, _Screen, metrics_url
from llmroute.cli._topframe import (
    Exposition,
    NotMetrics,
    build_frame,
    histogram_quantile,
    render,
)
from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

GW_KEY = "gw-top-key-0123456789abcdef"
OTHER_KEY = "gw-top-other-key-fedcba9876543210"
UPSTREAM_KEY = "sk-upstream-top-NEVER-SHOWN"

# Two scrapes of one process, as a gateway's /metrics serves them (trimmed to what top reads).
BEFORE = """\
# TYPE llmroute_ttft_seconds histogram
llmroute_ttft_seconds_bucket{le="0.1",target="a:m"} 10.0
llmroute_ttft_seconds_bucket{le="0.2",target="a:m"} 10.0
llmroute_ttft_seconds_bucket{le="0.5",target="a:m"} 10.0
llmroute_ttft_seconds_bucket{le="+Inf",target="a:m"} 10.0
llmroute_ttft_seconds_count{target="a:m"} 10.0
llmroute_ttft_seconds_sum{target="a:m"} 0.5
# TYPE llmroute_attempts_total counter
llmroute_attempts_total{outcome="won",reason="first",target="a:m"} 10.0
llmroute_attempts_total{outcome="error",reason="first",target="a:m"} 1.0
llmroute_attempts_total{outcome="won",reason="first",target="c:m"} 50.0
# TYPE llmroute_in_flight gauge
llmroute_in_flight{target="a:m"} 0.0
llmroute_in_flight{target="b:m"} 0.0
llmroute_in_flight{target="c:m"} 0.0
# TYPE llmroute_gateway_tokens_total counter
llmroute_gateway_tokens_total{key="app",kind="prompt"} 100.0
llmroute_gateway_tokens_total{key="app",kind="completion"} 40.0
# TYPE llmroute_gateway_slo_requests_total counter
llmroute_gateway_slo_requests_total{key="app",route="chat"} 10.0
# TYPE llmroute_gateway_slo_met_total counter
llmroute_gateway_slo_met_total{key="app",route="chat"} 10.0
"""

AFTER = """\
# TYPE llmroute_ttft_seconds histogram
llmroute_ttft_seconds_bucket{le="0.1",target="a:m"} 10.0
llmroute_ttft_seconds_bucket{le="0.2",target="a:m"} 14.0
llmroute_ttft_seconds_bucket{le="0.5",target="a:m"} 20.0
llmroute_ttft_seconds_bucket{le="+Inf",target="a:m"} 20.0
llmroute_ttft_seconds_count{target="a:m"} 20.0
llmroute_ttft_seconds_sum{target="a:m"} 3.5
llmroute_ttft_seconds_bucket{le="0.1",target="b:m"} 0.0
llmroute_ttft_seconds_bucket{le="0.2",target="b:m"} 5.0
llmroute_ttft_seconds_bucket{le="0.5",target="b:m"} 5.0
llmroute_ttft_seconds_bucket{le="+Inf",target="b:m"} 5.0
llmroute_ttft_seconds_count{target="b:m"} 5.0
llmroute_ttft_seconds_sum{target="b:m"} 0.75
# TYPE llmroute_attempts_total counter
llmroute_attempts_total{outcome="won",reason="first",target="a:m"} 20.0
llmroute_attempts_total{outcome="error",reason="first",target="a:m"} 3.0
llmroute_attempts_total{outcome="rate_limited",reason="failover",target="a:m"} 1.0
llmroute_attempts_total{outcome="won",reason="hedge",target="b:m"} 5.0
llmroute_attempts_total{outcome="cancelled",reason="hedge",target="b:m"} 2.0
llmroute_attempts_total{outcome="won",reason="first",target="c:m"} 5.0
# TYPE llmroute_in_flight gauge
llmroute_in_flight{target="a:m"} 3.0
llmroute_in_flight{target="b:m"} 0.0
llmroute_in_flight{target="c:m"} 0.0
# TYPE llmroute_breaker_state gauge
llmroute_breaker_state{llmroute_breaker_state="closed",target="a:m"} 1.0
llmroute_breaker_state{llmroute_breaker_state="open",target="a:m"} 0.0
llmroute_breaker_state{llmroute_breaker_state="closed",target="b:m"} 0.0
llmroute_breaker_state{llmroute_breaker_state="open",target="b:m"} 1.0
# TYPE llmroute_target_ttft_p95_seconds gauge
llmroute_target_ttft_p95_seconds{target="a:m"} 0.41
# TYPE llmroute_gateway_tokens_total counter
llmroute_gateway_tokens_total{key="app",kind="prompt"} 160.0
llmroute_gateway_tokens_total{key="app",kind="completion"} 70.0
# TYPE llmroute_gateway_slo_requests_total counter
llmroute_gateway_slo_requests_total{key="app",route="chat"} 20.0
# TYPE llmroute_gateway_slo_met_total counter
llmroute_gateway_slo_met_total{key="app",route="chat"} 18.0
# TYPE llmroute_gateway_slo_objective_ratio gauge
llmroute_gateway_slo_objective_ratio{key="app",route="chat"} 0.95
# TYPE llmroute_gateway_slo_ttft_target_seconds gauge
llmroute_gateway_slo_ttft_target_seconds{key="app",route="chat"} 0.8
# TYPE llmroute_gateway_slo_burn_rate gauge
llmroute_gateway_slo_burn_rate{key="app",route="chat",window="5m"} 4.0
# TYPE llmroute_tier_decisions_total counter
llmroute_tier_decisions_total{class="simple",model="auto",reason="classifier",tier="small"} 3.0
llmroute_tier_decisions_total{class="hard",model="auto",reason="classifier",tier="large"} 1.0
"""


def section(lines: list[str], title: str) -> list[str]:
    """The lines of the section under ``title``, to the next blank line."""
    start = next(index for index, line in enumerate(lines) if line.startswith(title))
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start + 1 : end]


def row_of(lines: list[str], name: str) -> str:
    found = [line for line in lines if line.startswith(name + " ")]
    assert len(found) == 1, (name, lines)
    return found[0]


def test_percentiles_come_from_the_buckets_growth_between_scrapes() -> None:
    frame = build_frame(Exposition.parse(AFTER), Exposition.parse(BEFORE), 2.0)
    a, b, c = frame.targets
    # a's interval: 4 in (0.1, 0.2], 6 in (0.2, 0.5]; p95 is rank 9.5 of 10, 5.5 of the 6 in
    # the (0.2, 0.5] bucket: 0.2 + 0.3 * 5.5 / 6.
    assert a.p95 == pytest.approx(0.475)
    assert a.p50 == pytest.approx(0.25)
    assert a.router_p95 == pytest.approx(0.41)
    assert (a.answers, a.errors, a.in_flight, a.state) == (10, 3, 3, "closed")
    assert (b.answers, b.hedges, b.hedges_won, b.state) == (5, 7, 5, "open")
    assert b.p95 == pytest.approx(0.1 + 0.1 * 4.75 / 5)
    assert c.answers == 5  # its counter went from 50 to 5: the process restarted
    assert a.share == pytest.approx(0.5) and b.share == pytest.approx(0.25)
    (key,) = frame.keys
    assert (key.name, key.prompt_tokens, key.completion_tokens) == ("app", 60, 30)
    (objective,) = frame.objectives
    assert (objective.requests, objective.met, objective.burn) == (10, 8, {"5m": 4.0})
    assert [(t.tier, t.share) for t in frame.tiers] == [("large", 0.25), ("small", 0.75)]

    lines = render(frame, source="recorded", interval=2.0, clock=lambda: 0.0)
    assert "figures over the last 2.0 s" in lines
    assert "475 ms" in row_of(lines, "a:m") and row_of(lines, "a:m").endswith("closed")
    assert row_of(lines, "b:m").endswith("open")
    assert "auto: large 25% (1), small 75% (3)" in lines
    assert "80%" in row_of(lines, "app  chat")  # the met share over the interval
    assert not any("\x1b" in line for line in lines)


def test_the_first_frame_covers_the_time_since_the_start() -> None:
    frame = build_frame(Exposition.parse(AFTER), None, None)
    a = frame.targets[0]
    # Cumulative: 10 at most 0.1, 4 in (0.1, 0.2], 6 in (0.2, 0.5]; rank 19 of 20.
    assert a.p95 == pytest.approx(0.2 + 0.3 * 5 / 6)
    assert a.answers == 20 and frame.targets[2].answers == 5
    lines = render(frame, source="recorded", interval=2.0, clock=lambda: 0.0)
    assert any("since the process started" in line for line in lines)


def test_histogram_quantile_matches_prometheus() -> None:
    inf = float("inf")
    assert histogram_quantile(0.95, []) is None
    assert histogram_quantile(0.95, [(0.1, 0.0), (inf, 0.0)]) is None
    assert histogram_quantile(0.5, [(0.1, 4.0), (inf, 4.0)]) == pytest.approx(0.05)
    # A rank beyond the last finite bound gives that bound, as histogram_quantile does.
    assert histogram_quantile(0.99, [(0.1, 1.0), (0.2, 2.0), (inf, 10.0)]) == 0.2
    # Buckets that grew by nothing below the rank are skipped, not interpolated into.
    assert histogram_quantile(0.5, [(0.1, 0.0), (0.2, 0.0), (0.5, 2.0), (inf, 2.0)]) == 0.35


def test_twenty_targets_fit_a_small_terminal() -> None:
    lines_in = ["# TYPE llmroute_attempts_total counter"]
    for index in range(20):
        name = f"provider-with-a-long-name-{index:02d}:some-org/a-very-long-model-name-v2"
        lines_in.append(
            f'llmroute_attempts_total{{outcome="won",reason="first",target="{name}"}} {index}'
        )
        for state in ("closed", "open"):  # the least busy one's circuit is open
            lines_in.append(
                f'llmroute_breaker_state{{llmroute_breaker_state="{state}",target="{name}"}} '
                f"{int((state == 'open') == (index == 0))}"
            )
    frame = build_frame(Exposition.parse("\n".join(lines_in) + "\n"), None, None)
    failed = "the last scrape failed: " + "a long sentence " * 10
    lines = render(frame, source="recorded", interval=2.0, width=80, height=24, note=failed)
    assert len(lines) <= 24
    assert max(len(line) for line in lines) <= 80  # cut, not wrapped
    assert lines[2].startswith("the last scrape failed: ") and lines[2].endswith("...")
    assert any(line.startswith("... ") and "more" in line for line in lines)
    body = [line for line in lines if line.startswith("provider-")]
    assert "~" in body[0].split()[0]  # shortened in the middle
    assert body[0].split()[1] == "10%"  # the busiest first: 19 of the 190 answers
    shares = [int(line.split()[1].rstrip("%")) for line in body]
    assert shares == sorted(shares, reverse=True)
    assert body[-1].endswith("open")  # never cut: the last by share, shown in the last place
    assert sum(line.endswith("closed") for line in body) == len(body) - 1
    everything = render(frame, source="recorded", interval=2.0)
    assert sum(line.startswith("provider-") for line in everything) == 20


def test_the_live_view_compares_each_scrape_with_the_one_before() -> None:
    """The refresh loop without a terminal: frames one after another, a failed scrape shown
    as a sentence over the last figures, and no ANSI codes in a pipe."""
    scrapes: list[Exposition | TopError] = [
        Exposition.parse(BEFORE),
        TopError("cannot reach http://gw/metrics: refused"),
        Exposition.parse(AFTER),
    ]

    async def scrape() -> Exposition:
        item = scrapes.pop(0)
        if isinstance(item, TopError):
            raise item
        return item

    out = io.StringIO()
    view = _Screen(out=out, interval=0.001, once=False, frames=3)
    assert anyio.run(view.watch, scrape, "recorded") == 0
    frames = out.getvalue().split("llmroute top: recorded")[1:]
    assert len(frames) == 3 and not scrapes
    assert "since the process started" in frames[0]
    assert "the last scrape failed: cannot reach http://gw/metrics: refused" in frames[1]
    assert "since the process started" in frames[1]  # still the first figures
    assert "figures over the last" in frames[2]
    assert "475 ms" in row_of(frames[2].splitlines(), "a:m")
    assert "\x1b" not in out.getvalue()


@pytest.mark.parametrize(
    "text", ["<html><body>hello</body></html>", '{"error": "nope"}', "process_cpu 1.0\n"]
)
def test_pages_that_are_not_llmroute_metrics_are_refused(text: str) -> None:
    with pytest.raises(NotMetrics):
        Exposition.parse(text)


def test_metrics_url_fills_in_the_path() -> None:
    assert metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("https://gw.example/v1") == "https://gw.example/metrics"
    assert metrics_url("http://app:9464/custom") == "http://app:9464/custom"


# -- against a running gateway ------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=5, ttft_median=0.12, ttft_sigma=0.0)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(sim: Simulator, slow_sim: Simulator) -> Iterator[Gateway]:
    """Three targets: one fast, one slower (asked on its own route too, so it has answers),
    one whose every answer is a 500 (its circuit opens at the first failure and stays open)."""
    config: dict[str, Any] = {
        "providers": {
            "fast": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY},
            "slow": {"base_url": slow_sim.base_url, "api_key": UPSTREAM_KEY},
            "failing": {
                "base_url": sim.base_url,
                "api_key": UPSTREAM_KEY,
                "headers": {"x-sim-fault": "500"},
            },
        },
        "models": {
            "chat": {"targets": ["fast:sim-small", "slow:sim-small"], "policy": "race"},
            "slow": {"targets": ["slow:sim-small"]},
            "broken": {"targets": ["failing:sim-small"]},
        },
        "routing": {"explore": 0, "breaker_failures": 1, "breaker_cooldown": "600s"},
        "gateway": {"keys": {"ci": "GW_KEY_TOP", "other": "GW_KEY_OTHER"}},
    }
    environ = {"GW_KEY_TOP": GW_KEY, "GW_KEY_OTHER": OTHER_KEY}
    with Gateway(config, environ=environ, verify=sim.ssl_context(), max_retries=0) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=GW_KEY, max_retries=0)
        for index in range(4):  # fast wins the races; slow answers its own route
            stream = client.chat.completions.create(
                model="chat" if index % 2 else "slow",
                messages=[{"role": "user", "content": f"hi {index}"}],
                stream=True,
            )
            for _ in stream:
                pass
        for index in range(2):  # not streamed: a time to the whole answer, no TTFT
            client.chat.completions.create(
                model="slow", messages=[{"role": "user", "content": f"whole {index}"}]
            )
        other = openai.OpenAI(base_url=server.base_url, api_key=OTHER_KEY, max_retries=0)
        for caller in (client, other):  # a key's failures alone open only its own breaker
            with pytest.raises(openai.APIError):
                caller.chat.completions.create(
                    model="broken", messages=[{"role": "user", "content": "fail"}]
                )
            caller.close()
        answered(server, 8)
        yield server


def answered(gateway: Gateway, count: int) -> None:
    """Wait until the gateway counted ``count`` requests (it counts each after its response
    went out, so a client can be a moment ahead of the counters)."""
    registry = gateway.app.metrics.registry
    for _ in range(500):  # a hang guard only: 10 s of polls
        total = sum(
            sample.value
            for metric in registry.collect()
            for sample in metric.samples
            if sample.name == "llmroute_gateway_requests_total"
        )
        if total >= count:
            return
        time.sleep(0.02)


def root(gateway: Gateway) -> str:
    return gateway.base_url.removesuffix("/v1")


def top(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["top", *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMROUTE_GATEWAY_KEY", raising=False)


def test_once_against_a_gateway_shows_every_target_with_its_p95_and_state(
    gateway: Gateway, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMROUTE_GATEWAY_KEY", GW_KEY)
    status, out, err = top(capsys, "--once", gateway.base_url)  # .../v1 means its /metrics
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"llmroute top: {root(gateway)}/metrics")
    lines = section(lines, "targets (3)") + section(lines, "gateway keys")
    header = row_of(lines, "target")
    assert header.split()[:7] == ["target", "answers", "share", "p50", "p95", "p99", "router"]
    p95 = header.split().index("p95")
    for name in ("fast:sim-small", "slow:sim-small"):
        row = row_of(lines, name)
        assert row.split()[p95 + 1] == "ms" or row.split()[p95].endswith("ms"), row
        assert row.endswith("closed")
    failing = row_of(lines, "failing:sim-small")
    assert failing.endswith("open") and failing.split()[-2] == "0"  # in flight
    assert row_of(lines, "failing:sim-small").split()[-3] == "2"  # its two errors
    # The key ci's 6 + 1 API calls (4 streamed, 2 not), and not top's scrapes of /metrics.
    assert row_of(lines, "ci").split()[1] == "7"
    assert row_of(lines, "other").split()[1] == "1"
    assert row_of(lines, "key").split()[-1] == "spend"
    assert row_of(lines, "ci").split()[-1] == "-"  # its targets have no price
    assert "\x1b" not in out
    assert GW_KEY not in out and UPSTREAM_KEY not in out


def test_once_with_two_scrapes_shows_the_interval(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = top(capsys, "--once", "--interval", "0.2", "--key", GW_KEY, root(gateway))
    assert status == 0
    assert "figures over the last" in out
    # Nothing was asked between the two scrapes: no percentile, no answer.
    assert row_of(out.splitlines(), "fast:sim-small").split()[1:4] == ["0", "-", "-"]


def test_rows_and_sort(gateway: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = top(
        capsys, "--once", "--rows", "1", "--sort", "errors", "--key", GW_KEY, root(gateway)
    )
    assert status == 0
    lines = section(out.splitlines(), "targets (3)")
    assert row_of(lines, "failing:sim-small")
    assert not any(line.startswith(("fast:", "slow:")) for line in lines)
    assert "... 2 more (--rows or --sort shows others)" in lines


def test_a_missing_or_wrong_key_is_a_sentence(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = top(capsys, "--once", root(gateway))
    assert (status, out) == (2, "")
    assert err == (
        f"llmroute top: {root(gateway)}/metrics needs a key (401); give one of the gateway's "
        "keys (its admin key, if it has one) with --key or $LLMROUTE_GATEWAY_KEY\n"
    )
    wrong = "gw-wrong-key-SHOULD-NOT-APPEAR"
    status, out, err = top(capsys, "--once", "--key", wrong, root(gateway))
    assert status == 2
    # The live page's words: "Refused (401): that is not a key of this gateway."
    assert "refused the key given (401): that is not a key of this gateway;" in err
    assert wrong not in err and wrong not in out


def test_once_shows_the_time_of_answers_that_were_not_streamed(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two answers of route slow were not streamed: they have no TTFT, but their time to the
    whole answer shows, for the route (the caller's) and its target."""
    status, out, _ = top(capsys, "--once", "--key", GW_KEY, root(gateway))
    assert status == 0
    whole = section(out.splitlines(), "not streamed: time to the whole answer")
    assert whole[0].split()[:4] == ["route", "/", "target", "answers"]
    for name in ("slow", "slow:sim-small"):
        row = row_of(whole, name).split()
        assert row[1] == "2" and row[3] == "ms" and row[2] != "-", row
    assert [line.split()[0] for line in whole[1:]] == ["slow", "slow:sim-small"]  # chat streamed


def test_a_team_key_where_an_admin_key_is_needed_is_told_so(
    sim: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """With an admin key configured, /metrics refuses a team's key (403): the sentence says an
    admin key is needed, as the live page does ("that key is not an admin key")."""
    config = {
        "providers": {"p": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY}},
        "models": {"chat": {"targets": ["p:sim-small"]}},
        "gateway": {
            "keys": {"team": "GW_KEY_TOP", "ops": "GW_KEY_OTHER"},
            "tenants": {"ops": {"admin": True}},
        },
    }
    environ = {"GW_KEY_TOP": GW_KEY, "GW_KEY_OTHER": OTHER_KEY}
    with Gateway(config, environ=environ, verify=sim.ssl_context()) as server:
        status, out, err = top(capsys, "--once", "--key", GW_KEY, server.base_url)
        assert (status, out) == (2, "")
        assert err == (
            f"llmroute top: {root(server)}/metrics refused the key given (403): that key is not "
            "an admin key; give an admin key (admin = true) with --key or $LLMROUTE_GATEWAY_KEY\n"
        )
        status, out, err = top(capsys, "--once", "--key", OTHER_KEY, server.base_url)
        assert (status, err) == (0, "")


def test_a_page_that_is_not_metrics_is_a_sentence(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = top(capsys, "--once", "--key", GW_KEY, root(gateway) + "/health")
    assert status == 2
    assert err.startswith(f"llmroute top: {root(gateway)}/health is not a metrics page: ")
    assert err.rstrip().endswith("it answered application/json")
    status, _, err = top(capsys, "--once", "--key", GW_KEY, root(gateway) + "/nowhere")
    assert status == 2 and "no page there (404)" in err


ADMIN_KEY = "gw-top-admin-key-0123456789abcdef"


def test_the_keys_table_and_admin_usage_count_api_calls_alike(
    sim: Simulator, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A key's requests are its API calls, in ``llmroute top`` as in ``/admin/usage``: not the
    live page's files, its polls, the usage reads or /metrics scrapes (top once counted them
    for the key that made them, or for "(no valid key)"). Reads of admin data are logged with
    their path and key name; an admin path's 401 and 403 are not to be stored."""
    config: dict[str, Any] = {
        "providers": {"fast": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY}},
        "models": {"chat": {"targets": ["fast:sim-small"]}},
        "routing": {"explore": 0},
        "gateway": {
            "keys": {"ci": "GW_KEY_TOP", "ops": "GW_KEY_ADMIN"},
            "tenants": {"ops": {"admin": True}},
            "live_page": True,
        },
    }
    environ = {"GW_KEY_TOP": GW_KEY, "GW_KEY_ADMIN": ADMIN_KEY}
    ci, ops = {"authorization": f"Bearer {GW_KEY}"}, {"authorization": f"Bearer {ADMIN_KEY}"}
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    caplog.set_level(logging.INFO, logger="llmroute.server")
    with (
        Gateway(config, environ=environ, verify=sim.ssl_context(), max_retries=0) as gateway,
        httpx.Client(base_url=root(gateway), timeout=30) as http,
    ):
        calls = [
            http.post("/v1/chat/completions", json=chat, headers=ci),
            http.post("/v1/chat/completions", json={**chat, "n": 0}, headers=ci),
            http.post("/v1/chat/completions", json={**chat, "model": "nope"}, headers=ci),
            http.get("/v1/models", headers=ci),
        ]
        assert [c.status_code for c in calls] == [200, 400, 404, 200]
        for path in ("/admin/live", "/admin/live/live.js", "/admin/live/live.css"):
            assert http.get(path, headers=ci).status_code == 200  # open: no data in them
        for _ in range(3):  # the page's polls and a dashboard's reads
            assert http.get("/admin/live/data", headers=ops).status_code == 200
            assert http.get("/admin/usage", headers=ops).status_code == 200
        denied = http.get("/admin/usage", headers=ci)
        unknown = http.get("/admin/live/data", headers={"authorization": "Bearer gw-wrong-0123"})
        assert (denied.status_code, unknown.status_code) == (403, 401)
        assert denied.headers["cache-control"] == unknown.headers["cache-control"] == "no-store"
        answered(gateway, 4 + 3 + 6 + 2)
        usage = http.get("/admin/usage", headers=ops).json()["keys"]
        status, out, _ = top(capsys, "--once", "--key", ADMIN_KEY, root(gateway))
    assert status == 0
    assert (usage["ci"]["requests"], usage["ci"]["errors"]) == (4, 2)
    assert (usage["ops"]["requests"], usage["ops"]["errors"]) == (0, 0)
    lines = out.splitlines()
    assert row_of(lines, "ci").split()[1] == "4"  # the same count as /admin/usage's
    assert not [line for line in lines if line.startswith(("ops ", "(no valid key)"))], out
    logged = [r.getMessage() for r in caplog.records]
    for line in (
        "GET /admin/usage 200 key=ops ",
        "GET /admin/live/data 200 key=ops ",
        "GET /admin/usage 403 key=ci ",
        "GET /admin/live/data 401 key=- ",
        "GET /admin/live/live.js 200 key=- ",
    ):
        assert any(m.startswith(line) for m in logged), (line, logged)
    assert not [m for m in logged if " other " in m]


def test_an_unreachable_url_is_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as bound:  # bound, not listening: a connection is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        status, out, err = top(capsys, "--once", f"127.0.0.1:{port}")
    assert (status, out) == (1, "")
    assert err.startswith(f"llmroute top: cannot reach http://127.0.0.1:{port}/metrics: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "give the URL of a metrics page"),
        (("ftp://example.org/metrics",), "is not an http(s) URL"),
        (("--interval", "0", "http://127.0.0.1:1"), "--interval and --timeout must be"),
        (("--simulator", "http://127.0.0.1:1"), "one of the two"),
    ],
)
def test_usage_mistakes(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], says: str
) -> None:
    status, _, err = top(capsys, "--once", *args)
    assert status == 2 and says in err and err.startswith("llmroute top: ")


def test_an_application_page_of_client_metrics(
    sim: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """An application serving ``client.metrics`` with prometheus_client's own HTTP server (as
    docs/metrics.md shows); no key needed."""
    import prometheus_client

    from llmroute import AsyncOpenAI

    config = {
        "providers": {"p": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY}},
        "models": {"chat": {"targets": ["p:sim-small"]}},
    }

    async def ask() -> AsyncOpenAI:
        async with AsyncOpenAI(config=config, verify=sim.ssl_context()) as client:
            await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}]
            )
        return client  # closed; its metrics stay readable

    client = anyio.run(ask)
    registry = prometheus_client.CollectorRegistry()
    registry.register(client.metrics)
    server, thread = prometheus_client.start_http_server(0, "127.0.0.1", registry=registry)
    try:
        status, out, err = top(capsys, "--once", f"http://127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)  # a hang guard only
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert row_of(section(lines, "targets (1)"), "p:sim-small").split()[1:3] == ["1", "100%"]
    assert row_of(section(lines, "routes"), "chat").split()[1] == "1"
    whole = section(lines, "not streamed")  # the one request was not streamed
    assert row_of(whole, "chat").split()[1] == row_of(whole, "p:sim-small").split()[1] == "1"
    assert "gateway keys" not in out


def test_simulator_once_shows_the_demo_targets(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = top(capsys, "--simulator", "--once")  # one frame: since the start
    assert (status, err) == (0, "")
    lines = out.splitlines()
    for name in ("fast-but-spiky:sim-small", "steady-slow:sim-small", "flaky:sim-small"):
        assert row_of(lines, name).endswith(("closed", "open", "half-open"))
    assert int(row_of(lines, "chat").split()[1]) >= ONCE_REQUESTS  # it waited for them


def test_a_tls_gateway_with_a_private_ca(
    sim: Simulator, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    folder = tmp_path_factory.mktemp("top-tls")
    cert, key, ca_file = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    config = {
        "providers": {"p": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY}},
        "models": {"chat": {"targets": ["p:sim-small"]}},
        "gateway": {"keys": {"ci": "GW_KEY_TOP"}},
    }
    with Gateway(
        config,
        certfile=str(cert),
        keyfile=str(key),
        environ={"GW_KEY_TOP": GW_KEY},
        verify=sim.ssl_context(),
    ) as server:
        status, _, err = top(capsys, "--once", "--key", GW_KEY, server.base_url)
        assert status == 2 and "its TLS certificate is not trusted; --ca FILE" in err
        status, out, err = top(
            capsys, "--once", "--key", GW_KEY, "--ca", str(ca_file), server.base_url
        )
    assert (status, err) == (0, "")
    assert row_of(out.splitlines(), "p:sim-small").endswith("closed")


def _own_terminal() -> None:
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize("typed", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_q_or_ctrl_c_quits_the_live_view_on_a_terminal(typed: bytes) -> None:
    """On a terminal (a pty here) the live view takes the screen; typing q, or Ctrl-C (the
    terminal still turns it into SIGINT while keys are read one by one), gives it back and ends
    with status 0."""
    import os
    import pty
    import select
    import subprocess
    import sys

    text = AFTER.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    master, slave = pty.openpty()
    root_dir = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root_dir), "COLUMNS": "120", "LINES": "40"}
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    process = subprocess.Popen(
        [sys.executable, "-m", "llmroute", "top", "--interval", "0.5", url],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
        start_new_session=True,
        preexec_fn=_own_terminal,  # the pty is its terminal: Ctrl-C there is its SIGINT
    )
    os.close(slave)
    seen = b""
    try:
        for _ in range(600):  # a hang guard only: up to 60 s for the first frame
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                seen += os.read(master, 65536)
            if b"targets (3)" in seen:
                break
        assert b"\x1b[?1049h" in seen and b"targets (3)" in seen, seen[-500:]
        os.write(master, typed)
        status = process.wait(timeout=60)  # a hang guard only
        for _ in range(10):
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                break
            try:
                seen += os.read(master, 65536)
            except OSError:  # the other end closed
                break
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        os.close(master)
        server.shutdown()
        server.server_close()
        thread.join(30)
    assert status == 0
    assert seen.rstrip().endswith(b"\x1b[?25h\x1b[?1049l")  # the screen given back
