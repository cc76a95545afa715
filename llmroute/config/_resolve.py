"""Resolution: a config read from a file, a dict or ``LLMROUTE_CONFIG``, then merged with the
catalog and the environment's API keys into providers and routes ready to use."""

from __future__ import annotations

import datetime
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pydantic

from .._catalog import ProviderSpec, format_validation_error, load_catalog
from ._messages import DEFAULT_SOURCE, ConfigError, describe, dotted, read_toml, show
from ._providers import SIMULATOR, ProviderConfig
from ._retired import drop_retired
from ._sdk import (
    CacheSettings,
    Config,
    ConnectionSettings,
    RedisSettings,
    RouteConfig,
    RoutingSettings,
    TieredConfig,
    TieredSettings,
    fields_at,
)
from ._values import Target

__all__ = [
    "ENV_VAR",
    "Resolved",
    "ResolvedProvider",
    "SimulatorAddress",
    "load_config",
    "resolve",
    "resolve_provider",
    "route_config",
    "used_providers",
]

log = logging.getLogger("llmroute")

ENV_VAR = "LLMROUTE_CONFIG"


@dataclass(frozen=True, repr=False)
class ResolvedProvider:
    """A provider ready to use: catalog entry and overrides merged, API key read.

    ``spec`` is the merged description (``spec.name`` is the catalog ``kind``, or the provider's
    own name when it has none); ``base_url`` ends with a slash, so ``base_url.join("chat/
    completions")`` is the endpoint. The repr never shows the key.
    """

    name: str
    spec: ProviderSpec
    base_url: httpx.URL
    api_key: str | None
    headers: Mapping[str, str]
    kind: str | None
    """The catalog entry it is based on; ``None`` for a provider the catalog does not know."""
    verify: bool | str | None = None
    """The provider's own TLS trust (``True``, ``False`` or a CA path); ``None``: the client's."""

    @property
    def origin(self) -> tuple[str, int]:
        """``(host, port)`` of ``base_url``, as a connection pool keys it."""
        url = self.base_url
        return (url.host.lower(), url.port or (443 if url.scheme == "https" else 80))

    def __repr__(self) -> str:
        key = "<set>" if self.api_key is not None else "None"
        verify = "" if self.verify is None else f", verify={self.verify!r}"
        return (
            f"ResolvedProvider(name={self.name!r}, kind={self.kind!r}, "
            f"base_url={str(self.base_url)!r}, api_key={key}, headers={sorted(self.headers)!r}"
            f"{verify})"
        )


@dataclass(frozen=True)
class Resolved:
    """A config ready to route: the providers in use and each route's targets and settings."""

    providers: dict[str, ResolvedProvider]
    """The providers some route or ``default_provider`` uses, by name."""
    routes: dict[str, list[Target]]
    route_configs: dict[str, RouteConfig]
    routing: RoutingSettings
    default_provider: str | None
    source: str = field(default=DEFAULT_SOURCE, compare=False)
    cache: CacheSettings | None = None
    redis: RedisSettings = field(default_factory=RedisSettings)
    unknown_models: Literal["suggest", "default", "error"] = "suggest"
    """See :attr:`Config.unknown_models`; :func:`llmroute._model_names.check_model_name`."""
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    tiered: dict[str, TieredSettings] = field(default_factory=dict)
    """Tiered model names (``[models.<name>]`` tables with ``tiers``)."""

    def targets(self) -> list[Target]:
        """Every target of every route, once, in the order the routes name them."""
        unique = {t.name: t for targets in self.routes.values() for t in targets}
        return list(unique.values())

    def verify_by_origin(self) -> dict[tuple[str, int], bool | str]:
        """The TLS trust providers set for their own ``https://`` origins (``verify`` in their
        table), for :class:`llmroute.transport.Transport`'s ``verify_by_origin``."""
        return {
            p.origin: p.verify
            for p in self.providers.values()
            if p.verify is not None and p.base_url.scheme == "https"
        }


def load_config(
    source: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> Config | None:
    """A validated :class:`Config` from a Config, a dict, or the path of a TOML file.

    With ``source=None`` the file named by ``LLMROUTE_CONFIG`` is read; ``None`` is returned when
    that variable is unset or empty. Raises :class:`ConfigError` on any mistake.
    """
    if source is None:
        path = os.environ.get(ENV_VAR, "")
        if not path:
            return None
        return _load_file(path, missing=f"{ENV_VAR}={path}: no such file")
    if isinstance(source, Config):
        return source
    if isinstance(source, Mapping):
        return _validate(source, DEFAULT_SOURCE)
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        return _load_file(path, missing=f"{path}: no such file")
    raise TypeError(
        f"expected a Config, a dict or the path of a TOML file, got {type(source).__name__}"
    )


@dataclass(frozen=True)
class SimulatorAddress:
    """Where a running simulated provider answers, and the CA file its certificate is from."""

    base_url: str
    ca: str | None


def used_providers(config: Config) -> list[str]:
    """The providers some route's targets or ``default_provider`` name, in that order."""
    used = dict.fromkeys(
        target.provider for route in config.models.values() for target in route.target_list()
    )
    if config.default_provider is not None:
        used.setdefault(config.default_provider)
    return list(used)


def resolve(
    config: Config,
    environ: Mapping[str, str] = os.environ,
    simulated: Mapping[str, SimulatorAddress] | None = None,
) -> Resolved:
    """Merge each used provider with its catalog entry and read its API key from ``environ``.

    Only providers named by a route's targets or by ``default_provider`` are resolved. A
    simulated provider (``kind = "simulator"``) must be running: ``simulated`` gives its
    address (``llmroute._simulated.SimulatedProviders`` starts them). Raises
    :class:`ConfigError` when a provider has no API key (and needs one), speaks a wire protocol
    llmroute does not support, or is a simulator that is not running.
    """
    catalog = load_catalog()
    routes = {route: settings.target_list() for route, settings in config.models.items()}
    providers = {
        name: _resolve_provider(name, config, catalog, environ, simulated or {})
        for name in used_providers(config)
    }
    _check_shared_origins(providers, config.source)
    _warn_retired(providers, routes, config.source)
    tiered = {name: _resolve_tiered(name, t, config.source) for name, t in config.tiered.items()}
    return Resolved(
        providers=providers,
        routes=routes,
        route_configs=dict(config.models),
        routing=config.routing,
        default_provider=config.default_provider,
        source=config.source,
        cache=config.cache,
        redis=config.redis,
        unknown_models=config.unknown_models,
        connections=config.connections,
        tiered=tiered,
    )


def _warn_retired(
    providers: Mapping[str, ResolvedProvider], routes: Mapping[str, list[Target]], source: str
) -> None:
    """Log once per config and target a target whose model the catalog lists as retired: a
    warning, not an error (the vendor may still serve it, and the catalog may be behind)."""
    today = datetime.date.today()
    for route, targets in routes.items():
        for target in targets:
            provider = providers[target.provider]
            retired = provider.spec.retired_models.get(target.model)
            if provider.kind is None or retired is None:
                continue
            if (source, target.name) in _RETIRED_WARNED:
                continue
            _RETIRED_WARNED.add((source, target.name))
            vendor = provider.spec.display_name or provider.spec.name
            log.warning(
                "%s: models.%s: target %s: %s (the catalog's retired_models); llmroute still "
                "sends it, in case %s answers it",
                source,
                dotted([route]),
                target.name,
                retired.notice(vendor, target.model, today),
                vendor,
            )


_RETIRED_WARNED: set[tuple[str, str]] = set()
"""The (config source, target) pairs already warned of (:func:`_warn_retired`)."""


def _resolve_tiered(name: str, tiered: TieredConfig, source: str) -> TieredSettings:
    """A tiered name's files, relative to the config file (or the working directory), checked
    to exist, and the ``tiers`` extra checked to be installed (without importing it)."""
    import importlib.util

    key = f"models.{dotted([name])}"
    for module in ("numpy", "wordllama"):
        if importlib.util.find_spec(module) is None:
            from .._install import install_hint

            raise ConfigError(
                f"{source}: {key}: a tiered model needs the request classifier, whose "
                f"dependency {module} is not installed: {install_hint('tiers')}"
            )
    base = Path(source).parent if source != DEFAULT_SOURCE else Path.cwd()
    paths: dict[str, Path | None] = {}
    for field_name in ("examples", "classifier"):
        value = getattr(tiered, field_name)
        path = None
        if value is not None:
            shown = show(value)
            try:
                path = (base / Path(value).expanduser()).resolve()
                found = path.is_file()
            except (OSError, ValueError, RuntimeError) as exc:  # NUL, too long, no home
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise ConfigError(
                    f"{source}: {key}.{field_name}: {shown}: not a usable path ({why})"
                ) from None
            if not found:
                raise ConfigError(f"{source}: {key}.{field_name}: {shown}: no such file")
        paths[field_name] = path
    return TieredSettings(name, tiered, paths["examples"], paths["classifier"])


_OVERRIDES = frozenset(ProviderSpec.model_fields) - {"name"}


def resolve_provider(
    name: str, table: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> ResolvedProvider:
    """One provider from a ``[providers.<name>]`` table given in code, ready to use."""
    config = _validate({"providers": {name: dict(table)}}, DEFAULT_SOURCE)
    return _resolve_provider(name, config, load_catalog(), environ, {})


def route_config(name: str, table: Mapping[str, Any]) -> RouteConfig:
    """A ``[models.<name>]`` table given in code, validated (errors name ``models.<name>``)."""
    try:
        return RouteConfig.model_validate(dict(table))
    except pydantic.ValidationError as exc:
        prefix = f"models.{dotted([name])}"
        raise ConfigError(
            format_validation_error(exc, source=DEFAULT_SOURCE, prefix=prefix)
        ) from None


def _simulator_spec(name: str, settings: ProviderConfig, address: SimulatorAddress) -> ProviderSpec:
    """What a simulated provider is, as a catalog entry would say: llmroute's simulator serves
    both wire protocols, continues an assistant prefix, streams usage and the Responses API."""
    from ..testing import profile_of

    return ProviderSpec.model_validate(
        {
            "name": SIMULATOR,
            "display_name": f"simulated provider {name}",
            "base_url": address.base_url,
            "models": profile_of(settings.profile).models,
            "self_hosted": True,
            "continuation": {},
            "stream_usage_continuous": True,
            "responses": True,
            "responses_stored": True,
            "docs": "docs/simulator.md",
        }
    )


def _resolve_provider(
    name: str,
    config: Config,
    catalog: Mapping[str, ProviderSpec],
    environ: Mapping[str, str],
    simulated: Mapping[str, SimulatorAddress],
) -> ResolvedProvider:
    settings = config.providers.get(name)
    key = f"providers.{dotted([name])}"
    kind = settings.kind if settings is not None and settings.kind is not None else name
    base = catalog.get(kind)
    address = None
    if settings is not None and kind == SIMULATOR:
        address = simulated.get(name)
        if address is None:
            raise ConfigError(
                f"{config.source}: {key}: a simulated provider runs while a client of the "
                "config does (AsyncOpenAI(config=...), llmroute chat, serve, bench): this one "
                "is not running"
            )
        base = _simulator_spec(name, settings, address)
    data: dict[str, Any] = base.model_dump() if base is not None else {}
    data["name"] = kind if base is not None else name
    if settings is not None:
        given = settings.model_fields_set
        if "context_window" in given:  # one window for every model: the catalog's give way
            data["context_windows"] = {}
        for field_name in given & _OVERRIDES:
            value = getattr(settings, field_name)
            if field_name in ("headers", "context_windows", "prices"):
                value = {**data.get(field_name, {}), **value}
            data[field_name] = value
        if "api_key_env" in given and "api_key_env_fallbacks" not in given:
            data["api_key_env_fallbacks"] = ()  # the catalog's old names go with its variable
    try:
        spec = ProviderSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source=config.source, prefix=key)) from None

    api_key = "simulated" if address is not None else None  # the simulator takes any key
    if settings is not None and settings.api_key is not None:
        api_key = settings.api_key.get_secret_value() or None
    if api_key is None and spec.api_key_env is not None:
        api_key = next(
            (k for v in (spec.api_key_env, *spec.api_key_env_fallbacks) if (k := environ.get(v))),
            None,
        )
        if api_key is None and not spec.self_hosted:
            raise ConfigError(
                f"{config.source}: {key}: no API key: set {_env_name(spec.api_key_env)} or api_key"
            )
    return ResolvedProvider(
        name=name,
        spec=spec,
        base_url=_with_slash(httpx.URL(spec.base_url)),
        api_key=api_key,
        headers=dict(spec.headers),
        kind=spec.name if base is not None else None,
        verify=address.ca if address is not None else settings.verify if settings else None,
    )


def _check_shared_origins(providers: Mapping[str, ResolvedProvider], source: str) -> None:
    """Providers on one origin share its connections, so they must trust it alike."""
    seen: dict[tuple[str, int], ResolvedProvider] = {}
    for provider in providers.values():
        if provider.verify is None or provider.base_url.scheme != "https":
            continue
        other = seen.setdefault(provider.origin, provider)
        if other.verify != provider.verify:
            host, port = provider.origin
            raise ConfigError(
                f"{source}: providers.{dotted([provider.name])}.verify: {provider.verify!r} "
                f"differs from providers.{dotted([other.name])}.verify ({other.verify!r}), and "
                f"both reach {host}:{port} over the same connections: give them the same verify"
            )


def _with_slash(url: httpx.URL) -> httpx.URL:
    path = url.path if url.path.endswith("/") else url.path + "/"
    return url.copy_with(path=path)


def _load_file(path: str, *, missing: str) -> Config:
    return _validate(read_toml(path, missing=missing), path)


def _validate(data: Mapping[str, Any], source: str) -> Config:
    load_catalog()
    try:
        config = Config.model_validate(drop_retired(data, source))
    except pydantic.ValidationError as exc:
        raise ConfigError(describe(exc, source, fields_at)) from None
    config._source = source
    return config


def _env_name(name: str) -> str:
    """An environment variable's name for a message, unless it looks like a pasted secret."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) and not name.startswith("sk-"):
        return name
    return "the variable named by api_key_env (which does not look like a variable name)"
