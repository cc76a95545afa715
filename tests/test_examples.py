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


def test_make_demo_runs_the_demo_command() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/llmroute demo" in recipe
    out = run("-m", "llmroute.cli", "demo", "--requests", "24", "--concurrency", "12")
    assert "Summary:" in out and "P95 improvement:" in out
    assert re.search(r"routed: hedge \+ cache +\d+ +\d+ +\d+ ms", out)


def test_routing_example_hedges_and_reports() -> None:
    out = run("examples/routing.py")
    assert len(re.findall(r"first token +\d+ ms", out)) == 12
    assert "fast:sim-small" in out and "live stats" in out
