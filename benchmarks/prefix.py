"""Prefix-affinity benchmark: prefix vs round-robin vs least-loaded over four SGLang stand-ins.

Four SGLang stand-in workers (``llmroute.testing``'s fake ``sglang`` package, started by
``SGLangServer`` with ``gpus=[0, 1, 2, 3]``: the launcher's real code path, one process per
"GPU"), each with a prefix cache of ``--cache-tokens`` tokens (LRU) and a TTFT of 20 ms plus
``--prefill-ms`` per 1,000 prompt tokens not in its cache. They sit behind one route of a client,
registered as targets, whose policy is ``prefix``, ``round-robin`` or ``least-loaded``.

The workload: ``--conversations`` (50) multi-turn chats of ``--turns`` (4) turns. Each chat has
a long system prompt (about ``--system-tokens`` tokens) from ``--systems`` (10) distinct ones, so
five chats share each; every turn resends the whole conversation so far, as a chat app does.
``--concurrency`` (8) chats run at once, each turn after the previous one's answer. Streamed,
with usage: the cache hit rate is the sum of ``usage.prompt_tokens_details.cached_tokens`` over
the sum of ``prompt_tokens`` (what the servers reused), TTFT is from ``create()`` to the first
content chunk. Every policy gets freshly started workers (empty caches) and the same workload in
the same order.

    .venv/bin/python benchmarks/prefix.py            # about a minute
    .venv/bin/python benchmarks/prefix.py --quick    # smoke run
    .venv/bin/python benchmarks/prefix.py --burst --policies pinned,prefix,gateway,round-robin

``--burst`` is the fleet shared by several clients: two workers, five families, three clients
(each with its own prefix trees, so only the servers' ``/metrics`` tell one client of the
others' load), ten chats at once. ``pinned`` is the best spread, for reference: each family's
chats go to one worker chosen in advance.

``--workload mooncake`` is real chat traffic's shape (``_conversations.py``: the published
statistics of the Mooncake conversation trace, one system prompt for every user, bursty
arrivals): eight workers with 512-token cache pages (``--page-size 512``) and 150,000 tokens of
cache each, streaming 16 tokens an event (``--stream-interval 16``: eight stand-ins share the
machine's cores with the client), started once, their caches flushed before each policy; 300
conversations (seed 3: 35.8% of its blocks seen before, the trace's 36.6%). Per policy: the
share of prompt tokens cached against the ceiling, one cache of the eight caches' total size fed
the same requests in the same order (replayed in-process), and the busiest worker's requests
over an even share. ``--in-process`` runs the same workload through each policy's own decisions
against in-process caches instead of servers (seconds; ``--seeds`` for several workloads)::

    .venv/bin/python benchmarks/prefix.py --workload mooncake              # about 8 minutes
    .venv/bin/python benchmarks/prefix.py --workload mooncake --quick      # smoke run
    .venv/bin/python benchmarks/prefix.py --workload mooncake --in-process --seeds 1-10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _conversations import (
    BLOCK_TOKENS,
    Conversation,
    Replayed,
    SharedCeiling,
    Workload,
    block_reuse,
    simulate,
)
from _conversations import workload as conversation_workload
from _machine import machine

from llmroute import AsyncOpenAI
from llmroute.routing.policies import LeastLoadedPolicy, PrefixPolicy, RoundRobinPolicy
from llmroute.sglang import SGLangServer
from llmroute.testing import sglang_standin_path
from llmroute.testing._sglang import prompt_token_list

POLICIES = ("prefix", "round-robin", "least-loaded")
"""Routing policies compared. With ``--policies`` also: ``pinned`` sends each system prompt's
chats to one worker chosen in advance, the best spread, for reference; ``gateway`` sends every
request to SGLang's model gateway (``smg``, cache-aware) in front of the workers, which then
decides (``pip install 'llmroute[gateway]'``)."""
WORDS = (
    "routing latency cache prefix token server client stream answer model request policy queue "
    "worker prompt system user assistant hedge failover window percentile budget target vendor"
).split()


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def system_prompt(index: int, tokens: int) -> str:
    rng = random.Random(1000 + index)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens))
    return f"You are assistant number {index}. Follow these house rules: {words}"


def workload(args: argparse.Namespace) -> list[tuple[int, str, list[str]]]:
    """Each chat: its system prompt's number, the prompt, and its user turns."""
    rng = random.Random(7)
    chats = []
    for chat in range(args.conversations):
        system = system_prompt(chat % args.systems, args.system_tokens)
        turns = [
            f"Chat {chat}, question {turn}: {rng.choice(WORDS)}?" for turn in range(args.turns)
        ]
        chats.append((chat % args.systems, system, turns))
    return chats


async def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "PYTHONPATH": sglang_standin_path(),
        "SGLANG_STANDIN_WARMUP": "0",
        "SGLANG_STANDIN_TTFT": "0.02",
        "SGLANG_STANDIN_PREFILL_MS_PER_1K": str(args.prefill_ms),
        "SGLANG_STANDIN_CACHE_TOKENS": str(args.cache_tokens),
        "SGLANG_STANDIN_REPLY_TOKENS": "16",
        "SGLANG_STANDIN_INTER_TOKEN": "0.002",
        "SGLANG_STANDIN_CHILDREN": "0",
    }
    ttfts: list[float] = []
    prompt_tokens = cached_tokens = 0
    winners: dict[str, int] = {}
    gpus = list(range(args.workers))
    async with SGLangServer(
        "standin/chat-model",
        gpus=gpus,
        env=env,
        startup_timeout=60,
        grace=5,
        gateway=policy == "gateway",
    ) as server:
        async with contextlib.AsyncExitStack() as stack:
            clients: list[AsyncOpenAI] = []
            for _ in range(args.clients):
                client = AsyncOpenAI(api_key="unused", base_url=server.base_url)
                await stack.enter_async_context(client)
                for name, table in server.providers("gpu").items():
                    client.add_provider(name, table)
                targets = server.targets("gpu")  # with the gateway: the gateway alone
                if policy == "gateway":
                    client.add_targets("chat", targets, first_token_timeout=30)
                    clients.append(client)
                    continue
                if policy == "pinned":  # the best spread: each family's worker known in advance
                    for i, target in enumerate(targets):
                        client.add_targets(f"chat-{i}", [target], policy="failover")
                    clients.append(client)
                    continue
                route: dict[str, Any] = {"policy": policy, "first_token_timeout": 30}
                if policy == "prefix":
                    route["balance_abs_threshold"] = args.balance_abs
                client.add_targets("chat", targets, **route)
                clients.append(client)
            queue = [(i % args.clients, *chat) for i, chat in enumerate(workload(args))]

            async def converse(
                client: AsyncOpenAI, family: int, system: str, turns: list[str]
            ) -> None:
                model = f"chat-{family % args.workers}" if policy == "pinned" else "chat"
                nonlocal prompt_tokens, cached_tokens
                messages: list[dict[str, str]] = [{"role": "system", "content": system}]
                for turn in turns:
                    messages.append({"role": "user", "content": turn})
                    started = time.perf_counter()
                    stream = await client.chat.completions.create(
                        model=model,
                        messages=messages,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    ttft, text = math.nan, []
                    async with stream:
                        async for chunk in stream:
                            if chunk.choices and chunk.choices[0].delta.content:
                                if math.isnan(ttft):
                                    ttft = time.perf_counter() - started
                                text.append(chunk.choices[0].delta.content)
                            if chunk.usage is not None:
                                prompt_tokens += chunk.usage.prompt_tokens
                                details = chunk.usage.prompt_tokens_details
                                cached_tokens += (details.cached_tokens or 0) if details else 0
                    ttfts.append(ttft)
                    winner = stream.route.winner if stream.route else None
                    winners[str(winner)] = winners.get(str(winner), 0) + 1
                    messages.append({"role": "assistant", "content": "".join(text)})

            async def worker() -> None:
                while queue:
                    owner, family, system, turns = queue.pop(0)
                    await converse(clients[owner], family, system, turns)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            wall = time.perf_counter() - started
    return {
        "policy": policy,
        "requests": len(ttfts),
        "cache_hit_rate": cached_tokens / prompt_tokens if prompt_tokens else math.nan,
        "p50_ms": pct(ttfts, 0.5) * 1e3,
        "p95_ms": pct(ttfts, 0.95) * 1e3,
        "wall_s": wall,
        "winners": dict(sorted(winners.items())),
    }


# -- the conversation workload (--workload mooncake) -------------------------------------------
def mooncake(args: argparse.Namespace, seed: int | None = None) -> Workload:
    return conversation_workload(
        args.seed if seed is None else seed,
        args.conversations,
        rate=args.rate,
        pause=args.pause,
        first_words=args.first_words,
    )


def standin_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        "PYTHONPATH": sglang_standin_path(),
        "SGLANG_STANDIN_WARMUP": "0",
        "SGLANG_STANDIN_TTFT": "0.02",
        "SGLANG_STANDIN_PREFILL_MS_PER_1K": str(args.prefill_ms),
        "SGLANG_STANDIN_CACHE_TOKENS": str(args.cache_tokens),
        "SGLANG_STANDIN_REPLY_TOKENS": "4000",
        "SGLANG_STANDIN_INTER_TOKEN": str(args.inter_token),
        "SGLANG_STANDIN_CHILDREN": "0",
    }


async def flush_caches(server: SGLangServer) -> None:
    """Empty every worker's prefix cache, so each policy starts from cold caches."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        for root in server.metrics_urls("gpu").values():
            (await http.post(root + "/flush_cache")).raise_for_status()


async def run_conversations(
    server: SGLangServer, policy: str, work: Workload, args: argparse.Namespace
) -> tuple[Replayed, list[float]]:
    """The workload against the stand-ins, routed by ``policy`` from a new client; the
    ceiling replays its requests in the order they were sent and answered."""
    await flush_caches(server)
    ceiling = SharedCeiling(args.cache_tokens * args.workers)
    result = Replayed()
    prompts: list[list[str]] = []
    ttfts: list[float] = []
    async with AsyncOpenAI(api_key="unused", base_url=server.base_url) as client:
        for name, table in server.providers("gpu").items():
            client.add_provider(name, table)
        targets = server.targets("gpu")
        route: dict[str, Any] = {"policy": policy, "first_token_timeout": 60}
        if policy == "prefix":
            route["balance_abs_threshold"] = args.balance_abs
        client.add_targets("chat", targets, **route)
        result.served = dict.fromkeys(targets, 0)
        started = time.perf_counter()

        async def ask(chat: Conversation, turn: int, messages: list[dict[str, str]]) -> str:
            tokens = prompt_token_list(messages)
            prompts.append(tokens)
            ceiling.sent(tokens)
            sent = time.perf_counter()
            stream = await client.chat.completions.create(
                model="chat",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=chat.answer_tokens[turn],
            )
            ttft, text = math.nan, []
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        if math.isnan(ttft):
                            ttft = time.perf_counter() - sent
                        text.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        result.prompt_tokens += chunk.usage.prompt_tokens
                        details = chunk.usage.prompt_tokens_details
                        result.cached_tokens += (details.cached_tokens or 0) if details else 0
            answer = "".join(text)
            ceiling.answered(tokens, answer)
            ttfts.append(ttft)
            winner = stream.route.winner if stream.route else None
            if winner is not None:
                result.served[winner] += 1
            return answer

        async def converse(chat: Conversation) -> None:
            await asyncio.sleep(max(0.0, chat.start - (time.perf_counter() - started)))
            messages = work.first_messages()
            for turn, question in enumerate(chat.questions):
                asked = [*messages, {"role": "user", "content": question}]
                answer = await ask(chat, turn, asked)
                if turn + 1 < len(chat.questions):
                    messages = chat.next_messages(asked, turn, answer)
                    await asyncio.sleep(chat.pauses[turn])

        await asyncio.gather(*(converse(chat) for chat in work.conversations))
    result.ceiling = ceiling.hit_rate
    result.reuse = block_reuse(prompts)
    return result, ttfts


def conversation_row(policy: str, result: Replayed, extra: str = "") -> dict[str, Any]:
    row = {
        "policy": policy,
        "requests": sum(result.served.values()),
        "cache_hit_rate": result.hit_rate,
        "ceiling": result.ceiling,
        "of_ceiling": result.hit_rate / result.ceiling,
        "busiest_share": result.busiest,
        "served": sorted(result.served.values(), reverse=True),
        "block_reuse": result.reuse,
    }
    print(
        f"{policy:13} hit rate {result.hit_rate:6.1%}  ceiling {result.ceiling:6.1%}  "
        f"({row['of_ceiling']:.2f} of it)  busiest {result.busiest:.2f}x even  "
        f"requests per worker {row['served']}{extra}",
        flush=True,
    )
    return row


async def run_mooncake(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = mooncake(args)
    rows = []
    server = SGLangServer(
        "standin/chat-model",
        gpus=list(range(args.workers)),
        env=standin_env(args),
        extra_args=["--page-size", str(BLOCK_TOKENS), "--stream-interval", "16"],
        startup_timeout=120,
        grace=5,
    )
    async with server:
        for policy in args.policies.split(","):
            rows.append(await mooncake_row(server, policy, work, args))
    reuse = rows[0]["block_reuse"] if rows else math.nan
    print(f"the prompts sent: {reuse:.1%} of their 512-token blocks seen before (trace: 36.6%)")
    return rows


async def mooncake_row(
    server: SGLangServer, policy: str, work: Workload, args: argparse.Namespace
) -> dict[str, Any]:
    result, ttfts = await run_conversations(server, policy, work, args)
    p50, p95 = pct(ttfts, 0.5) * 1e3, pct(ttfts, 0.95) * 1e3
    row = conversation_row(policy, result, f"  TTFT p50 {p50:.0f} ms p95 {p95:.0f} ms")
    return {**row, "p50_ms": p50, "p95_ms": p95}


IN_PROCESS = {
    "prefix": PrefixPolicy,
    "least-loaded": LeastLoadedPolicy,
    "round-robin": RoundRobinPolicy,
}


def run_in_process(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for seed in args.seeds:
        work = mooncake(args, seed)
        print(f"seed {seed}: {work.requests} requests", flush=True)
        for policy in args.policies.split(","):
            chosen = (
                PrefixPolicy(balance_abs_threshold=args.balance_abs)
                if policy == "prefix"
                else IN_PROCESS[policy]()
            )
            result = simulate(
                work,
                chosen,
                replicas=args.workers,
                cache_tokens=args.cache_tokens,
                prefill_ms=args.prefill_ms,
                inter_token=args.inter_token,
            )
            reuse = f"  (blocks seen before: {result.reuse:.1%})"
            rows.append({"seed": seed, **conversation_row(policy, result, reuse)})
    return rows


def seeds(text: str) -> list[int]:
    """``3`` or ``1-10`` or ``1,4,7``."""
    found: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return found


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for policy in args.policies.split(","):
        result = await run_policy(policy, args)
        results.append(result)
        r = result
        print(
            f"{policy:13} hit rate {r['cache_hit_rate']:6.1%}  p50 {r['p50_ms']:7.1f} ms  "
            f"p95 {r['p95_ms']:7.1f} ms  wall {r['wall_s']:5.1f} s  "
            f"requests per worker {list(r['winners'].values())}",
            flush=True,
        )
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=50)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--systems", type=int, default=10, help="distinct system prompts (10)")
    p.add_argument("--system-tokens", type=int, default=1500, help="words per system prompt")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--cache-tokens", type=int, default=8000, help="each worker's prefix cache")
    p.add_argument("--prefill-ms", type=float, default=40.0, help="per 1k uncached tokens")
    p.add_argument("--balance-abs", type=int, default=8, help="prefix: balance_abs_threshold")
    p.add_argument("--workers", type=int, default=4, help="stand-in workers (4)")
    p.add_argument("--clients", type=int, default=1, help="clients sharing the workers (1)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    p.add_argument("--quick", action="store_true", help="10 chats of 2 turns")
    p.add_argument(
        "--burst",
        action="store_true",
        help="several clients, new families at once: 2 workers, 5 system prompts, 40 chats, "
        "10 at once from 3 clients, each worker's cache holding about 3.5 families, 150 ms "
        "prefill per 1k uncached tokens (other flags still win)",
    )
    p.add_argument(
        "--workload",
        choices=("chats", "mooncake"),
        default="chats",
        help="chats: the families of chats above; mooncake: conversations with the Mooncake "
        "trace's statistics, 8 workers, 300 conversations, 150,000 tokens of cache each, "
        "5 ms of prefill per 1k uncached, the prefix policy's default settings",
    )
    p.add_argument("--seed", type=int, default=3, help="mooncake: the workload's seed (3)")
    p.add_argument("--seeds", type=seeds, default=None, help="--in-process: e.g. 1-10")
    p.add_argument("--rate", type=float, default=8.0, help="mooncake: conversations a second")
    p.add_argument("--pause", type=float, default=2.0, help="mooncake: median pause (s)")
    p.add_argument(
        "--first-words",
        type=float,
        default=5120.0,
        help="mooncake: median first question in tokens (5,120: the trace's 11 blocks)",
    )
    p.add_argument("--inter-token", type=float, default=0.001, help="mooncake: seconds")
    p.add_argument("--in-process", action="store_true", help="mooncake: no servers")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    known = p.parse_known_args(argv)[0]
    if known.burst:  # its settings are defaults: other flags win
        p.set_defaults(workers=2, systems=5, conversations=40, concurrency=10, clients=3)
        p.set_defaults(cache_tokens=6000, prefill_ms=150.0)
    if known.workload == "mooncake":
        p.set_defaults(workers=8, conversations=300, cache_tokens=150_000, prefill_ms=5.0)
        p.set_defaults(balance_abs=64)
    args = p.parse_args(argv)
    if args.workload == "mooncake":
        return mooncake_main(args)
    if args.quick:
        args.conversations, args.turns = 10, 2
    print(
        f"{args.conversations} chats x {args.turns} turns, {args.systems} system prompts of "
        f"~{args.system_tokens} words, {args.concurrency} chats at once from {args.clients} "
        f"client(s); {args.workers} stand-in workers, "
        f"cache {args.cache_tokens} tokens each, prefill {args.prefill_ms} ms per 1k uncached",
        flush=True,
    )
    results = asyncio.run(run(args))
    info = machine(["llmroute", "httpx", "h2"])
    print(f"machine: {json.dumps(info)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=2))
    return 0


def mooncake_main(args: argparse.Namespace) -> int:
    if args.quick:
        args.conversations = 40
    bad = set(args.policies.split(",")) - set(IN_PROCESS)
    if bad:
        print(f"--workload mooncake compares {', '.join(IN_PROCESS)}; not {', '.join(bad)}")
        return 2
    args.seeds = args.seeds or [args.seed]
    print(
        f"{args.conversations} conversations (seed {', '.join(map(str, args.seeds))}) at "
        f"{args.rate:g} a second in bursts; {args.workers} workers, cache {args.cache_tokens} "
        f"tokens each in {BLOCK_TOKENS}-token pages, prefill {args.prefill_ms} ms per 1k uncached"
        + (" (in-process)" if args.in_process else ""),
        flush=True,
    )
    rows = run_in_process(args) if args.in_process else asyncio.run(run_mooncake(args))
    info = machine(["llmroute", "httpx", "h2"])
    print(f"machine: {json.dumps(info)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
