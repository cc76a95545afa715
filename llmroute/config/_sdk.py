"""The SDK's schema: routes, tiered model names, the ``[routing]``, ``[connections]``,
``[redis]`` and ``[cache]`` tables, and :class:`Config`, the whole file."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from .._catalog import ContextWindow, Continuation, load_catalog
from ._gateway import (
    GatewaySettings,
    key_settings_problem,
    merge_key_settings,
    team_settings_problem,
)
from ._messages import (
    DEFAULT_SOURCE,
    dotted,
    invalid,
    suggest,
    unknown_provider,
    unknown_route,
)
from ._providers import SIMULATOR, ProviderConfig, SimulatorPhase
from ._values import (
    ENV_VAR_NAME,
    Duration,
    Size,
    Target,
    default_cache_dir,
    empty_is_none,
    hedge_after_input,
    stall_input,
    stats_file_input,
    target_input,
)

__all__ = [
    "CacheSettings",
    "Config",
    "ConnectionSettings",
    "RedisSettings",
    "RouteConfig",
    "RoutingSettings",
    "TierClass",
    "TieredConfig",
    "TieredSettings",
    "fields_at",
]

Policy = Literal[
    "fastest",
    "hedge",
    "race",
    "failover",
    "weighted",
    "prefix",
    "least-loaded",
    "round-robin",
    "cheapest",
]
Statistic = Literal["p50", "p95", "p99", "mean"]


class RouteConfig(BaseModel):
    """One ``[models.<name>]`` table: the targets a model name routes to, and the policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: list[Annotated[str, BeforeValidator(target_input)]] = Field(min_length=1)
    """``"provider:model"`` strings, split on the first colon."""
    policy: Policy = "hedge"
    hedge_after: Annotated[
        Literal["p50", "p90", "p95", "p99"] | float, BeforeValidator(hedge_after_input)
    ] = "p95"
    """A percentile of the first target's live TTFT, or seconds."""
    hedge_budget: float = Field(default=0.1, ge=0, le=1)
    """The fraction of extra requests hedging may add."""
    hedge_budget_cost: float | None = Field(default=None, ge=0, le=1)
    """Instead of ``hedge_budget``: the fraction of extra spend hedging may add (0.1: about
    10% more money than the first attempts' expected cost); a hedge to a dearer target takes
    more of it, and a hedge to a target without a known price is refused."""
    max_hedges: int = Field(default=1, ge=0)
    """Extra attempts hedging may start per request."""
    race: int = Field(default=2, ge=1)
    """Attempts started at once by policy ``"race"``; default 2, or fewer if fewer targets."""
    weights: list[Annotated[float, Field(gt=0)]] | None = None
    """Policy ``"weighted"``: one positive number per target."""
    rank_by: Statistic = "p95"
    prefix_block_chars: int = Field(default=64, ge=1, le=65536)
    """Policy ``"prefix"``: prompts are compared in blocks of this many characters (64 is
    about 16 tokens); a shared prefix counts up to its last whole common block."""
    prefix_max_blocks: int = Field(default=16384, ge=1, le=2**24)
    """Policy ``"prefix"``: blocks remembered per target, least recently used dropped first
    (16384 blocks of 64 characters: about 256k tokens of prefixes, some 2 MB per target)."""
    cache_threshold: float = Field(default=0.5, ge=0, le=1)
    """Policy ``"prefix"``: a request follows the target that holds more than this share of
    its prompt beyond the prefix most conversations share (a system prompt every user gets);
    otherwise it goes to the least-loaded target. 1 turns affinity off."""
    balance_abs_threshold: int = Field(default=64, ge=0)
    """Policy ``"prefix"``: when the highest load exceeds the lowest by more than this many
    requests, and by a factor above ``balance_rel_threshold``, a request goes to the
    least-loaded target whatever the others hold (SGLang gateway's rule)."""
    balance_rel_threshold: float = Field(default=1.5, ge=1)
    """Policy ``"prefix"``: the factor of the rule above (both must be exceeded)."""
    first_token_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    """Seconds an attempt may wait for its first token before the route moves on."""
    connect_timeout: Annotated[Duration, Field(gt=0)] | None = None
    """Seconds to open a connection to one of the route's targets; default the client's
    (openai's ``timeout``: 5 s to connect)."""
    total_timeout: Annotated[Duration, Field(gt=0)] | None = None
    """Seconds a whole request of this route may take in the gateway (``llmroute serve``),
    from its arrival to its last chunk: then an answer not started is a 504 and a stream
    still going ends with an ``upstream_timeout`` error event (never ``[DONE]``). Default: no
    bound beyond the first-token, between-token and read timeouts. The SDK leaves a call's
    total to its caller (a cancel scope)."""
    continue_on_break: bool = True
    """Continue a stream that broke after content on another target."""
    max_continuations: int = Field(default=3, ge=0, le=10)
    """Continuations one answer may have at most (each re-sends the prompt and the answer so
    far, so each is paid for: a gateway's money budget reserves every one); 0 is the same as
    ``continue_on_break = false``."""
    stall_timeout: Annotated[Literal["auto", "off"] | float, BeforeValidator(stall_input)] = "auto"
    """Seconds a stream may send nothing after its first token before it counts as broken
    and is continued on another target. ``"auto"``: 4x the target's p99 longest pause between
    chunks, at least 2 s, at most ``first_token_timeout`` (10 s while fewer than 5 streams were
    measured); ``"off"``: only the read timeout."""
    retry_after_max: Annotated[Duration, Field(ge=0, le=120)] = 5.0
    """Policy ``"failover"``: a 429 whose Retry-After is at most this long is waited out and
    the same target retried (once), rather than failing over; 0 fails over at once."""
    server_error_retries: int = Field(default=1, ge=0, le=5)
    """Policy ``"failover"``: retries of the same target after a 5xx before failing over."""
    failover_on: list[Literal["invalid_request", "content_policy", "context_length"]] = Field(
        default_factory=list
    )
    """Request-caused 400s a route fails over on; by default each is returned to the caller
    unchanged (another vendor would refuse it too, or answer something else)."""
    ttft_target: Annotated[Duration, Field(gt=0)] | None = None
    """A latency goal for the first token (``"300ms"``): on a latency policy, targets whose
    predicted median TTFT is above it go behind those predicted to meet it, and the first
    attempt is hedged once the goal is at risk. A request may set its own
    (``extra_body={"llmroute": {"ttft_target_ms": 300}}`` or ``x-llmroute-ttft-target-ms``)."""
    min_tokens_per_s: float | None = Field(default=None, gt=0)
    """A minimum decode speed: targets whose live median tokens/s is below it go behind the
    others (``extra_body={"llmroute": {"min_tokens_per_s": 40}}`` per request)."""
    context_windows: dict[str, ContextWindow] = Field(default_factory=dict)
    """Context windows of this route's targets, by ``"provider:model"``
    (``{ "gpu1:qwen2.5-7b-instruct" = 32768 }``), over the provider's and the catalog's. A
    request estimated not to fit a target's window is not sent there; a context-length error
    fails over to a target with a larger one (docs/routing.md)."""

    @model_validator(mode="before")
    @classmethod
    def _default_race(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "race" not in data:
            targets = data.get("targets")
            if isinstance(targets, list | tuple) and targets:
                return {**data, "race": min(2, len(targets))}
        return data

    @model_validator(mode="after")
    def _check(self) -> RouteConfig:
        seen: set[str] = set()
        for index, target in enumerate(self.targets):
            if target in seen:
                raise invalid(f"{target!r} is listed twice", "targets", index)
            seen.add(target)
        count = len(self.targets)
        if self.race > count:
            raise invalid(
                f"expected at most {count} (the number of targets), got {self.race}", "race"
            )
        if self.weights is not None and len(self.weights) != count:
            raise invalid(
                f"expected {count} numbers (one per target), got {len(self.weights)}", "weights"
            )
        if self.hedge_budget_cost is not None and "hedge_budget" in self.model_fields_set:
            raise invalid(
                "set hedge_budget (extra requests) or hedge_budget_cost (extra spend), not both",
                "hedge_budget_cost",
            )
        if self.policy == "cheapest" and self.ttft_target is None:
            raise invalid(
                "required by policy = 'cheapest': the TTFT its cheapest target must meet, "
                'e.g. "800ms"',
                "ttft_target",
            )
        if self.policy == "weighted" and self.weights is None:
            raise invalid(
                "required by policy = 'weighted': one positive number per target",
                "weights",
            )
        for target in self.context_windows:
            if target not in seen:
                raise invalid(
                    f"{target!r} is not one of this route's targets{suggest(target, seen)}",
                    "context_windows",
                    target,
                )
        return self

    def target_list(self) -> list[Target]:
        """The targets as :class:`Target` objects, in order."""
        return [Target.parse(text) for text in self.targets]


class TierClass(BaseModel):
    """One ``[models.<tiered>.classes.<class>]`` table: example requests of a class (inline)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    examples: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    """Example user messages of the class (each one a request of one user turn)."""
    description: str | None = Field(default=None, min_length=1)
    """A short description of the class, used as one more example."""
    allow: list[str] | None = None
    """Other tiers (routes of this tiered name) the class may go to when its own tier's live
    p95 TTFT misses a request's ``ttft_target_ms`` and one of these meets it (docs/tiers.md)."""

    @property
    def has_examples(self) -> bool:
        return self.examples is not None or self.description is not None

    @model_validator(mode="after")
    def _check_blank(self) -> TierClass:
        for index, text in enumerate(self.examples or ()):
            if not text.strip():
                raise invalid("an example must not be blank", "examples", index)
        if self.description is not None and not self.description.strip():
            raise invalid("a description must not be blank", "description")
        return self


class TieredConfig(BaseModel):
    """A ``[models.<name>]`` table with ``tiers``: a model name whose requests a classifier
    sends to one of several routes (tiers) by their class (docs/tiers.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tiers: dict[str, str] = Field(min_length=2)
    """Class name -> the route (a ``[models]`` table) its requests go to."""
    default: str
    """The route of a request the classifier is unsure of or fails on."""
    examples: str | None = Field(default=None, min_length=1)
    """A JSONL file of labelled examples (relative to the config file)."""
    classifier: str | None = Field(default=None, min_length=1)
    """An artefact of ``llmroute tiers fit`` (relative to the config file)."""
    classes: dict[str, TierClass] = Field(default_factory=dict)
    """Inline examples (and descriptions) by class."""
    uncertain_below: float | None = Field(default=None, gt=0, le=1)
    """A decision less probable than this goes to ``default``; ``None``: the classifier's
    own band (0.6 unless the artefact says otherwise)."""
    shadow: bool = False
    """Classify and record, but send every request to ``default``."""
    uncertain: Literal["default", "hedge"] = "default"
    """Where an unsure decision goes: ``default``, or ``hedge``: the smaller of the two most
    probable tiers first, the larger too if the smaller has no first token by its live p95."""

    @model_validator(mode="after")
    def _check(self) -> TieredConfig:
        for label in self.tiers:
            if not label.strip():
                raise invalid("a class name must be a non-empty string", "tiers")
        for label in self.classes:
            if label not in self.tiers:
                raise invalid(
                    f"{label!r} is not a class of tiers{suggest(label, self.tiers)}",
                    "classes",
                    label,
                )
        if self.classifier is not None:
            if self.examples is not None or any(c.has_examples for c in self.classes.values()):
                raise invalid(
                    "give either a fitted classifier or examples (a file or classes), not both",
                    "classifier",
                )
            return self
        for label in self.tiers:
            given = self.classes.get(label)
            if given is not None and not given.has_examples and given.allow is None:
                raise invalid("an empty class: give examples or a description", "classes", label)
            if self.examples is None and (given is None or not given.has_examples):
                raise invalid(
                    f"class {label!r} has no examples: give classes.{dotted([label])}.examples, "
                    "an examples file or a classifier",
                    "tiers",
                    label,
                )
        return self


@dataclass(frozen=True)
class TieredSettings:
    """A tiered model name ready to use: its settings, file paths made absolute."""

    name: str
    config: TieredConfig
    examples: Path | None
    classifier: Path | None


class RoutingSettings(BaseModel):
    """The ``[routing]`` table: how live statistics are kept, for every route."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: Annotated[Duration, Field(gt=0)] = 300.0
    """Seconds of history in each target's sliding window."""
    window_samples: int = Field(default=1024, ge=1)
    """At most this many samples per window."""
    explore: float = Field(default=0.03, ge=0, le=0.2)
    """The share of requests sent to targets whose statistics are stale."""
    prompt_classes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [1024, 8192, 32768]
    )
    """Prompt-length class bounds in tokens, strictly increasing; statistics are per class."""
    ttft_prior: Annotated[Duration, Field(gt=0)] = 1.0
    """The assumed median TTFT, in seconds, of a target with no data."""
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive failures that open a target's circuit."""
    breaker_cooldown: Annotated[Duration, Field(gt=0)] = 5.0
    """Seconds an open circuit waits before its first trial (a one-token request sent in the
    background; no caller's request goes to the target until a trial closes the circuit)."""
    breaker_max_cooldown: Annotated[Duration, Field(gt=0)] = 5.0
    """Each failed trial doubles the wait before the next, up to this many seconds (or
    ``breaker_cooldown`` if that is longer), so a recovered target is found within about
    one of them. By default the same as ``breaker_cooldown``: a trial every 5 s."""
    stats_backend: Literal["memory", "redis"] = "memory"
    """``redis``: app instances share their TTFT samples through ``[redis]``."""
    stats_sync: Annotated[Duration, Field(gt=0)] = 1.0
    """Seconds between exchanges of samples with the other instances."""
    stats_file: Annotated[str | None, BeforeValidator(stats_file_input)] = None
    """A file the client writes its samples to when it closes and reads when it starts, so a
    fresh client routes on what the last one learnt (docs/routing.md, "Starting warm")."""
    stats_max_age: Annotated[Duration, Field(gt=0)] = 3600.0
    """Samples in ``stats_file`` older than this are not read."""

    @field_validator("prompt_classes")
    @classmethod
    def _check_classes(cls, value: list[int]) -> list[int]:
        for index in range(1, len(value)):
            if value[index] <= value[index - 1]:
                raise invalid(
                    f"expected bounds in strictly increasing order, got {value[index]} "
                    f"after {value[index - 1]}",
                    index,
                )
        return value


class ConnectionSettings(BaseModel):
    """The ``[connections]`` table: the HTTP/2 connections a client keeps to each origin."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_per_origin: int = Field(default=8, ge=1, le=1024)
    """HTTP/2 connections to one origin (scheme, host, port) at most."""
    max_streams: int = Field(default=256, ge=1, le=65536)
    """Streams in flight on one connection at most (the server's own limit applies too). Past
    ``max_per_origin`` x ``max_streams`` concurrent requests to one origin, requests wait for a
    free stream."""


def _redis_url_input(value: Any) -> Any:
    if isinstance(value, str) and not value.startswith(("redis://", "rediss://", "unix://")):
        raise invalid("expected a redis://, rediss:// or unix:// URL")
    return value


class RedisSettings(BaseModel):
    """The ``[redis]`` table: the server a fleet of app instances shares (cache and stats)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[SecretStr, BeforeValidator(_redis_url_input)] = SecretStr(
        "redis://127.0.0.1:6379/0"
    )
    """A ``redis://`` URL; it may carry a password, so it is kept secret (never shown)."""
    url_env: Annotated[str | None, BeforeValidator(empty_is_none)] = None
    """The environment variable holding ``url`` instead (read when the config is loaded), so
    a URL with a password stays out of the file (a Kubernetes Secret, docs/deploy.md)."""
    prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] = "llmroute"
    """The prefix of every key llmroute writes."""
    timeout: Annotated[Duration, Field(gt=0)] = 0.25
    """Seconds a Redis call may take before the cache treats the server as unreachable."""

    @model_validator(mode="before")
    @classmethod
    def _url_from_environment(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or data.get("url_env") in (None, ""):
            return data
        if "url" in data:
            raise invalid("give url or url_env, not both", "url_env")
        name = data["url_env"]
        if not isinstance(name, str) or not ENV_VAR_NAME.fullmatch(name):  # never echoed
            raise invalid("expected the name of an environment variable (A-Z, 0-9, _)", "url_env")
        value = os.environ.get(name, "")
        if not value:
            raise invalid(f"{name} is not set (it should hold the Redis URL)", "url_env")
        if not value.startswith(("redis://", "rediss://", "unix://")):  # never echoed
            raise invalid(f"{name}: expected a redis://, rediss:// or unix:// URL", "url_env")
        return {**data, "url": value}


class CacheSettings(BaseModel):
    """The ``[cache]`` table: popular answers kept and replayed (see docs/cache.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["memory", "disk", "redis", "off"] = "disk"
    mode: Literal["auto", "on", "read-only", "off"] = "auto"
    """``auto``: only deterministic requests (temperature 0, or a seed) are cached; ``on``:
    every request; ``read-only``: stored answers are used, none are stored; ``off``."""
    min_hits: int = Field(default=2, ge=1)
    """Asks within ``window`` before an answer is stored: 2 stores it on its second ask."""
    window: Annotated[Duration, Field(gt=0)] = 3600.0
    """The window popularity is counted over."""
    ttl: Annotated[Duration, Field(gt=0)] = 3600.0
    """How long a stored answer is used."""
    max_bytes: Annotated[Size, Field(gt=0)] = 256 * 2**20
    """The store's size limit (memory and disk; Redis uses its own maxmemory)."""
    max_entry_bytes: Annotated[Size, Field(gt=0)] = 2**20
    """Answers larger than this are not stored."""
    path: str = Field(default_factory=default_cache_dir)
    """The disk store's directory (created with mode 0700)."""
    namespace: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] | None = None
    """Whose answers these are; by default derived from a hash of the API keys in use."""
    replay: Literal["immediate", "paced"] = "immediate"
    """``paced`` replays a streamed answer at the rhythm it was recorded with."""
    single_flight: bool = True
    """Identical requests in flight at once share one upstream call."""


class Config(BaseModel):
    """A whole config: providers, routes and routing settings.

    Building one validates the shape and every reference against the catalog (a target's or
    ``default_provider``'s provider must be a ``[providers]`` table or a catalog name). Two
    configs are equal when their settings are, wherever they were read from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_provider: str | None = None
    """Where model names that are not routes go; ``None``: the client's own base_url and key."""
    unknown_models: Literal["suggest", "default", "error"] = "suggest"
    """A model name that is not a route: ``suggest`` raises for a near miss of a route ("did
    you mean 'chat'?") and sends other names to the default provider; ``default`` sends every
    such name there, as openai would; ``error`` raises for every such name, naming the routes."""
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    models: dict[str, RouteConfig] = Field(default_factory=dict)
    """Routes, by the model name the application asks for."""
    tiered: dict[str, TieredConfig] = Field(default_factory=dict)
    """Tiered model names: the ``[models.<name>]`` tables with ``tiers`` (docs/tiers.md)."""
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    cache: CacheSettings | None = None
    """The response cache; ``None`` (no ``[cache]`` table): no cache."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)
    gateway: GatewaySettings | None = None
    """``llmroute serve``'s settings; ``None`` (no ``[gateway]`` table): the defaults."""

    _source: str = PrivateAttr(default=DEFAULT_SOURCE)

    @property
    def source(self) -> str:
        """Where the config was read from: the file's path, or ``"config"``."""
        return self._source

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _split_tiered(cls, data: Any) -> Any:
        """``[models.<name>]`` tables with ``tiers`` are tiered names, not routes."""
        if not isinstance(data, Mapping) or not isinstance(data.get("models"), Mapping):
            return data
        models = data["models"]
        tiered = {k: v for k, v in models.items() if isinstance(v, Mapping) and "tiers" in v}
        if not tiered:
            return data
        given = data.get("tiered")
        if isinstance(given, Mapping):
            tiered = {**given, **tiered}
        routes = {k: v for k, v in models.items() if k not in tiered}
        return {**data, "models": routes, "tiered": tiered}

    @model_validator(mode="after")
    def _check_tiered(self) -> Config:
        for name, tiered in self.tiered.items():
            if name in self.models:
                raise invalid("is both a route and a tiered model name", "models", name)
            for label, route in tiered.tiers.items():
                if route not in self.models:
                    raise invalid(self._not_a_tier(route), "models", name, "tiers", label)
                if label in self.models and label != route:  # it would shadow forcing that route
                    raise invalid(
                        f"class {label!r} is named like a route but goes to {route!r}: "
                        "name the class otherwise (llmroute.tier names a class or a route)",
                        "models",
                        name,
                        "tiers",
                        label,
                    )
            if tiered.default not in self.models:
                raise invalid(self._not_a_tier(tiered.default), "models", name, "default")
            routes = {*tiered.tiers.values(), tiered.default}
            for label, given in tiered.classes.items():
                for index, route in enumerate(given.allow or ()):
                    if route not in routes:
                        raise invalid(
                            f"{route!r} is not a tier of models.{dotted([name])} (one of: "
                            f"{', '.join(repr(r) for r in sorted(routes))})"
                            f"{suggest(route, routes)}",
                            "models",
                            name,
                            "classes",
                            label,
                            "allow",
                            index,
                        )
        return self

    @model_validator(mode="after")
    def _check_gateway(self) -> Config:
        """Each key's merged settings (``[gateway.limits]`` and its own), and the routes of
        ``[gateway.slos]``, against this config's model names."""
        gateway = self.gateway
        if gateway is None:
            return self
        names = [*self.models, *self.tiered]
        for route in gateway.slos:
            if route not in names:
                raise invalid(unknown_route(route, names), "gateway", "slos", route)
        for team, settings in gateway.teams.items():
            problem = team_settings_problem(settings, names)
            if problem is not None:
                raise invalid(f"team {team!r}: {problem[1]}", "gateway", "teams", team, problem[0])
        for key in gateway.keys:
            merged = merge_key_settings(gateway.limits, gateway.tenants.get(key))
            problem = key_settings_problem(merged, names)
            if problem is not None:
                table = "tenants" if key in gateway.tenants else "limits"
                where = ("gateway", "tenants", key) if table == "tenants" else ("gateway", "limits")
                raise invalid(f"key {key!r}: {problem[1]}", *where, problem[0])
        return self

    def _not_a_tier(self, name: str) -> str:
        if name in self.tiered:
            return f"{name!r} is a tiered model name; a tier must be a route"
        return unknown_route(name, self.models)

    @model_validator(mode="after")
    def _check_references(self) -> Config:
        catalog = load_catalog()
        for name, provider in self.providers.items():
            if not name or ":" in name:
                raise invalid(
                    "a provider name must be non-empty and contain no ':'", "providers", name
                )
            if provider.kind is not None and provider.kind not in (*catalog, SIMULATOR):
                raise invalid(
                    f"unknown kind {provider.kind!r}: not in the catalog"
                    + (
                        suggest(provider.kind, [*catalog, SIMULATOR])
                        or f" (one of: {', '.join([*catalog, SIMULATOR])})"
                    ),
                    "providers",
                    name,
                    "kind",
                )
            if provider.kind is None and name not in catalog and provider.base_url is None:
                raise invalid(
                    "base_url is required for a provider that is not in the catalog "
                    "(or set kind = ...)",
                    "providers",
                    name,
                )
        known = [*self.providers, *(name for name in catalog if name not in self.providers)]
        if self.default_provider is not None and self.default_provider not in known:
            raise invalid(unknown_provider(self.default_provider, known), "default_provider")
        for route, settings in self.models.items():
            for index, target in enumerate(settings.target_list()):
                if target.provider not in known:
                    raise invalid(
                        unknown_provider(target.provider, known), "models", route, "targets", index
                    )
        return self


def fields_at(loc: Sequence[str | int]) -> list[str]:
    model: type[BaseModel]
    match tuple(loc):
        case ():
            model = Config
        case ("providers", str()):
            model = ProviderConfig
        case ("providers", str(), "continuation"):
            model = Continuation
        case ("providers", str(), "phases", int()):
            model = SimulatorPhase
        case ("models", str()):
            model = RouteConfig
        case ("tiered", str()):
            model = TieredConfig
        case ("tiered", str(), "classes", str()):
            model = TierClass
        case ("routing",):
            model = RoutingSettings
        case ("gateway",):
            model = GatewaySettings
        case _:
            return []
    return list(model.model_fields)
