"""``llmroute demo``: a small run end to end (piped, and on a terminal); ``--real`` without keys."""

from __future__ import annotations

import importlib.util
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llmroute.cli import _demo, main
from llmroute.cli._demo import REAL_MODELS, TIER_PROMPTS, workload
from llmroute.testing import Simulator

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("fast-but-spiky:sim-small", "steady-slow:sim-small", "flaky:sim-small")
REQUESTS = 60


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmroute.cli", "demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def row(out: str, name: str) -> list[str]:
    """The cells of the summary row that starts with ``name`` (split on 2+ spaces)."""
    summary = out[out.index("Summary:") :] if "Summary:" in out else out
    for line in summary.splitlines():
        if line.strip().startswith(name):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no summary row {name!r} in:\n{summary}")


def test_small_demo_piped_prints_progress_and_a_summary_of_every_target() -> None:
    done = demo("--requests", str(REQUESTS), "--concurrency", "12", "--popular", "0.5")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b[" not in out  # no terminal codes in a pipe
    assert f"routed: {REQUESTS}/{REQUESTS} requests done" in out
    live = out[: out.index("Summary:")]
    for target in TARGETS:
        assert target in live
        assert f"{target} alone: {REQUESTS}/{REQUESTS} requests done" in out
    routed = row(out, "routed: hedge + cache")
    answered, errors = int(routed[1]), int(routed[2])
    assert answered + errors == REQUESTS
    assert re.fullmatch(r"\d+ ms", routed[4])  # the routed p95
    uncached = row(out, "routed, cache hits left out")
    hits = int(re.search(r"cache hits: (\d+)", out).group(1))  # type: ignore[union-attr]
    assert hits > 0
    assert int(uncached[1]) + int(uncached[2]) + hits == REQUESTS
    for target in TARGETS:
        alone = row(out, f"{target} alone")
        assert int(alone[1]) + int(alone[2]) == REQUESTS
        assert re.fullmatch(r"\d+\.\dx", alone[-1])  # its p95 over the routed p95
    assert re.search(r"hedges fired: \d+ of 60 routed requests, \d+ won", out)
    assert "P95 improvement:" in out
    # What the routed run cost at the demo's made-up prices, hedges included.
    assert re.search(
        r"cost: \d+\.\d{6} USD for 60 routed requests, \d+\.\d{4} per 1,000 "
        r"\(hedges, retries, continuations: \d+\.\d{6}\)",
        out,
    ), out[-800:]
    if importlib.util.find_spec("wordllama") is None:
        assert "tiers part skipped" in out
        return
    # Tiers: a small fast model beside a large slow one, behind the tiered name 'auto'.
    tiers = out[out.index("Tiers: model 'auto'") :]
    prompts = 2 * sum(len(p) for p in TIER_PROMPTS.values())
    tiered, large = row(tiers, "tiered 'auto'"), row(tiers, "always 'chat-large'")
    for cells in (tiered, large):
        assert cells[1] == "0"  # no errors
        assert all(re.fullmatch(r"\d+ ms", cell) for cell in cells[2:6])
        simple, hard = (tuple(map(int, cell.split("/"))) for cell in cells[6:8])
        assert simple[1] + hard[1] == prompts
    assert large[6].startswith("0/") and large[7].split("/")[0] == large[7].split("/")[1]
    on_small = int(tiered[6].split("/")[0])
    assert on_small > 0  # the classifier sent simple prompts to the small model
    assert re.search(r"simple prompts' p50 TTFT: \d+ ms with tiers vs \d+ ms always large", out)


def test_demo_on_a_terminal_draws_the_live_table() -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "llmroute.cli", "demo", "--requests", "16"),
            *("--concurrency", "8", "--no-tiers"),
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "140", "TERM": "xterm"},
    )
    os.close(follower)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO once the child has closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert proc.wait(timeout=90) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
    reader.join(10)
    os.close(leader)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert "\x1b[" in text  # drawn live, with cursor movements
    assert "live TTFT per target" in text and "routed requests" in text
    assert "Summary:" in text and "P95 improvement:" in text
    assert "Tiers:" not in text  # --no-tiers


def test_real_without_keys_exits_2_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.endswith("_API_KEY"):
            monkeypatch.delenv(name)
    started: list[str] = []

    async def run_demo(*args: object) -> int:
        started.append("a demo run")
        return 0

    def start(self: Simulator) -> Simulator:
        started.append("a simulator")
        return self

    monkeypatch.setattr(_demo, "_run_demo", run_demo)
    monkeypatch.setattr(Simulator, "start", start)
    assert main(["demo", "--real"]) == 2
    err = capsys.readouterr().err
    assert "no vendor API key is set" in err
    for variable in ("OPENAI_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_API_KEY", "GROQ_API_KEY"):
        assert variable in err
    assert started == []  # nothing was started


def test_real_names_one_target_per_vendor_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmroute.cli._demo import real_targets

    targets, looked = real_targets({"DEEPSEEK_API_KEY": "sk-x", "GROQ_API_KEY": ""})
    assert targets == [f"deepseek:{REAL_MODELS['deepseek']}"]
    assert "DEEPSEEK_API_KEY" in looked and "OPENAI_API_KEY" in looked


def test_workload_repeats_popular_prompts_at_temperature_0() -> None:
    asks = workload(200, 0.3, seed=7)
    assert asks == workload(200, 0.3, seed=7)
    popular = [a for a in asks if a.temperature == 0]
    assert 30 < len(popular) < 90
    assert len({a.messages[0]["content"] for a in popular}) <= 5
    others = [a.messages[0]["content"] for a in asks if a.temperature != 0]
    assert len(set(others)) == len(others)


def test_tiers_part_without_the_classifier_says_which_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import io

    import anyio

    from llmroute.cli._format import make_console

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wordllama" else found(name)
    )
    started: list[str] = []
    monkeypatch.setattr(Simulator, "start", lambda self: started.append("a simulator") or self)
    out = io.StringIO()
    args = argparse.Namespace(seed=7, concurrency=8, max_tokens=16)
    assert anyio.run(_demo._tiers_demo, make_console(out), args) == 0
    assert "tiers part skipped" in out.getvalue() and "[tiers]" in out.getvalue()
    assert started == []
