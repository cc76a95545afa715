"""What ``llmroute bench`` probes, from a config: every target of its routes reached directly (a
target of another wire protocol through a one-target route), or one route as a whole.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._bench_probe import _Endpoint

if TYPE_CHECKING:
    from ..config import Config, SimulatorAddress


def _routed_endpoint(
    config: Config,
    name: str,
    verify: bool | str,
    endpoints: list[_Endpoint],
    simulated: Mapping[str, SimulatorAddress] | None = None,
) -> tuple[_Endpoint, list[str]]:
    """The route ``name`` of ``config`` (or its only route when ``name`` is empty) as one
    endpoint, with the targets it may send to. Raises ConfigError naming the routes there are."""
    from ..config import ConfigError, resolve

    resolved = resolve(config, simulated=simulated)
    names = [*resolved.routes, *config.tiered]
    if not name:
        if len(names) != 1:
            raise ConfigError(
                f"{config.source}: --routed needs a route name; the routes are: "
                f"{', '.join(names) or '(none)'}"
            )
        name = names[0]
    if name in resolved.routes:
        targets = [t.name for t in resolved.routes[name]]
    elif name in config.tiered:
        tiers = config.tiered[name]
        tier_routes = dict.fromkeys([*tiers.tiers.values(), tiers.default])
        targets = list(
            dict.fromkeys(t.name for route in tier_routes for t in resolved.routes.get(route, []))
        )
    else:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{config.source}: --routed {name!r} is no route of the config{hint}; the routes "
            f"are: {', '.join(names) or '(none)'}"
        )
    secrets = tuple(dict.fromkeys(s for e in endpoints for s in e.secrets))
    client_args: dict[str, Any] = {"api_key": "unused", "config": config, "verify": verify}
    return _Endpoint(name, name, client_args, secrets), targets


def _select(
    endpoints: list[_Endpoint], wanted: list[str] | None
) -> tuple[list[_Endpoint], list[str]]:
    if wanted is None:
        return endpoints, []
    known = {e.target: e for e in endpoints}
    return [known[t] for t in wanted if t in known], [t for t in wanted if t not in known]


def _missing(missing: list[str], endpoints: list[_Endpoint]) -> int:
    """``missing`` named, with every target that could have been (all, not only the selected)."""
    known = [e.target for e in endpoints]
    hints = ""
    for name in missing:
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            hints += f" (did you mean {close[0]!r} for {name!r}?)"
    sys.stderr.write(
        f"llmroute bench: unknown target {', '.join(missing)}{hints}; "
        f"the targets are: {', '.join(known) or '(none: the config has no routes)'}\n"
    )
    return 2


def _config_endpoints(
    config: Config,
    verify: bool | str = True,
    simulated: Mapping[str, SimulatorAddress] | None = None,
) -> list[_Endpoint]:
    """Every target of every route, once, with what reaches it directly (``simulated``: where
    the config's running simulated providers answer).

    A provider's own ``verify`` (in the config) wins over ``verify`` (``--ca``/``--insecure``).
    """
    from .._secrets import provider_secrets
    from ..config import resolve, route_config
    from ..protocols import adapter_for

    resolved = resolve(config, simulated=simulated)
    endpoints: list[_Endpoint] = []
    for target in resolved.targets():
        provider = resolved.providers[target.provider]
        # Its key and the values of its credential headers (api-key, x-api-key, ...).
        secrets = tuple(provider_secrets([provider]))
        if adapter_for(provider.spec.protocol).speaks_openai:
            client_args: dict[str, Any] = {
                "api_key": provider.api_key or "none",
                "base_url": str(provider.base_url),
                "default_headers": dict(provider.headers),
                "max_retries": 0,
                "verify": verify if provider.verify is None else provider.verify,
            }
            endpoints.append(_Endpoint(target.name, target.model, client_args, secrets))
            continue
        # Another wire protocol: a route with this one target and nothing else (no retry,
        # no breaker, no cache) speaks it.
        probe = config.model_copy(
            update={
                "models": {
                    "probe": route_config("probe", {"targets": [target.name], "policy": "failover"})
                },
                "cache": None,
                "default_provider": None,
                "routing": config.routing.model_copy(
                    update={"breaker_failures": 10**9, "explore": 0.0}
                ),
            }
        )
        client_args = {"api_key": "unused", "config": probe, "max_retries": 0, "verify": verify}
        endpoints.append(_Endpoint(target.name, "probe", client_args, secrets))
    return endpoints
