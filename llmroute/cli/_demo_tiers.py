"""``llmroute demo``'s last part, tiers: a small fast simulated model beside a large slow one behind
the tiered name ``auto``, whose in-process classifier sends simple prompts to the small one,
against always the large one.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
from typing import TYPE_CHECKING, Any

import anyio

from ._demo_setup import DEMO_PRICES, SIM_MODEL
from ._demo_workload import Ask, Result, ask_once, drive
from ._format import ms, percentiles, ratio, table

if TYPE_CHECKING:
    from rich.console import Console


TIER_EXAMPLES: dict[str, list[str]] = {
    "simple": [
        "hi!",
        "What's the capital of Italy?",
        "Translate 'thank you' into Spanish.",
        "thanks, that's all",
        "今天星期几？",  # noqa: RUF001
        "Give me a synonym for big.",
        "How many days are in June?",
        "Tell me a short joke.",
    ],
    "hard": [
        "Prove that there are infinitely many primes.",
        "Write a Python function that parses nested JSON into dataclasses, with tests.",
        "Design a distributed rate limiter and compare token bucket with sliding windows.",
        "证明根号2是无理数，并推广到任意质数的平方根。",  # noqa: RUF001
        "Explain the CAP theorem and how PACELC refines it, with examples.",
        "Debug this stack trace and propose a fix:\nKeyError: 'user:17' in cache[key]",
        "Derive the closed form of the sum of k^2 and prove it by induction.",
        "Compare Raft and Paxos under network partitions.",
    ],
}
"""The classes of the tiered name ``auto``: a few examples each, inline in its config."""

TIER_PROMPTS: dict[str, list[str]] = {
    "simple": [
        "Hello there!",
        "What's the capital of Japan?",
        "How do you say 'good night' in French?",
        "Who wrote Romeo and Juliet?",
        "What is 12 times 12?",
        "Suggest a name for a puppy.",
        "北京是中国的首都吗？",  # noqa: RUF001
        "great, thank you!",
        "What's the opposite of 'early'?",
        "How many minutes are in a day?",
        "Recommend a good book.",
        "给我讲个笑话。",
    ],
    "hard": [
        "Prove that every tree with n vertices has n-1 edges.",
        "Implement an LRU cache in Go with O(1) operations, and explain its design.",
        "Design a URL shortener for a billion requests a day: storage, IDs and caching.",
        "Explain backpropagation with the equations for a two-layer network.",
        "用Python实现快速排序，并分析它的时间复杂度和最坏情况。",  # noqa: RUF001
        "Why does this deadlock, and how do I fix it?\n```go\nch := make(chan int)\nch <- 1\n```",
        "Compare the memory models of C++ and Java, including data races.",
        "Derive the quadratic formula and discuss complex roots.",
        "Analyse the causes of the 2008 financial crisis in a structured essay.",
        "设计一个高可用的分布式消息队列，说明复制和故障恢复。",  # noqa: RUF001
        "Write a SQL query for each customer's three latest orders with a running total.",
        "Explain how TLS 1.3's handshake works, step by step.",
    ],
}
"""The prompts the tiers part sends (none of them is an example)."""

TIER_SIMS = {"small-fast": 0.08, "large-slow": 0.4}
"""The tiers part's simulated models and their median TTFT in seconds."""


def tiers_config(sims: dict[str, Any]) -> dict[str, Any]:
    """Routes ``chat-small`` and ``chat-large`` (a simulator each) and the tiered name ``auto``."""
    providers = {
        name: {
            "base_url": sim.base_url,
            "api_key": "sk-demo-local",
            **({"prices": {"*": DEMO_PRICES[name]}} if name in DEMO_PRICES else {}),
        }
        for name, sim in sims.items()
    }
    classes = {label: {"examples": texts} for label, texts in TIER_EXAMPLES.items()}
    return {
        "providers": providers,
        "models": {
            "chat-small": {"targets": [f"small-fast:{SIM_MODEL}"]},
            "chat-large": {"targets": [f"large-slow:{SIM_MODEL}"]},
            "auto": {
                "tiers": {"simple": "chat-small", "hard": "chat-large"},
                "default": "chat-large",
                "classes": classes,
            },
        },
    }


async def _tiers_demo(console: Console, args: argparse.Namespace) -> int:
    import importlib.util

    from .. import AsyncOpenAI
    from .._install import install_hint
    from ..testing import Profile, Simulator

    if importlib.util.find_spec("wordllama") is None or importlib.util.find_spec("numpy") is None:
        console.print(
            f"(tiers part skipped: the request classifier is not installed: "
            f"{install_hint('tiers')})",
            markup=False,  # the hint's "[tiers]" is not a style
        )
        return 0
    labelled = [(label, text) for label, texts in TIER_PROMPTS.items() for text in texts]
    rng = random.Random(args.seed)
    labelled = [rng.choice(labelled) for _ in range(2 * len(labelled))]
    asks = [Ask([{"role": "user", "content": text}], 0.7) for _, text in labelled]
    console.print(
        f"\nTiers: model 'auto' classifies each prompt in process ({len(TIER_EXAMPLES['simple'])}"
        " examples a class) and sends simple ones to 'chat-small' (small-fast, median TTFT "
        f"{TIER_SIMS['small-fast'] * 1000:.0f} ms), hard ones to 'chat-large' (large-slow, "
        f"{TIER_SIMS['large-slow'] * 1000:.0f} ms); beside it, the same {len(asks)} prompts "
        "always to 'chat-large'."
    )
    common: dict[str, Any] = {"reply_tokens": 16, "inter_token": 0.01, "ttft_sigma": 0.25}
    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(
                Simulator(profile=Profile(ttft_median=median, seed=index, **common), tls=True)
            )
            for index, (name, median) in enumerate(TIER_SIMS.items(), 11)
        }
        verify = next(iter(sims.values())).ssl_context()
        config = tiers_config(sims)
        async with AsyncOpenAI(api_key="unused", config=config, verify=verify) as client:
            try:
                with anyio.fail_after(60):
                    await client.warmup()  # fits the classifier, in a worker thread
            except Exception as exc:
                sys.stderr.write(f"llmroute demo: the tiers part cannot start: {exc}\n")
                return 1
            runs: dict[str, list[Result]] = {}

            async def arm(model: str) -> None:
                async def once(index: int) -> Result:
                    return await ask_once(client, model, asks[index], args.max_tokens)

                runs[model] = await drive(once, len(asks), args.concurrency, lambda _: None)

            async with anyio.create_task_group() as tg:
                for model in ("auto", "chat-large"):
                    tg.start_soon(arm, model)
    _tiers_summary(console, [label for label, _ in labelled], runs)
    return 0


def _tiers_summary(console: Console, labels: list[str], runs: dict[str, list[Result]]) -> None:
    def ttfts(results: list[Result], label: str) -> list[float]:
        return [
            r.ttft
            for lab, r in zip(labels, results, strict=True)
            if lab == label and r.ttft is not None and r.error is None
        ]

    def on(results: list[Result], label: str, target: str) -> str:
        of = [r for lab, r in zip(labels, results, strict=True) if lab == label]
        return f"{sum(r.winner == f'{target}:{SIM_MODEL}' for r in of)}/{len(of)}"

    rows = []
    p50s: dict[str, float | None] = {}
    for model, name in (("auto", "tiered 'auto'"), ("chat-large", "always 'chat-large'")):
        results = runs[model]
        simple, hard = percentiles(ttfts(results, "simple")), percentiles(ttfts(results, "hard"))
        p50s[model] = simple[0]
        rows.append(
            [
                name,
                str(sum(r.error is not None for r in results)),
                ms(simple[0]),
                ms(simple[1]),
                ms(hard[0]),
                ms(hard[1]),
                on(results, "simple", "small-fast"),
                on(results, "hard", "large-slow"),
            ]
        )
    console.print(
        table(
            "Tiers: time to first token by kind of prompt (same prompts, same run)",
            [
                "run",
                "errors",
                "simple p50",
                "simple p95",
                "hard p50",
                "hard p95",
                "simple on small",
                "hard on large",
            ],
            rows,
        )
    )
    console.print(
        f"simple prompts' p50 TTFT: {ms(p50s['auto'])} with tiers vs {ms(p50s['chat-large'])} "
        f"always large ({ratio(p50s['chat-large'], p50s['auto'])} sooner)"
    )
