"""``llmroute bench --plot``'s pictures from recorded runs: the log scale, the routed run over
time, ``--replot``. The figures are inspected (axes, scales, markers), never compared as images;
the drawing is matplotlib's Agg (a ``Figure`` without pyplot), no wall clock involved."""

from __future__ import annotations

import json
import random
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llmroute.cli import main
from llmroute.testing import Simulator

from ..conftest import KEY

pytest.importorskip("matplotlib")
numpy = pytest.importorskip("numpy")  # matplotlib's own dependency

from llmroute.cli._bench_plot import (  # noqa: E402  (after the skip: the plot extra)
    choose_scale,
    ecdf_figure,
    routed_figure,
    time_label,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROUTED = Path(__file__).parents[1] / "data" / "bench_routed.json"
"""A routed run written by hand: 12 requests over fast:m, slow:m, flaky:m with 3 hedged, 2
failed over, 1 continued, 2 cache hits and 2 failures (each request's route report)."""


def routed_run() -> dict[str, Any]:
    return json.loads(ROUTED.read_text("utf-8"))


def direct_run(stall: float | None) -> dict[str, Any]:
    """A direct run of two targets, 20 probes each of one length class; with ``stall`` (s),
    every tenth probe of the first target waits that long (a heavy tail)."""
    rng = random.Random(5)
    samples: list[dict[str, Any]] = []
    for target, median in (("a:m", 0.08), ("b:m", 0.12)):
        for index in range(20):
            ttft = median * (0.8 + 0.4 * rng.random())
            if stall is not None and target == "a:m" and index % 10 == 9:
                ttft = stall
            samples.append(
                {
                    "target": target,
                    "length": "short",
                    "index": index,
                    "prompt_chars": 200,
                    "started": index * 0.1,
                    "ttft": ttft,
                    "total": ttft + 0.16,
                    "error": None,
                }
            )
    samples[-1]["error"], samples[-1]["ttft"] = "RateLimitError: 429", None
    return {
        "version": 1,
        "settings": {"lengths": {"short": 50}, "routed": None},
        "targets": ["a:m", "b:m"],
        "samples": samples,
    }


def labelled(axis: Any, prefix: str) -> list[Any]:
    return [c for c in axis.collections if str(c.get_label()).startswith(prefix)]


def points(axis: Any, prefix: str) -> int:
    return sum(len(c.get_offsets()) for c in labelled(axis, prefix))


def test_time_labels_read_in_ms_then_s() -> None:
    assert [time_label(v) for v in (0, 50, 200, 999, 1000, 1500, 20000)] == [
        "0",
        "50 ms",
        "200 ms",
        "999 ms",
        "1 s",
        "1.5 s",
        "20 s",
    ]


def test_auto_scale_is_log_for_a_heavy_tail_only() -> None:
    assert choose_scale([80, 90, 100, 110, 120], "auto") == "linear"
    assert choose_scale([80, 90, 100, 110, 1200], "auto") == "log"  # 12x the median
    assert choose_scale([80, 90, 100, 110, 1200], "linear") == "linear"
    assert choose_scale([100], "auto") == "linear"
    assert choose_scale([], "log") == "log"
    with pytest.raises(ValueError, match="plot scale must be one of auto, linear, log"):
        choose_scale([1.0], "logarithmic")


def test_ecdf_log_scale_has_one_line_per_target_and_readable_ticks() -> None:
    figure = ecdf_figure(direct_run(stall=1.5), "log")
    (axis,) = figure.axes
    assert axis.get_xscale() == "log"
    assert [
        line.get_label() for line in axis.get_lines() if line.get_label() in ("a:m", "b:m")
    ] == [
        "a:m",
        "b:m",
    ]
    figure.canvas.draw()  # ticks are placed when drawn
    labels = [t.get_text() for t in axis.get_xticklabels() if t.get_text()]
    assert "100 ms" in labels and "1 s" in labels
    assert all(label.endswith((" ms", " s")) for label in labels)
    # The failed probe of b:m: its line ends at 19 of 20.
    b_line = next(line for line in axis.get_lines() if line.get_label() == "b:m")
    assert numpy.max(b_line.get_ydata()) == pytest.approx(19 / 20)


def test_ecdf_auto_scale_follows_the_tail() -> None:
    assert ecdf_figure(direct_run(stall=2.0)).axes[0].get_xscale() == "log"
    assert ecdf_figure(direct_run(stall=None)).axes[0].get_xscale() == "linear"
    assert ecdf_figure(direct_run(stall=2.0), "linear").axes[0].get_xscale() == "linear"


def test_routed_figure_marks_every_hedge_failover_continuation_and_cache_hit() -> None:
    data = routed_run()
    samples = data["samples"]
    figure = routed_figure(data, "log")
    top, bottom = figure.axes
    assert top.get_yscale() == "log"
    # One series per target that served requests (and the cache), each point a request.
    served: dict[str, int] = {}
    for sample in samples:
        if sample["error"] is None:
            winner = sample["route"]["winner"]
            served[winner] = served.get(winner, 0) + 1
    assert served == {"fast:m": 5, "flaky:m": 2, "slow:m": 1, "cache": 2}
    for winner, count in served.items():
        (series,) = labelled(top, f"served by {winner} ")
        assert len(series.get_offsets()) == count
    hedged = sum(s["route"]["hedges"] > 0 for s in samples)
    assert hedged == 3
    assert points(top, "hedged (3)") == hedged
    assert points(top, "failed over (2)") == 2
    assert points(top, "continued (1)") == 1
    assert points(top, "cache hit (2)") == 2
    assert points(top, "failed (2)") == 2
    # Every attempt on its target's row, in the route's order; a marker where each started.
    assert [t.get_text() for t in bottom.get_yticklabels()] == data["targets"]
    attempts = [a for s in samples for a in s["route"]["attempts"]]
    assert points(bottom, "first attempt (10)") + points(bottom, "hedge attempt (3)") == 13
    assert points(bottom, "failover attempt (2)") + points(bottom, "continuation attempt (1)") == 3
    assert sum(points(bottom, f"{r} attempt") for r in ("first", "hedge", "failover")) + points(
        bottom, "continuation attempt"
    ) == len(attempts)
    failed = [a for a in attempts if a["outcome"] not in ("won", "cancelled")]
    assert len(failed) == 6
    assert points(bottom, "attempt failed (6)") == 6
    assert "3 hedged, 2 failed over, 1 continued, 2 cache hits, 2 failed" in (figure.get_suptitle())


def test_replot_draws_both_pictures_without_traffic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = pytest.importorskip("matplotlib.image")
    routed_png = tmp_path / "routed.png"
    assert main(["bench", "--replot", str(ROUTED), "--plot", str(routed_png)]) == 0
    assert capsys.readouterr().out == f"wrote {routed_png}\n"
    assert routed_png.read_bytes()[:8] == PNG_MAGIC
    assert image.imread(routed_png).shape[:2] == (750, 1100)  # 11 x 7.5 in at 100 dpi
    direct = tmp_path / "direct.json"
    direct.write_text(json.dumps(direct_run(stall=1.5)))
    ecdf_png = tmp_path / "ecdf.png"
    argv = ["bench", "--replot", str(direct), "--plot", str(ecdf_png), "--plot-scale", "log"]
    assert main(argv) == 0
    assert ecdf_png.read_bytes()[:8] == PNG_MAGIC
    assert image.imread(ecdf_png).shape[:2] == (400, 500)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--plot", "PNG", "--simulator"], "--replot draws a saved run and sends nothing; drop"),
        ([], "--replot needs --plot FILE"),
        (["--plot", "PNG", "--plot-scale", "cubic"], "invalid choice: 'cubic'"),
    ],
)
def test_replot_option_mistakes_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    png = tmp_path / "x.png"
    argv = [str(png) if a == "PNG" else a for a in argv]
    with pytest.raises(SystemExit) if "cubic" in argv else _no_exit():
        assert main(["bench", "--replot", str(ROUTED), *argv]) == 2
    assert said in capsys.readouterr().err
    assert not png.exists()


class _no_exit:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "not JSON"),
        ('{"settings": {"lengths": {}}, "targets": []}', "the field 'samples' is missing"),
        (
            '{"settings": {"lengths": {}}, "targets": [], "samples": []}',
            "the field 'settings.lengths' is missing or empty",
        ),
        (
            json.dumps(
                {
                    "settings": {"lengths": {"short": 50}, "routed": "chat"},
                    "targets": ["a:m"],
                    "samples": [
                        {"target": "chat", "length": "short", "started": 0, "route": {"x": 1}}
                    ],
                }
            ),
            "samples[0].route lacks 'attempts'",
        ),
    ],
)
def test_a_file_that_is_no_saved_run_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, said: str
) -> None:
    saved, png = tmp_path / "run.json", tmp_path / "x.png"
    saved.write_text(content)
    assert main(["bench", "--replot", str(saved), "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llmroute bench: --replot {saved}: ") and said in err
    assert not png.exists()


def test_replot_without_matplotlib_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    png = tmp_path / "x.png"
    assert main(["bench", "--replot", str(ROUTED), "--plot", str(png)]) == 2
    said = capsys.readouterr()
    assert "llmroute bench: matplotlib is not installed: pip install" in said.err
    assert "[plot]" in said.err and said.out == "" and not png.exists()


def test_routed_simulator_run_keeps_each_route_report_and_draws_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "routed.json", tmp_path / "routed.png"
    argv = ["bench", "--simulator", "--routed", "--probes", "3", "--lengths", "short"]
    assert main([*argv, "--repeat", "1", "--json", str(out), "--plot", str(png)]) == 0
    shown = capsys.readouterr().out
    assert "route 'chat' over 3 targets" in shown and "Who served the routed requests" in shown
    assert "3 probes repeat a prompt" in shown
    data = json.loads(out.read_text())
    assert data["settings"]["routed"] == "chat" and data["settings"]["repeat"] == 1
    assert data["targets"] == [
        "fast-but-spiky:sim-small",
        "steady-slow:sim-small",
        "flaky:sim-small",
    ]
    assert len(data["samples"]) == 3 and data["summary"][0]["target"] == "chat"
    # What the routed requests cost (the demo's prices), per 1,000, beside the latencies.
    costs = [Decimal(s["cost"]) for s in data["samples"]]
    assert all(s["currency"] == "USD" for s in data["samples"]) and sum(costs) > 0
    summary = data["summary"][0]
    assert Decimal(summary["cost_per_1000"]) == sum(costs) * 1000 / 3
    assert summary["currency"] == "USD" and "cost/1k" in shown
    assert f"{Decimal(summary['cost_per_1000']):.4f} USD" in shown
    for sample in data["samples"]:
        route = sample["route"]
        assert sample["target"] == "chat"
        if sample["error"] is None:
            assert route["winner"] in [*data["targets"], "cache"]
            assert sample["ttft"] == pytest.approx(route["ttft"], abs=1e-4)
            won = [a for a in route["attempts"] if a["outcome"] == "won"]
            if not route["cache_hit"] and not route["continued_on"]:
                assert won[0]["target"] == route["winner"]
        assert route is None or set(route) == {
            "winner",
            "ttft",
            "hedges",
            "cache_hit",
            "shared",
            "continued_on",
            "attempts",
        }
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_routed_option_mistakes_name_the_routes(
    sim: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f"""
[providers.good]
base_url = "{sim.base_url}"
api_key = "{KEY}"
[models.chat]
targets = ["good:sim-small"]
[models.code]
targets = ["good:sim-small"]
"""
    )
    monkeypatch.setenv("SSL_CERT_FILE", sim.ca_pem_path)
    assert main(["bench", "--config", str(config), "--routed", "chta"]) == 2
    err = capsys.readouterr().err
    assert "--routed 'chta' is no route of the config (did you mean 'chat'?)" in err
    assert "the routes are: chat, code" in err
    assert main(["bench", "--config", str(config), "--routed"]) == 2
    assert "--routed needs a route name; the routes are: chat, code" in capsys.readouterr().err
    assert main(["bench", "--simulator", "--routed", "--targets", "flaky:sim-small"]) == 2
    assert "choose one" in capsys.readouterr().err
    assert main(["bench", "--simulator", "--routed", "code"]) == 2
    assert "with --simulator the route is 'chat'" in capsys.readouterr().err
    assert main(["bench", "--simulator", "--routed", "--repeat", "2"]) == 2
    assert "--repeat must be between 0 and 1, got 2" in capsys.readouterr().err


def test_routed_run_of_a_config_route_never_writes_its_key(
    sim: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f"""
[providers.good]
base_url = "{sim.base_url}"
api_key = "{KEY}"
[models.chat]
targets = ["good:sim-small"]
"""
    )
    monkeypatch.setenv("SSL_CERT_FILE", sim.ca_pem_path)
    out = tmp_path / "routed.json"
    argv = ["bench", "--config", str(config), "--routed", "--probes", "2", "--lengths", "short"]
    assert main([*argv, "--json", str(out)]) == 0  # its only route: no name needed
    captured = capsys.readouterr()
    text = out.read_text()
    assert KEY not in text + captured.out + captured.err
    data = json.loads(text)
    assert data["settings"]["routed"] == "chat" and data["targets"] == ["good:sim-small"]
    assert [s["route"]["winner"] for s in data["samples"]] == ["good:sim-small"] * 2


def test_a_run_where_every_request_failed_still_draws() -> None:
    data = routed_run()
    for sample in data["samples"]:
        sample["error"], sample["ttft"] = "APIConnectionError: Connection error.", None
    figure = routed_figure(data)  # warnings are errors here: no empty legend, no log of nothing
    assert points(figure.axes[0], "failed (12)") == 12
    for sample in data["samples"]:
        sample["total"] = None  # nowhere to place them on the TTFT axis
    assert points(routed_figure(data, "log").axes[0], "failed") == 0
    empty = {"settings": {"lengths": {"short": 50}}, "targets": ["a:m"], "samples": []}
    assert ecdf_figure(empty, "log").axes[0].get_xscale() == "log"


@pytest.mark.parametrize("kind", ["svg", "pdf", "png"])
def test_the_plot_format_follows_the_extension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """``--plot bench.svg`` writes SVG (it wrote PNG bytes under any name before)."""
    picture = tmp_path / f"routed.{kind.upper() if kind == 'pdf' else kind}"
    assert main(["bench", "--replot", str(ROUTED), "--plot", str(picture)]) == 0
    assert capsys.readouterr().out == f"wrote {picture}\n"
    head = picture.read_bytes()[:400]
    if kind == "svg":
        assert head.startswith(b"<?xml") and b"<svg" in head
    elif kind == "pdf":
        assert head.startswith(b"%PDF-")
    else:
        assert head.startswith(PNG_MAGIC)


@pytest.mark.parametrize("name", ["bench.jpeg", "bench", "bench.svg.txt"])
def test_an_unknown_plot_extension_is_refused_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    picture = tmp_path / name
    for argv in (["--replot", str(ROUTED)], ["--simulator", "--probes", "1"]):
        assert main(["bench", *argv, "--plot", str(picture)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith(f"llmroute bench: --plot {picture}: ")
        assert captured.err.rstrip().endswith("; end the name in .png, .svg or .pdf")
        assert not picture.exists()
