"""The README's quickstart and `make demo` run as written (real subprocesses)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_runs_as_written() -> None:
    out = run("examples/quickstart.py")
    assert "TTFT" in out and "HTTP/2" in out


def test_demo_streams_answers_with_timings() -> None:
    out = run("-m", "llmroute.cli", "demo")
    assert len(re.findall(r"first token \d+ ms", out)) == 6
    assert "failed" not in out


def test_routing_example_hedges_and_reports() -> None:
    out = run("examples/routing.py")
    assert len(re.findall(r"first token +\d+ ms", out)) == 12
    assert "fast:sim-small" in out and "live stats" in out
