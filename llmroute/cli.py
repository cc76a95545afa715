"""The ``llmroute`` command line: ``llmroute demo``, ``llmroute cache stats|clear``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

__all__ = ["main"]

_PROMPTS = [
    "Explain HTTP/2 multiplexing in one sentence.",
    "Why does time to first token matter for chat apps?",
]


def _demo_profiles() -> dict[str, object]:
    from .testing import Profile

    return {
        "fast-but-spiky": Profile(
            ttft_median=0.08,
            ttft_sigma=0.3,
            stall_prob=0.25,
            stall_range=(0.5, 1.0),
            inter_token=0.015,
            reply_tokens=24,
            seed=1,
        ),
        "steady-slow": Profile(
            ttft_median=0.35, ttft_sigma=0.05, inter_token=0.03, reply_tokens=24, seed=2
        ),
        "flaky": Profile(
            ttft_median=0.12,
            ttft_sigma=0.2,
            inter_token=0.02,
            reply_tokens=24,
            rate_429=0.3,
            retry_after=0.05,
            seed=3,
        ),
    }


async def _demo(out: object = None) -> int:
    import contextlib

    from . import AsyncOpenAI, OpenAIError
    from .testing import Simulator

    write = sys.stdout.write
    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(Simulator(profile=profile, tls=True))  # type: ignore[arg-type]
            for name, profile in _demo_profiles().items()
        }
        write(
            "llmroute demo: three simulated providers on 127.0.0.1 (TLS + HTTP/2), no API keys\n\n"
        )
        for name, sim in sims.items():
            async with AsyncOpenAI(
                api_key="demo-key", base_url=sim.base_url, verify=sim.ssl_context()
            ) as client:
                await client.warmup()
                for prompt in _PROMPTS:
                    write(f"[{name}] {prompt}\n  > ")
                    try:
                        stream = await client.chat.completions.create(
                            model="sim-small",
                            messages=[{"role": "user", "content": prompt}],
                            stream=True,
                        )
                        async with stream:
                            async for chunk in stream:
                                if chunk.choices and chunk.choices[0].delta.content:
                                    write(chunk.choices[0].delta.content)
                                    sys.stdout.flush()
                        t = stream.timings
                        write(
                            f"\n  {t.http_version}, connection "
                            f"{'reused' if t.connection_reused else 'new'}, "
                            f"headers {_ms(t.headers)}, first token {_ms(t.first_token)}, "
                            f"total {_ms(t.total)}, {t.tokens} tokens, "
                            f"{t.retries} retries\n\n"
                        )
                    except OpenAIError as exc:
                        write(f"\n  failed: {type(exc).__name__}: {exc}\n\n")
        write(
            "Routing across these providers (hedging on live P95 TTFT) comes with the routing "
            "work.\n"
        )
    return 0


async def _cache_command(action: str, config_path: str | None, as_json: bool) -> int:
    import json

    from ._config import CacheSettings, ConfigError, RedisSettings, load_config
    from .cache import CacheUnavailable, open_store

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        sys.stderr.write(f"llmroute cache: {exc}\n")
        return 2
    settings = (config.cache if config is not None else None) or CacheSettings()
    redis = config.redis if config is not None else RedisSettings()
    if settings.backend in ("off", "memory"):
        sys.stdout.write(
            f"The cache backend is {settings.backend!r}: nothing is kept outside the app's "
            "own process.\n"
        )
        return 0
    try:
        store = open_store(settings, redis)
    except CacheUnavailable as exc:
        sys.stderr.write(f"llmroute cache: {exc}\n")
        return 1
    try:
        if action == "clear":
            removed = await store.clear()
            sys.stdout.write(f"Cleared the cache, {store.describe()}: {removed} entries.\n")
            return 0
        stats = await store.stats()
    except CacheUnavailable as exc:
        sys.stderr.write(f"llmroute cache: {exc}\n")
        return 1
    finally:
        await store.aclose()
    rate = stats.hit_rate
    if as_json:
        data = {
            "store": store.describe(),
            "entries": stats.entries,
            "bytes": stats.bytes,
            "hits": stats.hits,
            "misses": stats.misses,
            "hit_rate": rate,
        }
        sys.stdout.write(json.dumps(data) + "\n")
        return 0
    sys.stdout.write(
        f"{store.describe()}\n"
        f"  entries   {stats.entries}\n"
        f"  bytes     {stats.bytes}\n"
        f"  hits      {stats.hits}\n"
        f"  misses    {stats.misses}\n"
        f"  hit rate  {'-' if rate is None else f'{rate:.1%}'}\n"
    )
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmroute", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="stream answers from simulated providers (no keys needed)")
    cache = commands.add_parser("cache", help="the response cache: its stats, or clear it")
    cache.add_argument("action", choices=["stats", "clear"])
    cache.add_argument(
        "--config", help="a TOML config (default: $LLMROUTE_CONFIG, else the default cache)"
    )
    cache.add_argument("--json", action="store_true", help="stats as one JSON object")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return anyio.run(_demo)
    if args.command == "cache":
        return anyio.run(_cache_command, args.action, args.config, args.json)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
