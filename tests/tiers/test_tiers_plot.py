"""``llmroute tiers eval --plot``: a PNG of the evaluation beside the table (the plot extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmroute.cli import main

pytest.importorskip("wordllama")  # the tiers extra: not in the openai 2.x environment

DATA = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiers") / "tiers.npz"
    assert main(["tiers", "fit", str(DATA), "--out", str(out), "--no-embedding"]) == 0
    return out


def test_eval_writes_the_plot_and_still_prints_the_table(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = pytest.importorskip("matplotlib.image")
    png = tmp_path / "eval.png"
    capsys.readouterr()
    assert main(["tiers", "eval", str(DATA), "--model", str(model), "--plot", str(png)]) == 0
    assert "confusion (rows: true class, columns: decided)" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.imread(png).shape[:2] == (450, 1500)  # three panels at 100 dpi


def test_eval_plot_of_cross_validation_many_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    labelled = tmp_path / "three.jsonl"
    lines = [line for line in DATA.read_text("utf-8").splitlines() if line.strip()]
    # a third class: the hard examples on odd lines relabelled
    relabelled = [
        line.replace('"label": "hard"', '"label": "other"', 1) if i % 2 else line
        for i, line in enumerate(lines)
    ]
    labelled.write_text("\n".join(relabelled) + "\n", "utf-8")
    png = tmp_path / "cv.png"
    args = ["tiers", "eval", str(labelled), "--folds", "3", "--no-embedding", "--plot", str(png)]
    assert main(args) == 0
    assert "recall other" in capsys.readouterr().out
    assert png.stat().st_size > 0


def test_an_unwritable_plot_path_is_said_before_evaluating(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "missing" / "eval.png"
    capsys.readouterr()
    assert main(["tiers", "eval", str(DATA), "--model", str(model), "--plot", str(png)]) == 2
    said = capsys.readouterr()
    assert said.err == (
        f"llmroute tiers: --plot {png}: the directory {png.parent} does not exist\n"
    )
    assert said.out == ""


def test_plot_without_matplotlib_names_the_extra(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    png = tmp_path / "eval.png"
    capsys.readouterr()
    assert main(["tiers", "eval", str(DATA), "--model", str(model), "--plot", str(png)]) == 2
    said = capsys.readouterr()
    assert "llmroute tiers: matplotlib is not installed: pip install" in said.err
    assert "[plot]" in said.err
    assert said.out == "" and not png.exists()


def test_eval_plot_format_follows_the_extension(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    svg = tmp_path / "eval.svg"
    assert main(["tiers", "eval", str(DATA), "--model", str(model), "--plot", str(svg)]) == 0
    assert b"<svg" in svg.read_bytes()[:400]
    unknown = tmp_path / "eval.gif"
    capsys.readouterr()
    assert main(["tiers", "eval", str(DATA), "--model", str(model), "--plot", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert f"--plot {unknown}: .gif is not a picture format llmroute writes; end" in err
    assert not unknown.exists()
