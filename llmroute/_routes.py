"""The routing state a config builds: each route's engine route and policy, the live stats,
the reading of self-hosted servers' ``/metrics`` and the exchange of stats through Redis."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.to_thread

from ._background import spawn
from .config import ConfigError, Resolved, ResolvedProvider, RouteConfig, Target, route_config
from .pricing import find_price
from .routing.budget import CostBudget, HedgeBudget
from .routing.cheapest import CheapestPolicy
from .routing.engine import Router
from .routing.goal import LatencyGoal
from .routing.policies import (
    FailoverPolicy,
    FastestPolicy,
    HedgePolicy,
    LeastLoadedPolicy,
    Policy,
    PrefixPolicy,
    RacePolicy,
    RoundRobinPolicy,
    WeightedPolicy,
)
from .routing.price import TargetPrice, target_price
from .routing.route import Route, RouteTarget
from .routing.server_metrics import MetricsPoller
from .routing.shared import StatsSync
from .routing.snapshot import StatsFile
from .routing.stats import LiveStats, StatsSettings

__all__ = [
    "ServerPolling",
    "add_targets",
    "build_router",
    "policy_for",
    "prices_for",
    "route_for",
    "stats_file_for",
    "stats_sync_for",
]

METRICS_INTERVAL = 1.0  # seconds between reads of a self-hosted server's /metrics
_log = logging.getLogger("llmroute")


def policy_for(config: RouteConfig) -> Policy:
    if config.policy == "prefix":
        return PrefixPolicy(
            block_chars=config.prefix_block_chars,
            max_blocks=config.prefix_max_blocks,
            cache_threshold=config.cache_threshold,
            balance_abs_threshold=config.balance_abs_threshold,
            balance_rel_threshold=config.balance_rel_threshold,
            rank_by=config.rank_by,
        )
    if config.policy == "least-loaded":
        return LeastLoadedPolicy(rank_by=config.rank_by)
    if config.policy == "round-robin":
        return RoundRobinPolicy()
    if config.policy == "fastest":
        return FastestPolicy(rank_by=config.rank_by)
    if config.policy == "hedge":
        return HedgePolicy(
            rank_by=config.rank_by, hedge_after=config.hedge_after, max_hedges=config.max_hedges
        )
    if config.policy == "race":
        return RacePolicy(k=config.race, rank_by=config.rank_by)
    if config.policy == "weighted":
        return WeightedPolicy(weights=tuple(config.weights or ()))
    if config.policy == "cheapest":
        return CheapestPolicy(rank_by=config.rank_by, max_hedges=config.max_hedges)
    return FailoverPolicy()


def prices_for(
    name: str,
    config: RouteConfig,
    targets: Iterable[Target],
    providers: Mapping[str, ResolvedProvider],
) -> dict[str, TargetPrice]:
    """The known prices of a route's targets, for policy ``cheapest`` and a hedge budget in
    money (empty for other routes); a target without one is logged once, here."""
    if config.policy != "cheapest" and config.hedge_budget_cost is None:
        return {}
    prices: dict[str, TargetPrice] = {}
    for t in targets:
        spec = providers[t.provider].spec
        price, why = target_price(find_price(spec.prices, t.model), t.model)
        if price is None:
            _log.warning(
                "route %r: %s (target %s): it goes after every priced target that meets the "
                "goal, and the hedge budget in money never hedges to it",
                name,
                why,
                t.name,
            )
        else:
            prices[t.name] = price
    return prices


def route_for(
    name: str,
    config: RouteConfig,
    targets: Iterable[Target],
    providers: Mapping[str, ResolvedProvider],
) -> Route:
    """The engine's route for one ``[models.<name>]`` table."""
    targets = list(targets)
    return Route(
        name=name,
        targets=tuple(
            RouteTarget(
                provider=t.provider,
                model=t.model,
                continuation=providers[t.provider].spec.continuation,
                stream_usage=providers[t.provider].spec.stream_usage,
                stream_usage_continuous=providers[t.provider].spec.stream_usage_continuous,
                protocol=providers[t.provider].spec.protocol,
                context_window=config.context_windows.get(
                    t.name, providers[t.provider].spec.window_for(t.model)
                ),
                trial=providers[t.provider].spec.trial.body,
                request_id_headers=providers[t.provider].spec.request_id_headers,
                max_tokens_field=providers[t.provider].spec.max_tokens_field,
                price=find_price(providers[t.provider].spec.prices, t.model),
                usage_fields=providers[t.provider].spec.usage_fields,
            )
            for t in targets
        ),
        policy=policy_for(config),
        budget=HedgeBudget(ratio=config.hedge_budget),
        prices=prices_for(name, config, targets, providers),
        cost_budget=None
        if config.hedge_budget_cost is None
        else CostBudget(ratio=config.hedge_budget_cost),
        first_token_timeout=config.first_token_timeout,
        continue_on_break=config.continue_on_break,
        max_continuations=config.max_continuations,
        retry_after_max=config.retry_after_max,
        stall_timeout=None if config.stall_timeout == "off" else config.stall_timeout,
        server_error_retries=config.server_error_retries,
        failover_on=frozenset(config.failover_on),
        connect_timeout=config.connect_timeout,
        goal=LatencyGoal(config.ttft_target, config.min_tokens_per_s)
        if config.ttft_target is not None or config.min_tokens_per_s is not None
        else None,
    )


def build_router(
    resolved: Resolved,
    *,
    max_retries: int,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> Router:
    """The routing engine for a resolved config: its routes, live stats and health (``clock``
    and ``rng``: a test's, or a virtual run's)."""
    settings = resolved.routing
    stats = LiveStats(
        StatsSettings(
            window=settings.window,
            max_samples=settings.window_samples,
            prompt_classes=tuple(settings.prompt_classes),
            prior_ttft=settings.ttft_prior,
        ),
        clock,
        journal=settings.stats_backend == "redis",
    )
    routes = {
        name: route_for(name, resolved.route_configs[name], targets, resolved.providers)
        for name, targets in resolved.routes.items()
    }
    return Router(
        routes,
        stats=stats,
        breaker_failures=settings.breaker_failures,
        breaker_cooldown=settings.breaker_cooldown,
        breaker_max_cooldown=settings.breaker_max_cooldown,
        explore_share=settings.explore,
        max_retries=max_retries,
        rng=rng,
        clock=clock,
    )


def add_targets(
    router: Router,
    providers: Mapping[str, ResolvedProvider],
    model: str,
    targets: Iterable[str],
    *,
    tiered: Iterable[str] = (),
    **route: Any,
) -> None:
    """Add ``targets`` (``"provider:model"``) to the route ``model``, made with the ``route``
    settings if it does not exist yet (``client.add_targets``); a ``ConfigError`` names what
    cannot be done: an unknown provider, a ``tiered`` name, new settings for an existing route,
    new targets for a weighted one."""
    parsed = [Target.parse(text) for text in targets]
    for target in parsed:
        if target.provider not in providers:
            raise ConfigError(
                f"models.{model}: unknown provider {target.provider!r} "
                "(add it with add_provider() first)"
            )
    if model in tiered:
        raise ConfigError(f"models.{model}: a tiered model name, not a route")
    routes = router.routes
    existing = routes.get(model)
    if existing is None:
        config = route_config(model, {"targets": [str(t) for t in parsed], **route})
        routes[model] = route_for(model, config, parsed, providers)
        return
    if route:
        raise ConfigError(f"models.{model}: the route exists; its settings cannot change")
    if isinstance(existing.policy, WeightedPolicy):
        raise ConfigError(
            f"models.{model}: a weighted route takes no new targets (each needs a weight)"
        )
    new = route_for(model, RouteConfig(targets=[str(t) for t in parsed]), parsed, providers)
    known = {t.name for t in existing.targets}
    existing.targets += tuple(t for t in new.targets if t.name not in known)


class ServerPolling:
    """Reads the self-hosted servers' ``/metrics`` (their queues feed the load-aware
    policies) in the background, at most once a second while routed requests come."""

    def __init__(self) -> None:
        self._poller: MetricsPoller | None = None
        self._next_at = 0.0

    def poll(self, router: Router, providers: Mapping[str, ResolvedProvider]) -> None:
        now = time.monotonic()
        if now < self._next_at:
            return
        self._next_at = now + METRICS_INTERVAL
        servers = {
            target.name: providers[target.provider]
            for route in router.routes.values()
            for target in route.targets
            if providers[target.provider].kind == "sglang"
        }
        if not servers:
            return
        poller = self._poller
        if poller is None or set(poller.urls) != set(servers):
            if poller is not None:
                spawn(poller.aclose, name="metrics poller close")
            poller = self._poller = MetricsPoller(
                {name: str(p.base_url) for name, p in servers.items()},
                router.stats,
                keys={name: p.api_key for name, p in servers.items() if p.api_key},
                interval=METRICS_INTERVAL,
                clock=router._clock,
            )
        spawn(poller.poll_once, name="server metrics")

    async def aclose(self) -> None:
        if self._poller is not None:
            await self._poller.aclose()
            self._poller = None


def stats_sync_for(resolved: Resolved, router: Router) -> StatsSync | None:
    """With ``stats_backend = "redis"``: the exchange of TTFT samples with the other instances."""
    settings = resolved.routing
    if settings.stats_backend != "redis":
        return None
    from .routing.shared import RedisStatsBackend

    backend = RedisStatsBackend(
        resolved.redis.url.get_secret_value(),
        prefix=resolved.redis.prefix,
        timeout=resolved.redis.timeout,
        history=settings.window,
    )
    return StatsSync(
        router.stats,
        backend,
        interval=settings.stats_sync,
        targets=routed_targets(router),
    )


def routed_targets(router: Router) -> set[str]:
    """The names of every route's targets now."""
    return {t.name for route in router.routes.values() for t in route.targets}


def stats_file_for(resolved: Resolved, router: Router) -> StatsFile | None:
    """With ``[routing] stats_file``: the file, its samples of the config's targets already
    seeded into the router's stats (a fresh client starts from what the last one learnt)."""
    settings = resolved.routing
    if settings.stats_file is None:
        return None
    stats_file = StatsFile(settings.stats_file, settings.stats_max_age, clock=router._clock)
    seeded = stats_file.load(router.stats, routed_targets(router))
    if seeded:
        _log.info("llmroute: %d samples read from the stats file %s", seeded, stats_file.path)
    return stats_file


async def save_stats(stats_file: StatsFile, router: Router) -> None:
    """Write the router's samples of its targets to the stats file (read here, written in a
    worker thread); a failure is logged (the file is a cache: closing never fails on it)."""
    text, _ = stats_file.dump(router.stats, routed_targets(router))
    try:
        await anyio.to_thread.run_sync(stats_file.write, text)
    except OSError as exc:
        _log.warning(
            "llmroute: cannot write the stats file %s (%s): the next client starts cold",
            stats_file.path,
            exc,
        )
