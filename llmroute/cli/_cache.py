"""``llmroute cache stats|clear``: the response cache's store, outside any application."""

from __future__ import annotations

import argparse
import sys

import anyio

from .._sizes import format_size
from ._parser import examples

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cache = commands.add_parser(
        "cache",
        help="the response cache: its stats, or clear it",
        description="The response cache's store (disk or redis), outside any application.",
        epilog=examples(
            "llmroute cache stats --config llmroute.toml",
            "llmroute cache stats --json",
            "llmroute cache clear --config llmroute.toml",
        ),
    )
    cache.add_argument("action", choices=["stats", "clear"])
    cache.add_argument(
        "--config", help="a TOML config (default: $LLMROUTE_CONFIG, else the default cache)"
    )
    cache.add_argument("--json", action="store_true", help="stats as one JSON object")
    cache.set_defaults(
        run=lambda args: anyio.run(_cache_command, args.action, args.config, args.json)
    )


async def _cache_command(action: str, config_path: str | None, as_json: bool) -> int:
    import json

    from ..cache import CacheUnavailable, open_store
    from ..config import CacheSettings, ConfigError, RedisSettings, load_config

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
        f"  size      {format_size(stats.bytes)}\n"
        f"  hits      {stats.hits}\n"
        f"  misses    {stats.misses}\n"
        f"  hit rate  {'-' if rate is None else f'{rate:.1%}'}\n"
    )
    return 0
