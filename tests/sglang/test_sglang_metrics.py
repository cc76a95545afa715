"""The /metrics reader: the Prometheus text parser, readings and their deltas, the poller,
and the TTFT diagnosis."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import llmroute
from llmroute.routing.stats import LiveStats, ServerMetrics
from llmroute.sglang import (
    MetricsPoller,
    SGLangServer,
    diagnose_ttft,
    metrics_url,
    parse_prometheus,
    read_server_metrics,
    transport_share,
)

MODEL = "Qwen/Qwen2.5-7B-Instruct"
SCHED = f'engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="0"'
SCHED_PID = f'engine_type="unified",model_name="{MODEL}",pid="4711",pp_rank="0",tp_rank="0"'


def sglang_metrics(
    *,
    queued: int = 2,
    running: int = 5,
    ttft: tuple[float, int] = (12.5, 40),
    queue_time: tuple[float, int] = (1.5, 40),
) -> str:
    """/metrics as an SGLang 0.5.x server writes it (prometheus_client in multiprocess mode:
    scheduler gauges labelled by rank, tokenizer histograms by model, labels sorted)."""
    ttft_sum, ttft_count = ttft
    queue_sum, queue_count = queue_time
    buckets = [(0.1, 2), (0.2, 9), (0.4, 30), (1.0, 38), (2.0, ttft_count)]
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{SCHED}}} {running:.1f}",
        "# HELP sglang:num_used_tokens The number of used tokens.",
        "# TYPE sglang:num_used_tokens gauge",
        f"sglang:num_used_tokens{{{SCHED}}} 4096.0",
        "# HELP sglang:token_usage The token usage.",
        "# TYPE sglang:token_usage gauge",
        f"sglang:token_usage{{{SCHED}}} 0.12",
        "# HELP sglang:gen_throughput The generation throughput (token/s).",
        "# TYPE sglang:gen_throughput gauge",
        f"sglang:gen_throughput{{{SCHED}}} 431.7",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{SCHED}}} {queued:.1f}",
        "# HELP sglang:cache_hit_rate The prefix cache hit rate.",
        "# TYPE sglang:cache_hit_rate gauge",
        f"sglang:cache_hit_rate{{{SCHED}}} 0.75",
        "# HELP sglang:num_retracted_reqs The number of retracted requests.",
        "# TYPE sglang:num_retracted_reqs gauge",
        f"sglang:num_retracted_reqs{{{SCHED_PID}}} 0.0",
        "# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.",
        "# TYPE sglang:queue_time_seconds histogram",
        f'sglang:queue_time_seconds_bucket{{{SCHED},le="0.0"}} 0.0',
        f'sglang:queue_time_seconds_bucket{{{SCHED},le="+Inf"}} {queue_count:.1f}',
        f"sglang:queue_time_seconds_count{{{SCHED}}} {queue_count:.1f}",
        f"sglang:queue_time_seconds_sum{{{SCHED}}} {queue_sum}",
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f'sglang:prompt_tokens_total{{model_name="{MODEL}"}} 52311.0',
        "# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE sglang:time_to_first_token_seconds histogram",
        *(
            f'sglang:time_to_first_token_seconds_bucket{{le="{le}",model_name="{MODEL}"}} {n:.1f}'
            for le, n in buckets
        ),
        f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="{MODEL}"}} '
        f"{ttft_count:.1f}",
        f'sglang:time_to_first_token_seconds_count{{model_name="{MODEL}"}} {ttft_count:.1f}',
        f'sglang:time_to_first_token_seconds_sum{{model_name="{MODEL}"}} {ttft_sum}',
    ]
    return "\n".join(lines) + "\n"


# -- the parser --------------------------------------------------------------------------------


def test_parses_sglang_output() -> None:
    parsed = parse_prometheus(sglang_metrics())
    assert parsed.malformed == 0
    assert parsed.types["sglang:time_to_first_token_seconds"] == "histogram"
    assert parsed.help["sglang:cache_hit_rate"] == "The prefix cache hit rate."
    (running,) = parsed["sglang:num_running_reqs"]
    assert running.value == 5.0
    assert running.labels == {
        "engine_type": "unified",
        "model_name": MODEL,
        "pp_rank": "0",
        "tp_rank": "0",
    }
    buckets = parsed["sglang:time_to_first_token_seconds_bucket"]
    assert [b.labels["le"] for b in buckets][-1] == "+Inf"
    assert parsed["sglang:time_to_first_token_seconds_count"][0].value == 40.0
    assert parsed["sglang:num_retracted_reqs"][0].labels["pid"] == "4711"


def test_label_escapes_special_values_and_timestamps() -> None:
    text = "\n".join(
        [
            r'm{path="C:\\dir",quote="say \"hi\", {ok}",nl="a\nb"} 1',
            "up 1 1700000000000",
            'inf{le="+Inf"} +Inf',
            "neg -Inf",
            "nan NaN",
            "sci 1.5e-3",
            'spaced { a = "1" , b="2", } 7',
            "# a comment that is not HELP or TYPE",
            "# TYPE odd",
            "",
        ]
    )
    parsed = parse_prometheus(text)
    assert parsed.malformed == 0
    labels = parsed["m"][0].labels
    assert labels == {"path": "C:\\dir", "quote": 'say "hi", {ok}', "nl": "a\nb"}
    assert parsed["up"][0].timestamp_ms == 1_700_000_000_000
    assert parsed["inf"][0].value == math.inf
    assert parsed["neg"][0].value == -math.inf
    assert math.isnan(parsed["nan"][0].value)
    assert parsed["sci"][0].value == 0.0015
    assert parsed["spaced"][0].labels == {"a": "1", "b": "2"}
    assert parsed.types["odd"] == "untyped"


@pytest.mark.parametrize(
    "line",
    [
        "no_value",
        'open{a="1" 3',
        "unquoted{a=1} 3",
        'unterminated{a="1} 3',
        "word{} notanumber",
        "too many values 1 2 3",
        "1starts_with_digit 1",
        "missing_eq{a} 1",
        "m 1 notatimestamp",
        "m 1_000",
        '{a="1"} 1',
    ],
)
def test_malformed_lines_are_skipped_and_counted(line: str) -> None:
    parsed = parse_prometheus(f"good 1\n{line}\nalso_good 2\n")
    assert parsed.malformed == 1
    assert set(parsed) == {"good", "also_good"}


# -- readings ----------------------------------------------------------------------------------


def test_reading_and_deltas_between_readings() -> None:
    first = read_server_metrics(parse_prometheus(sglang_metrics()), None, read_at=10.0)
    m = first.metrics
    assert (m.read_at, m.queued, m.running) == (10.0, 2, 5)
    assert m.cache_hit_rate == 0.75
    assert m.token_usage == 0.12
    # A first reading has no previous one: its means are over the server's whole life.
    assert m.ttft_mean == pytest.approx(12.5 / 40)
    assert m.queue_time_mean == pytest.approx(1.5 / 40)

    text = sglang_metrics(queued=0, ttft=(14.5, 44), queue_time=(1.9, 44))
    second = read_server_metrics(parse_prometheus(text), first, read_at=11.0)
    assert second.metrics.queued == 0
    assert second.metrics.ttft_mean == pytest.approx(2.0 / 4)
    assert second.metrics.queue_time_mean == pytest.approx(0.4 / 4)

    # Nothing finished in between: no mean, not a stale one.
    third = read_server_metrics(parse_prometheus(text), second, read_at=12.0)
    assert third.metrics.ttft_mean is None
    assert third.metrics.queue_time_mean is None

    # The server restarted: its counters went back to zero, the mean is since the restart.
    restarted = sglang_metrics(ttft=(0.9, 3), queue_time=(0.0, 3))
    fourth = read_server_metrics(parse_prometheus(restarted), third, read_at=13.0)
    assert fourth.metrics.ttft_mean == pytest.approx(0.3)
    assert fourth.metrics.queue_time_mean == 0.0


def test_data_parallel_ranks_add_up_and_other_tp_ranks_are_ignored() -> None:
    def gauge(name: str, value: float, dp: int, tp: int = 0) -> str:
        labels = f'dp_rank="{dp}",engine_type="unified",model_name="m",pp_rank="0",tp_rank="{tp}"'
        return f"{name}{{{labels}}} {value}"

    text = "\n".join(
        [
            gauge("sglang:num_queue_reqs", 3, dp=0),
            gauge("sglang:num_queue_reqs", 4, dp=1),
            gauge("sglang:num_queue_reqs", 3, dp=0, tp=1),  # the same scheduler, another rank
            gauge("sglang:num_running_reqs", 8, dp=0),
            gauge("sglang:num_running_reqs", 2, dp=1),
            gauge("sglang:cache_hit_rate", 0.5, dp=0),
            gauge("sglang:cache_hit_rate", 0.9, dp=1),
            gauge("sglang:token_usage", 0.2, dp=0),
            gauge("sglang:token_usage", 0.4, dp=1),
            gauge("sglang:token_usage", 0.99, dp=0, tp=1),
        ]
    )
    m = read_server_metrics(parse_prometheus(text), None, read_at=0.0).metrics
    assert (m.queued, m.running) == (7, 10)
    assert (m.ranks, m.dp_size) == ((11, 6), 2)  # each rank's queued + running
    assert m.cache_hit_rate == pytest.approx(0.7)  # a ratio: averaged, not summed
    assert m.token_usage == pytest.approx(0.3)


def test_a_server_without_sglang_metrics_reads_as_idle_and_unknown() -> None:
    m = read_server_metrics(parse_prometheus("python_info 1\n"), None, read_at=1.0).metrics
    assert m == ServerMetrics(read_at=1.0, queued=0, running=0)


def test_metrics_url() -> None:
    assert metrics_url("http://127.0.0.1:30000/v1") == "http://127.0.0.1:30000/metrics"
    assert metrics_url("http://127.0.0.1:30000/v1/") == "http://127.0.0.1:30000/metrics"
    assert metrics_url("http://h:1") == "http://h:1/metrics"
    assert metrics_url("http://h:1/metrics") == "http://h:1/metrics"


# -- the poller --------------------------------------------------------------------------------


class MetricsServer:
    """A tiny /metrics server in a thread; ``text`` is served, ``status`` overrides it; with
    ``key`` set it wants ``Authorization: Bearer <key>`` (else 401), as SGLang before 0.5."""

    def __init__(self) -> None:
        self.text = sglang_metrics()
        self.status = 200
        self.key: str | None = None
        self.paths: list[str] = []
        self.authorizations: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                authorization = self.headers.get("Authorization")
                owner.authorizations.append(authorization)
                status = owner.status
                if owner.key is not None and authorization != f"Bearer {owner.key}":
                    status = 401
                body = owner.text.encode() if status == 200 else b"error"
                self.send_response(status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def metrics_server() -> Iterator[MetricsServer]:
    server = MetricsServer()
    yield server
    server.close()


def closed_port_url() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.mark.anyio
async def test_poller_sets_server_metrics_and_survives_failures(
    metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmroute.sglang")
    stats = LiveStats()
    urls = {"gpu:qwen": metrics_server.url + "/v1", "down:qwen": closed_port_url()}
    async with MetricsPoller(urls, stats, timeout=2.0) as poller:
        fresh = await poller.poll_once()
        assert set(fresh) == {"gpu:qwen"}
        assert metrics_server.paths == ["/metrics"]  # at the root, not under /v1
        first = stats.target("gpu:qwen").load.server
        assert first is not None and (first.queued, first.running) == (2, 5)
        assert stats.target("down:qwen").load.server is None

        metrics_server.text = sglang_metrics(queued=9, ttft=(13.5, 42))
        await poller.poll_once()
        second = stats.target("gpu:qwen").load.server
        assert second is not None and second.queued == 9
        assert second.ttft_mean == pytest.approx(0.5)

        metrics_server.status = 500
        await poller.poll_once()
        await poller.poll_once()
        assert stats.target("gpu:qwen").load.server is second  # the previous value stays

        metrics_server.status = 200
        await poller.poll_once()
        third = stats.target("gpu:qwen").load.server
        assert third is not None and third is not second and third.ttft_mean is None

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # One warning per target per outage, however many polls fail.
    assert sorted(r.getMessage().split(" from ")[0].rsplit(" ", 1)[1] for r in warnings) == [
        "down:qwen",
        "gpu:qwen",
    ]
    assert any("can be read again" in r.getMessage() for r in caplog.records)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) >= 5  # down:qwen four times, gpu:qwen twice


@pytest.mark.anyio
async def test_a_reading_is_dated_when_its_scrape_was_sent_and_an_older_one_never_wins(
    metrics_server: MetricsServer,
) -> None:
    """The clock ticks once per call: the reading carries the tick taken before the request.
    A scrape that started before one already taken (an overlapping poll) answers too late."""
    ticks = iter(range(100, 200))
    stats = LiveStats(clock=lambda: 0.0)
    async with MetricsPoller(
        {"gpu:qwen": metrics_server.url}, stats, clock=lambda: float(next(ticks))
    ) as poller:
        await poller.poll_once()
        first = stats.target("gpu:qwen").load.server
        assert first is not None and first.read_at == 100.0
        await poller.poll_once()
        second = poller.reading("gpu:qwen")
        assert second is not None and second.metrics.read_at == 101.0
        stale = ServerMetrics(read_at=50.0, queued=99, running=99)
        assert not stats.target("gpu:qwen").load.observe_server(stale)
        assert stats.target("gpu:qwen").load.server is second.metrics


@pytest.mark.anyio
async def test_poller_run_loops_until_cancelled(
    metrics_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio

    stats = LiveStats()
    sleeps: list[float] = []
    real_sleep = anyio.sleep
    rounds = anyio.CancelScope()

    async def sleep(delay: float) -> None:  # counts the rounds; cancels the loop after three
        sleeps.append(delay)
        if len(sleeps) == 3:
            rounds.cancel()
        await real_sleep(delay)

    scraped = len(metrics_server.paths)
    async with MetricsPoller({"gpu:m": metrics_server.url}, stats, interval=0.05) as poller:
        monkeypatch.setattr(anyio, "sleep", sleep)
        with anyio.fail_after(30), rounds:  # fail_after: a hang guard only
            await poller.run()
    assert len(metrics_server.paths) - scraped == 3  # one scrape per round, then a wait
    assert all(0 <= delay <= 0.05 for delay in sleeps)  # the rest of the interval, no more
    assert stats.target("gpu:m").load.server is not None


# -- where time goes ---------------------------------------------------------------------------


def server(ttft: float | None, queue: float | None) -> ServerMetrics:
    return ServerMetrics(read_at=0.0, queued=0, running=0, ttft_mean=ttft, queue_time_mean=queue)


def test_transport_share() -> None:
    assert transport_share(1.0, 0.25) == 0.75
    assert transport_share(0.2, 0.3) == 0.0
    assert transport_share(None, 0.3) is None
    assert transport_share(0.5, None) is None


@pytest.mark.parametrize(
    ("client", "metrics", "expected"),
    [
        (0.80, server(0.30, 0.02), "the network or a buffering proxy"),
        (0.45, server(0.40, 0.30), "the server is saturated (queue 300 ms of 400 ms)"),
        (1.25, server(1.20, 0.05), "prefill dominates (1150 ms)"),
        (0.45, server(0.40, 0.05), "nothing stands out"),
        (0.12, server(0.10, 0.01), "transport 20 ms (17%); nothing stands out"),
        (0.30, server(None, None), "no server-side TTFT"),
        (None, server(0.1, 0.0), "no client-side TTFT"),
        (0.30, None, "no server-side TTFT"),
    ],
)
def test_diagnosis(client: float | None, metrics: ServerMetrics | None, expected: str) -> None:
    diagnosis = diagnose_ttft(client, metrics)
    assert expected in str(diagnosis)


def test_diagnosis_parts() -> None:
    diagnosis = diagnose_ttft(0.8, server(0.3, 0.1))
    assert diagnosis.parts == pytest.approx({"transport": 0.5, "queue": 0.1, "prefill": 0.2})
    assert "500 ms (62%) outside the server" in diagnosis.verdict


# -- end to end: a launched stand-in's own /metrics --------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_poller_reads_a_launched_server(tmp_path: Path) -> None:
    from llmroute.testing import sglang_standin_path

    env = {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_WARMUP": "0"}
    stats = LiveStats()
    async with SGLangServer("org/qwen", env=env, log_dir=tmp_path, startup_timeout=20) as server:
        urls = server.metrics_urls("gpu")
        assert list(urls) == ["gpu:qwen"]
        async with MetricsPoller(urls, stats, timeout=5.0) as poller:
            await poller.poll_once()
            client = llmroute.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
            try:
                for _ in range(2):
                    await client.chat.completions.create(
                        model=server.served_model_name,
                        messages=[{"role": "user", "content": "the same long prompt " * 20}],
                        max_tokens=4,
                    )
            finally:
                await client.close()
            fresh = await poller.poll_once()
    metrics = fresh["gpu:qwen"]
    assert stats.target("gpu:qwen").load.server is metrics
    assert (metrics.queued, metrics.running) == (0, 0)
    assert metrics.queue_time_mean is not None and metrics.queue_time_mean >= 0
    assert metrics.cache_hit_rate is not None and metrics.cache_hit_rate > 0  # the 2nd one hit
    assert metrics.token_usage is not None
    reading = poller.reading("gpu:qwen")
    assert reading is not None and reading.ttft is not None and reading.ttft.count == 2
    # The mean TTFT of the two requests since the first scrape (which counted none), from the
    # server's own histogram: checked against its sum, not against a wall-clock bound.
    assert reading.ttft.sum > 0
    assert metrics.ttft_mean == pytest.approx(reading.ttft.sum / 2)


@pytest.mark.anyio
async def test_a_data_parallel_server_reports_each_ranks_queue(tmp_path: Path) -> None:
    """``--dp-size 2``: two schedulers, requests dealt to them in turn; the reading keeps each
    rank's load, and routing counts the server's load per rank."""
    import anyio

    from llmroute.testing import sglang_standin_path

    env = {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_WARMUP": "0"}
    env["SGLANG_STANDIN_TTFT"] = "30"  # the requests stay running until cancelled
    stats = LiveStats()
    async with SGLangServer(
        "org/qwen", env=env, log_dir=tmp_path, extra_args=["--dp-size", "2"], grace=2
    ) as server:
        urls = server.metrics_urls("gpu")
        client = llmroute.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        async with (
            MetricsPoller(urls, stats, timeout=5.0) as poller,
            anyio.create_task_group() as tg,
        ):
            for n in range(3):
                messages = [{"role": "user", "content": f"question {n}"}]
                tg.start_soon(
                    lambda m=messages: client.chat.completions.create(
                        model=server.served_model_name, messages=m, max_tokens=2
                    )
                )
            metrics = None
            with anyio.fail_after(20):
                while metrics is None or metrics.running < 3:
                    metrics = (await poller.poll_once())["gpu:qwen"]
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        await client.close()
    assert metrics.ranks == (2, 1)  # dealt in turn: ranks 0, 1, 0
    assert metrics.dp_size == 2
    assert (metrics.queued, metrics.running) == (0, 3)


METRICS_KEY = "sk-metrics-SECRET-0123456789"


@pytest.mark.anyio
async def test_poller_sends_each_target_its_key_and_never_logs_it(
    metrics_server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmroute.sglang")
    metrics_server.key = METRICS_KEY
    stats = LiveStats()
    urls = {"gpu:qwen": metrics_server.url, "nokey:qwen": metrics_server.url + "/v1"}
    keys = {"gpu:qwen": METRICS_KEY, "elsewhere:m": "sk-unused"}
    async with MetricsPoller(urls, stats, keys=keys, timeout=2.0) as poller:
        assert METRICS_KEY not in repr(poller)
        fresh = await poller.poll_once()
        assert set(fresh) == {"gpu:qwen"}  # the target without a key got 401
        assert sorted(metrics_server.authorizations, key=str) == [f"Bearer {METRICS_KEY}", None]
        # A key the server refuses: logged without the key.
        metrics_server.key = "sk-another"
        assert await poller.poll_once() == {}
    assert stats.target("gpu:qwen").load.server is not None
    assert stats.target("nokey:qwen").load.server is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("nokey:qwen" in w and "401" in w and "wants an API key" in w for w in warnings)
    assert any("gpu:qwen" in w and "401" in w for w in warnings)
    assert METRICS_KEY not in caplog.text


@pytest.mark.anyio
async def test_poller_ignores_proxy_variables(
    metrics_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, closed_port_url().removesuffix("/v1"))  # a proxy that is down
    stats = LiveStats()
    async with MetricsPoller({"gpu:m": metrics_server.url}, stats, timeout=2.0) as poller:
        assert set(await poller.poll_once()) == {"gpu:m"}
    assert metrics_server.paths == ["/metrics"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_poller_reads_a_pre_0_5_server_with_its_key(tmp_path: Path) -> None:
    from llmroute.testing import sglang_standin_path

    env = {
        "PYTHONPATH": sglang_standin_path(),
        "SGLANG_STANDIN_WARMUP": "0",
        "SGLANG_STANDIN_VERSION": "0.4.0",  # /metrics wants the key before 0.5
    }
    async with SGLangServer("org/qwen", env=env, log_dir=tmp_path, startup_timeout=20) as server:
        urls = server.metrics_urls("gpu")
        async with MetricsPoller(urls, LiveStats(), timeout=5.0) as keyless:
            assert await keyless.poll_once() == {}
        keys = server.metrics_keys("gpu")
        assert keys == {"gpu:qwen": server.api_key}
        async with MetricsPoller(urls, LiveStats(), keys=keys, timeout=5.0) as poller:
            fresh = await poller.poll_once()
    assert set(fresh) == {"gpu:qwen"}
    assert fresh["gpu:qwen"].cache_hit_rate is not None
