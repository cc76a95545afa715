"""The routing config: which vendors serve which model names, and how requests pick among them.

A config is a TOML file (``llmroute.toml``, or the file named by ``LLMROUTE_CONFIG``), a dict of
the same shape, or a :class:`Config` built in code::

    default_provider = "openai"

    [providers.gpu1]
    kind = "sglang"
    base_url = "http://127.0.0.1:30000/v1"

    [models.chat]
    targets = ["deepseek:deepseek-v4-flash", "openai:gpt-6-luna", "gpu1:qwen2.5-7b-instruct"]
    policy = "hedge"

A provider is a catalog vendor (``providers/*.toml``) used as is, a catalog entry with some fields
overridden, or a server the catalog does not know. :func:`load_config` validates the shape and
every reference; :func:`resolve` then merges the catalog, reads API keys from the environment and
gives the routes as :class:`Target` lists. Every mistake raises :class:`ConfigError` naming the
file, the dotted key and what was expected; API keys never appear in errors or reprs.

The modules: ``_sdk`` (the SDK's tables and :class:`Config`), ``_providers`` (provider tables),
``_gateway`` (``[gateway]``, its keys, tenants and teams, ``keys_file``), ``_resolve`` (reading a
config and resolving it), ``_values`` (durations, sizes, targets), ``_messages`` (the error
sentences) and ``_retired`` (keys that no longer do anything: a warning, not an error).
"""

from __future__ import annotations

from ._gateway import (
    MAX_COUNT,
    GatewaySettings,
    KeyEntry,
    KeySettings,
    ManagedKeyEntry,
    ManagedTeamEntry,
    ModelLimits,
    PreviousDigest,
    RouteObjective,
    TeamSettings,
    key_settings_problem,
    load_keys_file,
    merge_key_settings,
    read_keys_file,
    team_settings_problem,
    timestamp_input,
)
from ._messages import ConfigError, describe
from ._providers import SIMULATOR, ProviderConfig, SimulatorPhase
from ._resolve import (
    ENV_VAR,
    Resolved,
    ResolvedProvider,
    SimulatorAddress,
    load_config,
    resolve,
    resolve_provider,
    route_config,
    used_providers,
)
from ._sdk import (
    CacheSettings,
    Config,
    ConnectionSettings,
    RedisSettings,
    RouteConfig,
    RoutingSettings,
    TierClass,
    TieredConfig,
    TieredSettings,
)
from ._values import CACHE_DIR_ENV, Target, default_cache_dir, parse_duration, parse_size

__all__ = [
    "CACHE_DIR_ENV",
    "ENV_VAR",
    "MAX_COUNT",
    "SIMULATOR",
    "CacheSettings",
    "Config",
    "ConfigError",
    "ConnectionSettings",
    "GatewaySettings",
    "KeyEntry",
    "KeySettings",
    "ManagedKeyEntry",
    "ManagedTeamEntry",
    "ModelLimits",
    "PreviousDigest",
    "ProviderConfig",
    "RedisSettings",
    "Resolved",
    "ResolvedProvider",
    "RouteConfig",
    "RouteObjective",
    "RoutingSettings",
    "SimulatorAddress",
    "SimulatorPhase",
    "Target",
    "TeamSettings",
    "TierClass",
    "TieredConfig",
    "TieredSettings",
    "default_cache_dir",
    "describe",
    "key_settings_problem",
    "load_config",
    "load_keys_file",
    "merge_key_settings",
    "parse_duration",
    "parse_size",
    "read_keys_file",
    "resolve",
    "resolve_provider",
    "route_config",
    "team_settings_problem",
    "timestamp_input",
    "used_providers",
]
