"""The request classifier's cost (issue 27): load time, and decision latency by prompt length.

- **load**: in a fresh process each round that has imported ``llmroute`` (as an application
  using it has), the seconds to ``import llmroute.tiers`` (numpy), to read a fitted artefact and
  to load wordllama's shipped tokenizer and embedding (``Classifier.load()``, what a
  ``warmup()`` will do): ``load`` is all three; ``without import`` the last two (what a process
  that already imported numpy pays).
- **decision**: ``Classifier.decide(body)`` one request at a time, features included, on chat
  bodies whose user text is about 100, 1,000 and 8,000 characters (English, Chinese and mixed
  prompts from the labelled file, repeated and cut to length; every decision a different
  prompt of its size), ``--decisions`` per size after ``--warmup`` unmeasured ones: the wall
  time ``Decision.micros`` and the thread's CPU time around the call (which a busy machine's
  preemptions do not inflate). The GC is left on: a pause counts as it would in a request.
  Also each stage's median at 8,000 characters.

Targets (issue 27): decision p99 <= 1 ms at 8,000 characters, load <= 0.5 s.

    .venv/bin/python benchmarks/tiers.py                     # about 15 s
    .venv/bin/python benchmarks/tiers.py --decisions 5000 --rounds 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "tests" / "data" / "tiers_small.jsonl"
SIZES = (100, 1000, 8000)

_LOAD = """
import json, sys, time
import llmroute  # an application using llmroute has imported it already
t0 = time.perf_counter()
import llmroute.tiers as tiers
t1 = time.perf_counter()
classifier = tiers.Classifier.open(sys.argv[1])
classifier.load()
t2 = time.perf_counter()
classifier.decide({"messages": [{"role": "user", "content": "hello"}]})
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first": t3 - t2}))
"""


def prompts(texts: list[str], size: int, count: int, rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(count):
        parts: list[str] = []
        length = 0
        while length < size:
            text = texts[int(rng.integers(len(texts)))]
            parts.append(text)
            length += len(text) + 1
        out.append(" ".join(parts)[:size])
    return out


def quantiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {
        "p50": float(np.quantile(array, 0.5)),
        "p99": float(np.quantile(array, 0.99)),
        "max": float(array.max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default=str(EXAMPLES), help="labelled JSONL to fit on")
    parser.add_argument("--decisions", type=int, default=2000, help="measured per size")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured decisions first")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes for load time")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()

    from llmroute.tiers import fit, read_examples
    from llmroute.tiers._features import (
        _code_points,
        _structure,
        capped,
        embed,
        ngram_vector,
        request_text,
    )

    examples = read_examples(args.examples)
    classifier = fit(examples)
    texts = [e.body["messages"][-1]["content"] for e in examples if "messages" in e.body]
    report: dict[str, Any] = {
        "machine": machine(["numpy", "wordllama", "tokenizers"]),
        "loadavg": os.getloadavg(),
    }

    with tempfile.TemporaryDirectory() as tmp:
        artefact = Path(tmp) / "tiers.npz"
        classifier.save(artefact)
        report["artefact_bytes"] = artefact.stat().st_size
        rounds = []
        for _ in range(args.rounds):
            done = subprocess.run(
                [sys.executable, "-c", _LOAD, str(artefact)],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            rounds.append(json.loads(done.stdout))
    report["load_rounds"] = rounds
    load = sorted(r["import"] + r["load"] for r in rounds)
    warm = sorted(r["load"] for r in rounds)

    rng = np.random.default_rng(0)
    spec = classifier.spec
    report["decision_us"] = {}
    report["decision_cpu_us"] = {}
    for size in SIZES:
        bodies = [
            {"messages": [{"role": "user", "content": p}]}
            for p in prompts(texts, size, args.warmup + args.decisions, rng)
        ]
        for body in bodies[: args.warmup]:
            classifier.decide(body)
        micros, cpu = [], []
        for body in bodies[args.warmup :]:
            start = time.thread_time_ns()
            decision = classifier.decide(body)
            cpu.append((time.thread_time_ns() - start) / 1000)
            assert decision.reason == "classifier", decision
            micros.append(decision.micros)
        report["decision_us"][size] = quantiles(micros)
        report["decision_cpu_us"][size] = quantiles(cpu)

    stage: dict[str, list[float]] = {"text": [], "embedding": [], "ngrams": [], "structure": []}
    for p in prompts(texts, 8000, 500, rng):
        body = {"messages": [{"role": "user", "content": p}]}
        t0 = time.perf_counter_ns()
        text = request_text(body)
        t1 = time.perf_counter_ns()
        embed(capped(text.user, spec.embed_chars))
        t2 = time.perf_counter_ns()
        head_tail = capped(text.user, spec.ngram_chars)
        codes = _code_points(head_tail)
        ngram_vector(codes, spec.ngram_dim)
        t3 = time.perf_counter_ns()
        _structure(text, head_tail, codes)
        t4 = time.perf_counter_ns()
        for name, ns in zip(stage, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            stage[name].append(ns / 1000)
    report["stages_8000_p50_us"] = {name: float(np.median(v)) for name, v in stage.items()}

    p99 = report["decision_us"][8000]["p99"]
    ok_decision, ok_load = p99 <= 1000, load[len(load) // 2] <= 0.5
    print(f"machine: {report['machine']['nproc']} CPUs, load average {report['loadavg'][0]:.1f}")
    print(f"artefact: {report['artefact_bytes']} bytes, {len(classifier.labels)} classes")
    print(
        f"load (import llmroute.tiers + artefact + embedding), median of {len(load)} processes: "
        f"{load[len(load) // 2]:.3f} s (max {load[-1]:.3f} s); without the import: "
        f"{warm[len(warm) // 2]:.3f} s  {'PASS' if ok_load else 'FAIL'} (<= 0.5 s)"
    )
    print(
        "\n| prompt chars | decisions | p50 us | p99 us | max us | CPU p50 us | CPU p99 us |"
        "\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    for size, q in report["decision_us"].items():
        c = report["decision_cpu_us"][size]
        print(
            f"| {size} | {args.decisions} | {q['p50']:.0f} | {q['p99']:.0f} | {q['max']:.0f} "
            f"| {c['p50']:.0f} | {c['p99']:.0f} |"
        )
    stages = ", ".join(f"{k} {v:.0f}" for k, v in report["stages_8000_p50_us"].items())
    print(f"\nstages at 8,000 chars, p50 us: {stages}")
    print(
        f"decision p99 at 8,000 chars: {p99:.0f} us  {'PASS' if ok_decision else 'FAIL'} (<= 1000)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if ok_decision and ok_load else 1


if __name__ == "__main__":
    raise SystemExit(main())
