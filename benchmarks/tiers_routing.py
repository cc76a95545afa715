"""Tiers in the simulator (issue 27's done-when): simple prompts' TTFT with a tiered name,
against always-large and always-small, in one run.

Two simulated models, each a ``SimulatorProcess`` (its own process, TLS + HTTP/2, one SSE event
per DATA frame as vendors that flush each token send them), 16-token replies:

``small``  median TTFT ``--small-ms`` (150), lognormal sigma 0.35, 2% stalls of +0.5..1.5 s,
           10 ms between tokens
``large``  median TTFT ``--large-ms`` (450), the same spread, 25 ms between tokens

Routes ``chat-small`` and ``chat-large`` (one target each) and the tiered name ``auto``
(``simple`` -> ``chat-small``, ``hard`` -> ``chat-large``, default ``chat-large``), whose
classifier is fitted from ``--train`` (benchmarks/data/tiers_train.jsonl, 154 hand-written
prompts) at ``warmup()``. The measured prompts are ``--test`` (benchmarks/data/tiers_heldout.jsonl:
283 other hand-written prompts, English, Chinese, Japanese and mixed, labelled simple or hard;
none is in the training file), each sent ``--passes`` times.

Three arms run at the same time, each with its own client and ``--concurrency`` requests in
flight, over the same prompt order, so every arm sees the same machine load:

``tiered``        model ``auto``
``always-large``  model ``chat-large``
``always-small``  model ``chat-small``

Each arm first sends ``--warmup`` requests of training prompts (not measured). TTFT is the
caller's view: from ``create()`` to the first chunk with content (benchmarks/routing.py's
``stream_once``). Percentiles are nearest-rank. A prompt "reached" a tier when the answer came
from that tier's target (``route.winner``), so a request hedged across tiers counts where its
answer came from. The tiered arm's decisions are counted by ``route.tier.reason`` (every value
that occurs, so a new reason shows up), "uncertain" being a decision whose class was not
acted on for want of confidence (``default`` without an error) or one hedged across tiers.

Each arm's spend is priced as if the small tier were OpenAI's gpt-6-luna and the large one
gpt-6.1-sol (the catalog's prices: 0.1 / 0.5 and 2 / 10 USD per million input / output tokens):
every attempt pays the prompt (llmroute's estimate, characters / 4) and the tokens it delivered
(the route report's ``tokens``; a winner that reported none, its 16), a cancelled hedge its
prompt. It is what the tiers saved in money against always-large.

Goals (issue 27): tiered simple p50 <= 0.5x always-large's simple p50; >= 95% of hard prompts
reach the large tier. Exit status 0 when both are met, 1 otherwise.

    PYTHONPATH=. .venv/bin/python benchmarks/tiers_routing.py             # about a minute
    PYTHONPATH=. .venv/bin/python benchmarks/tiers_routing.py --quick     # smoke run, seconds
    PYTHONPATH=. .venv/bin/python benchmarks/tiers_routing.py --json /tmp/tiers_routing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine  # benchmarks/_machine.py, beside this script
from routing import Outcome, Sims, drive, pct, stream_once

import llmroute
from llmroute.routing.stats import estimate_prompt_tokens
from llmroute.testing import Profile
from llmroute.tiers import read_examples

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "data" / "tiers_train.jsonl"
TEST = HERE / "data" / "tiers_heldout.jsonl"
SMALL, LARGE, TIERED = "chat-small", "chat-large", "auto"
ARMS = {"tiered": TIERED, "always-large": LARGE, "always-small": SMALL}
REPLY_TOKENS = 16
PRICES = {"small": (0.1, 0.5), "large": (2.0, 10.0)}  # USD per million input / output tokens
SIMPLE_RATIO_GOAL = 0.5  # tiered simple p50 <= this x always-large's
HARD_ON_LARGE_GOAL = 0.95


def profiles(small_ms: float, large_ms: float) -> dict[str, Profile]:
    common: dict[str, Any] = {
        "reply_tokens": REPLY_TOKENS,
        "ttft_sigma": 0.35,
        "stall_prob": 0.02,
        "stall_range": (0.5, 1.5),
        "frame_per_event": True,
    }
    return {
        "small": Profile(ttft_median=small_ms / 1000, inter_token=0.01, seed=11, **common),
        "large": Profile(ttft_median=large_ms / 1000, inter_token=0.025, seed=12, **common),
    }


def config(
    sims: Sims, train: Path | None, uncertain: str = "hedge", band: float | None = None
) -> dict[str, Any]:
    """Both tiers' routes, and with ``train`` the tiered name (only its arm fits a classifier):
    an unsure decision hedged across the tiers (``uncertain``), below ``band``."""
    tiered: dict[str, Any] = {
        TIERED: {
            "tiers": {"simple": SMALL, "hard": LARGE},
            "default": LARGE,
            "examples": str(train),
            "uncertain": uncertain,
        }
    }
    if band is not None:
        tiered[TIERED]["uncertain_below"] = band
    return {
        "providers": {
            name: {"base_url": proc.base_url, "api_key": "sk-bench"}
            for name, proc in sims.procs.items()
        },
        "models": {
            SMALL: {"targets": ["small:sim-small"], "first_token_timeout": "10s"},
            LARGE: {"targets": ["large:sim-large"], "first_token_timeout": "10s"},
            **(tiered if train is not None else {}),
        },
        "routing": {"explore": 0},
    }


@dataclass
class Prompt:
    label: str
    messages: list[dict[str, str]]


def read_prompts(path: Path) -> list[Prompt]:
    out = []
    for example in read_examples(path):
        messages = example.body.get("messages")
        if not isinstance(messages, list):
            raise SystemExit(f"{path}: every example must be a chat prompt (text or messages)")
        out.append(Prompt(example.label, messages))  # type: ignore[arg-type]
    return out


@dataclass
class Arm:
    name: str
    model: str
    outcomes: list[Outcome] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    warmup_errors: int = 0
    wall: float = 0.0
    usd: float = 0.0
    """What the measured requests cost at :data:`PRICES`."""
    decision_cpu_us: list[float] = field(default_factory=list)
    """The thread's CPU time of each measured decision (the wall time is ``micros``)."""


async def run_arm(arm: Arm, sims: Sims, args: argparse.Namespace, prompts: list[Prompt]) -> None:
    warm = read_prompts(Path(args.train))[: args.warmup]
    train = Path(args.train) if arm.model == TIERED else None
    settings = config(sims, train, args.uncertain, args.uncertain_below)
    client = llmroute.AsyncOpenAI(api_key="unused", config=settings, verify=sims.ssl_context())
    async with client:
        async with asyncio.timeout(120):  # a hang guard: warmup() fits the classifier
            await client.warmup()
        warmed = await drive(
            lambda i: stream_once(client, arm.model, warm[i].messages), len(warm), args.concurrency
        )
        arm.warmup_errors = sum(o.error is not None for o in warmed)
        if arm.model == TIERED:
            timed_cpu(client, arm.decision_cpu_us)
        began = time.perf_counter()
        arm.outcomes = await drive(
            lambda i: stream_once(client, arm.model, prompts[i].messages),
            len(prompts),
            args.concurrency,
        )
        arm.wall = time.perf_counter() - began
    arm.labels = [p.label for p in prompts]
    arm.usd = sum(spend(o, p.messages) for o, p in zip(arm.outcomes, prompts, strict=True))


def timed_cpu(client: llmroute.AsyncOpenAI, into: list[float]) -> None:
    """Record the thread's CPU time of every decision of the tiered name from now on: what a
    decision costs, apart from the preemptions a shared machine adds to its wall time."""
    tiered = client._llmroute.tiered[TIERED]
    tiered.classifier = _CPUTimed(tiered.classifier, into)  # built by warmup()


class _CPUTimed:
    """A classifier whose ``decide`` also records its thread CPU time."""

    def __init__(self, classifier: Any, into: list[float]) -> None:
        self._classifier, self._into = classifier, into

    def decide(self, body: Any, band: Any = None) -> Any:
        start = time.thread_time_ns()
        try:
            return self._classifier.decide(body, band)
        finally:
            self._into.append((time.thread_time_ns() - start) / 1000)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._classifier, name)


def tier_of(outcome: Outcome) -> str | None:
    """The tier whose target answered (``None`` for an error)."""
    winner = getattr(outcome.route, "winner", None)
    if not isinstance(winner, str):
        return None
    return {"small": "small", "large": "large"}.get(winner.partition(":")[0])


def spend(outcome: Outcome, messages: list[dict[str, str]]) -> float:
    """What a request's attempts cost at :data:`PRICES`, in USD (see the module's docstring)."""
    prompt = estimate_prompt_tokens(messages)
    usd = 0.0
    for attempt in getattr(outcome.route, "attempts", None) or ():
        price = PRICES.get(attempt.target.partition(":")[0])
        if price is None:
            continue
        tokens = attempt.tokens
        if tokens is None:
            tokens = REPLY_TOKENS if attempt.outcome == "won" else 0
        usd += (prompt * price[0] + tokens * price[1]) / 1e6
    return usd


def uncertain(decision: Any) -> bool:
    reason = getattr(decision, "reason", "")
    return (reason == "default" and getattr(decision, "error", None) is None) or "hedge" in reason


def summarise(arm: Arm) -> dict[str, Any]:
    pairs = list(zip(arm.labels, arm.outcomes, strict=True))

    def ttfts(label: str | None) -> list[float]:
        return [
            o.ttft for lab, o in pairs if (label is None or lab == label) and o.ttft is not None
        ]

    def reached(label: str, tier: str) -> float:
        of = [o for lab, o in pairs if lab == label]
        return sum(tier_of(o) == tier for o in of) / len(of) if of else float("nan")

    out: dict[str, Any] = {
        "arm": arm.name,
        "model": arm.model,
        "requests": len(pairs),
        "errors": dict(Counter(o.error for o in arm.outcomes if o.error is not None)),
        "warmup_errors": arm.warmup_errors,
        "wall_s": arm.wall,
        "attempts_per_request": sum(
            len(getattr(o.route, "attempts", ()) or ()) for o in arm.outcomes
        )
        / max(1, len(pairs)),
        "usd_per_1k": 1000 * arm.usd / max(1, len(pairs)),
        "hard_on_large": reached("hard", "large"),
        "simple_on_small": reached("simple", "small"),
    }
    for label in ("simple", "hard", None):
        values = ttfts(label)
        key = label or "all"
        out[f"{key}_p50"] = pct(values, 0.5)
        out[f"{key}_p95"] = pct(values, 0.95)
        out[f"{key}_n"] = len(values)
    decisions = [getattr(o.route, "tier", None) for o in arm.outcomes]
    decisions = [d for d in decisions if d is not None]
    if decisions:
        out["reasons"] = dict(Counter(d.reason for d in decisions))
        out["uncertain"] = sum(uncertain(d) for d in decisions)
        out["hedged"] = sum(
            "hedge" in d.reason or bool(getattr(o.route, "hedges", 0))
            for o, d in zip(arm.outcomes, decisions, strict=False)
        )
        micros = [d.micros for d in decisions if d.reason not in ("override", "conversation")]
        out["decision_us_p50"] = pct(micros, 0.5)
        out["decision_us_p99"] = pct(micros, 0.99)
        out["decision_cpu_us_p50"] = pct(arm.decision_cpu_us, 0.5)
        out["decision_cpu_us_p99"] = pct(arm.decision_cpu_us, 0.99)
        wrong = Counter(
            (lab, d.label) for lab, d in zip(arm.labels, decisions, strict=False) if lab != d.label
        )
        out["misclassified"] = {f"{a} as {b}": n for (a, b), n in sorted(wrong.items())}
    return out


def ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.0f} ms"


def percent(share: float) -> str:
    return "-" if share != share else f"{share * 100:.1f}%"


HEADER = (
    "| arm | requests | errors | simple p50 | simple p95 | hard p50 | hard p95 | all p50 "
    "| hard on large | simple on small | attempts / request | USD / 1k |"
)


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [HEADER, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['requests']} | {sum(r['errors'].values())} "
            f"| {ms(r['simple_p50'])} | {ms(r['simple_p95'])} | {ms(r['hard_p50'])} "
            f"| {ms(r['hard_p95'])} | {ms(r['all_p50'])} | {percent(r['hard_on_large'])} "
            f"| {percent(r['simple_on_small'])} | {r['attempts_per_request']:.2f} "
            f"| {r['usd_per_1k']:.4f} |"
        )
    return lines


async def run(args: argparse.Namespace) -> dict[str, Any]:
    test = read_prompts(Path(args.test))
    if args.limit:
        simple = [p for p in test if p.label == "simple"][: args.limit // 2]
        hard = [p for p in test if p.label == "hard"][: args.limit - len(simple)]
        test = [p for pair in zip(simple, hard, strict=False) for p in pair]
    prompts = test * args.passes
    with Sims(profiles(args.small_ms, args.large_ms)) as sims:
        arms = [Arm(name, model) for name, model in ARMS.items()]
        async with asyncio.TaskGroup() as tg:
            for arm in arms:
                tg.create_task(run_arm(arm, sims, args, prompts))
    rows = [summarise(arm) for arm in arms]
    return {
        "machine": _machine.machine(["openai", "httpx", "h2", "numpy", "wordllama"]),
        "loadavg": os.getloadavg(),
        "args": vars(args),
        "prompts": {"distinct": len(test), "requests_per_arm": len(prompts)},
        "rows": rows,
    }


def report_lines(result: dict[str, Any]) -> tuple[list[str], bool]:
    rows = {r["arm"]: r for r in result["rows"]}
    tiered, large = rows["tiered"], rows["always-large"]
    ratio = tiered["simple_p50"] / large["simple_p50"]
    ok_ratio = ratio <= SIMPLE_RATIO_GOAL
    ok_hard = tiered["hard_on_large"] >= HARD_ON_LARGE_GOAL
    m, args, nan = result["machine"], result["args"], float("nan")
    lines = [
        f"machine: {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}, load average "
        f"{result['loadavg'][0]:.1f}; small {args['small_ms']:.0f} ms, large "
        f"{args['large_ms']:.0f} ms median TTFT; {result['prompts']['distinct']} prompts x "
        f"{args['passes']} passes per arm, {args['concurrency']} at a time per arm, three arms "
        "at once",
        "",
        *table(result["rows"]),
        "",
        f"tiered decisions: reasons {tiered.get('reasons', {})}; uncertain "
        f"{tiered.get('uncertain', 0)}; hedged {tiered.get('hedged', 0)}; "
        f"misclassified {tiered.get('misclassified', {})}",
        f"decision time (wall, route.tier.micros): p50 {tiered.get('decision_us_p50', nan):.0f} "
        f"us, p99 {tiered.get('decision_us_p99', nan):.0f} us; CPU: p50 "
        f"{tiered.get('decision_cpu_us_p50', nan):.0f} us, p99 "
        f"{tiered.get('decision_cpu_us_p99', nan):.0f} us",
        f"simple p50, tiered / always-large: {ratio:.2f}x  "
        f"{'PASS' if ok_ratio else 'FAIL'} (<= {SIMPLE_RATIO_GOAL}x)",
        f"spend, tiered / always-large: {tiered['usd_per_1k'] / large['usd_per_1k']:.2f}x "
        f"(USD {tiered['usd_per_1k']:.4f} against {large['usd_per_1k']:.4f} per 1k requests)",
        f"hard prompts answered by the large tier: {percent(tiered['hard_on_large'])}  "
        f"{'PASS' if ok_hard else 'FAIL'} (>= {HARD_ON_LARGE_GOAL:.0%})",
    ]
    return lines, ok_ratio and ok_hard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--train", default=str(TRAIN), help="labelled JSONL the classifier fits")
    parser.add_argument("--test", default=str(TEST), help="labelled JSONL of measured prompts")
    parser.add_argument("--passes", type=int, default=2, help="times each prompt is sent (2)")
    parser.add_argument("--limit", type=int, default=0, help="use only this many test prompts")
    parser.add_argument("--concurrency", type=int, default=8, help="per arm (8)")
    parser.add_argument("--warmup", type=int, default=24, help="unmeasured requests per arm")
    parser.add_argument("--small-ms", type=float, default=150.0, help="small tier median TTFT")
    parser.add_argument("--large-ms", type=float, default=450.0, help="large tier median TTFT")
    parser.add_argument(
        "--uncertain",
        choices=("hedge", "default"),
        default="hedge",
        help="an unsure decision: hedged across the tiers (hedge) or sent to the default tier",
    )
    parser.add_argument(
        "--uncertain-below", type=float, default=None, help="the band (the classifier's: 0.6)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 24 prompts, 1 pass")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.passes, args.limit, args.warmup = 1, args.limit or 24, min(args.warmup, 8)
    result = asyncio.run(run(args))
    lines, ok = report_lines(result)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
