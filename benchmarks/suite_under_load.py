"""Run the test suite several times with CPU-burning processes beside it: does it ever flake?

    .venv/bin/python benchmarks/suite_under_load.py [--runs 5] [--burners 2] [-- PYTEST ARGS]

Starts ``--burners`` processes that spin on the CPU for as long as the script runs (two by
default, as a busy CI machine or a neighbour's build would), then runs ``python -m pytest -q``
``--runs`` times in a row (arguments after ``--`` are passed to pytest, e.g. a test directory or
``-k``). Prints each run's outcome and duration, stops the burners it started (by their own
process handles, nothing else), and exits 1 unless every run passed. The suite asserts no
wall-clock time, so a pass here should not depend on the load; this script is how anyone checks.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _burn() -> None:  # pragma: no cover - runs in a child process until terminated
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def _load() -> str:
    """The 1, 5 and 15 minute load averages: how busy the machine was, burners included."""
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - platforms without getloadavg
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, pytest_args = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="suite runs (5)")
    parser.add_argument("--burners", type=int, default=2, help="CPU-burning processes (2)")
    parser.add_argument(
        "--log-dir", help="write each run's whole pytest output here (run-1.log, ...)"
    )
    options = parser.parse_args(args)
    if options.runs < 1 or options.burners < 0:
        parser.error("--runs must be at least 1 and --burners at least 0")
    burners = [
        multiprocessing.Process(target=_burn, name=f"cpu-burner-{i}", daemon=True)
        for i in range(options.burners)
    ]
    for burner in burners:
        burner.start()
    print(
        f"{options.burners} CPU burners running (pids "
        f"{', '.join(str(b.pid) for b in burners) or '-'}) on {os.cpu_count()} CPUs, "
        f"load average {_load()}; {options.runs} runs of pytest -q {' '.join(pytest_args)}",
        flush=True,
    )
    results: list[tuple[int, float, str]] = []
    try:
        for run in range(1, options.runs + 1):
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            took = time.monotonic() - started
            if options.log_dir:
                Path(options.log_dir).mkdir(parents=True, exist_ok=True)
                (Path(options.log_dir) / f"run-{run}.log").write_text(done.stdout + done.stderr)
            lines = done.stdout.strip().splitlines()
            summary = lines[-1] if lines else "(no output)"
            results.append((done.returncode, took, summary))
            print(f"run {run}: {'PASS' if done.returncode == 0 else 'FAIL'} in {took:.0f} s "
                  f"(load average after it {_load()}): {summary}", flush=True)  # fmt: skip
            if done.returncode != 0:
                failed = [line for line in lines if re.match(r"(FAILED|ERROR) ", line)]
                for line in failed[:20]:
                    print(f"    {line}", flush=True)
    finally:
        for burner in burners:
            burner.terminate()
        for burner in burners:
            burner.join(timeout=5)
    passed = sum(code == 0 for code, _, _ in results)
    print(f"{passed} of {len(results)} runs passed with {options.burners} CPU burners beside them")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
