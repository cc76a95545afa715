"""Where ``llmroute demo``'s requests go: the three simulated providers (or, with ``--real``, the
vendors whose key is in the environment), the hedge route over them and each target alone.
``chat --simulator``, ``serve --simulator``, ``bench --simulator`` and ``top`` use them too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..testing import Profile


ROUTE = "chat"
SIM_MODEL = "sim-small"
DEMO_PRICES: dict[str, dict[str, float]] = {
    # Made up for the simulated providers (USD per million tokens), so the demo shows costs.
    "fast-but-spiky": {"input": 0.4, "cached_input": 0.04, "output": 1.6},
    "steady-slow": {"input": 0.1, "cached_input": 0.01, "output": 0.4},
    "flaky": {"input": 0.2, "cached_input": 0.02, "output": 0.8},
}


REAL_MODELS: dict[str, str] = {
    "openai": "gpt-6-luna",
    "deepseek": "deepseek-v4-flash",
    "groq": "openai/gpt-oss-20b",
    "mistral": "mistral-small-latest",
    "together": "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    "fireworks": "accounts/fireworks/models/gpt-oss-20b",
    "openrouter": "openai/gpt-6-luna",
    "xai": "grok-4.20-non-reasoning",
    "gemini": "gemini-3.5-flash",
    "anthropic": "claude-haiku-4-5",
    "moonshot": "moonshot-v1-8k",
    "zhipu": "glm-4.7-flash",
    "dashscope": "qwen-flash",
    "siliconflow": "Qwen/Qwen3.5-9B",
    "siliconflow-global": "Qwen/Qwen3.5-9B",
}
"""The model ``--real`` asks each catalog vendor for: a small, cheap one from the vendor's
``models`` in the catalog (``--targets`` sets others). deepseek-v4-flash and gpt-6-luna think by
default: their first token may come after some reasoning."""


def _demo_profiles() -> dict[str, Profile]:
    """The three simulated providers: each wins on some measure and loses on another (the
    simulator's presets of the same names, which a config's ``kind = "simulator"`` names)."""
    from ..testing import PRESETS

    return {name: PRESETS[name] for name in ("fast-but-spiky", "steady-slow", "flaky")}


@dataclass
class Setup:
    """Where the demo's requests go: the routed client's config, and each target alone."""

    config: dict[str, Any]
    targets: list[str]
    """``provider:model`` of each target, in the route's order."""
    alone: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per target: ``client``, the ``AsyncOpenAI`` arguments that reach it alone (a plain client,
    or a route of that one target for a protocol other than OpenAI's), and ``model``."""
    verify: Any = True
    label: str = ""


def _route_table(targets: Sequence[str], real: bool) -> dict[str, Any]:
    return {
        "targets": list(targets),
        "policy": "hedge",
        # Hedge a late first attempt soon: a stall is seen in a few hundred ms, not at its p95.
        "hedge_after": "1.5s" if real else "200ms",
        "rank_by": "p50",
        "hedge_budget": 0.5,
        "max_hedges": 2,
        "first_token_timeout": "20s" if real else "5s",
    }


def simulated_setup(sims: dict[str, Any]) -> Setup:
    providers = {
        name: {
            "base_url": sim.base_url,
            "api_key": "sk-demo-local",
            **({"prices": {"*": DEMO_PRICES[name]}} if name in DEMO_PRICES else {}),
        }
        for name, sim in sims.items()
    }
    targets = [f"{name}:{SIM_MODEL}" for name in sims]
    config = {
        "providers": providers,
        "models": {ROUTE: _route_table(targets, real=False)},
        "routing": {"ttft_prior": "300ms"},
        "cache": {"backend": "memory", "min_hits": 2},
    }
    alone = {
        f"{name}:{SIM_MODEL}": {
            "client": {"base_url": sim.base_url, "api_key": "sk-demo-local"},
            "model": SIM_MODEL,
        }
        for name, sim in sims.items()
    }
    verify = next(iter(sims.values())).ssl_context()
    return Setup(
        config, targets, alone, verify, "three simulated providers on 127.0.0.1 (TLS + HTTP/2)"
    )


def real_targets(environ: dict[str, str] | os._Environ[str]) -> tuple[list[str], list[str]]:
    """The ``provider:model`` targets whose key variable is set, and every variable looked for."""
    from .._catalog import load_catalog

    catalog = load_catalog()
    looked: list[str] = []
    targets: list[str] = []
    for name, model in REAL_MODELS.items():
        spec = catalog.get(name)
        if spec is None or spec.api_key_env is None:
            continue
        looked.append(spec.api_key_env)
        if any(environ.get(v) for v in (spec.api_key_env, *spec.api_key_env_fallbacks)):
            targets.append(f"{name}:{model}")
    return targets, looked


def real_setup(targets: list[str]) -> Setup:
    from ..config import Target, resolve_provider
    from ..protocols import adapter_for

    providers: dict[str, dict[str, Any]] = {}
    alone: dict[str, dict[str, Any]] = {}
    for text in targets:
        target = Target.parse(text)
        providers[target.provider] = {}
        resolved = resolve_provider(target.provider, {})
        if adapter_for(resolved.spec.protocol).speaks_openai:
            alone[target.name] = {
                "client": {"base_url": str(resolved.base_url), "api_key": resolved.api_key},
                "model": target.model,
            }
        else:  # another wire protocol: a route with this one target speaks it
            only = {"targets": [target.name], "policy": "failover"}
            alone[target.name] = {
                "client": {
                    "api_key": "unused",
                    "config": {"providers": {target.provider: {}}, "models": {"alone": only}},
                },
                "model": "alone",
            }
    config = {
        "providers": providers,
        "models": {ROUTE: _route_table(targets, real=True)},
        "cache": {"backend": "memory", "min_hits": 2},
    }
    return Setup(config, targets, alone, True, "vendors with a key in the environment")


@contextlib.contextmanager
def demo_simulators() -> Iterator[dict[str, Any]]:
    """The demo's three simulated providers (``name: Simulator``), running while inside;
    :func:`simulated_setup` routes over them (``llmroute demo``, ``chat --simulator``,
    ``serve --simulator``)."""
    from ..testing import Simulator

    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(Simulator(profile=profile, tls=True))
            for name, profile in _demo_profiles().items()
        }
