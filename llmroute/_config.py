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
"""

from __future__ import annotations

import datetime
import difflib
import json
import logging
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import pydantic
from openai import OpenAIError
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
from pydantic_core import PydanticCustomError

from ._catalog import (
    ContextWindow,
    Continuation,
    ProviderSpec,
    format_validation_error,
    load_catalog,
)
from ._prices import ModelPrice, UsageFields

__all__ = [
    "CacheSettings",
    "Config",
    "ConfigError",
    "ConnectionSettings",
    "GatewaySettings",
    "KeySettings",
    "ManagedKeyEntry",
    "ManagedTeamEntry",
    "ModelLimits",
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
    "load_config",
    "load_keys_file",
    "parse_duration",
    "read_keys_file",
    "resolve",
    "resolve_provider",
    "route_config",
    "used_providers",
]

log = logging.getLogger("llmroute")

ENV_VAR = "LLMROUTE_CONFIG"
_DEFAULT_SOURCE = "config"
_ERROR_TYPE = "llmroute_config"
_PERCENTILES = ("p50", "p90", "p95", "p99")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_HINT = "expected a duration such as '5m', '300s' or 300"
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(b|kb|kib|mb|mib|gb|gib)?", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
SIMULATOR = "simulator"
"""The built-in ``kind`` of a simulated provider, started on 127.0.0.1 with the client that uses
the config and stopped with it (``llmroute._simulated``; docs/simulator.md)."""
_SIMULATOR_OWN = ("base_url", "api_key", "api_key_env", "api_key_env_fallbacks", "verify")
"""What a simulated provider brings itself: its address, its (any) key and its CA."""
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


class ConfigError(OpenAIError, ValueError):
    """A config that cannot be used: the message names the source, the dotted key and the fault."""


def parse_duration(value: float | str) -> float:
    """Seconds from a number of seconds or a string such as ``"250ms"``, ``"1.5s"``, ``"5m"``,
    ``"1h"`` or ``"2 s"``; raises :class:`ValueError` for anything else, negative or not finite.
    """
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is not None:
            seconds = float(match[1]) * _UNITS[(match[2] or "s").lower()]
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{_DURATION_HINT}, got {_show(value)}")
    return seconds


def parse_size(value: int | str) -> int:
    """Bytes from a number or a string such as ``"64MiB"``, ``"500kb"`` or ``"1 GB"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if match is not None:
            size = float(match[1]) * _SIZE_UNITS[(match[2] or "b").lower()]
            if math.isfinite(size):
                return int(size)
    raise ValueError(f"expected a size such as '256MiB', '500kB' or 1048576, got {_show(value)}")


@dataclass(frozen=True, slots=True)
class Target:
    """One place a route may send a request: a provider and the model name it knows."""

    provider: str
    model: str

    @property
    def name(self) -> str:
        """``"provider:model"``, as written in a route's ``targets``."""
        return f"{self.provider}:{self.model}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """Split ``"provider:model"`` on the first colon (model names may contain colons)."""
        provider, sep, model = text.partition(":")
        if not sep or not provider or not model:
            raise ValueError(f"{text!r} is not 'provider:model'")
        if provider != provider.strip() or model != model.strip():
            raise ValueError(f"{text!r} is not 'provider:model' (no spaces around ':')")
        return cls(provider, model)

    def __str__(self) -> str:
        return self.name


def _invalid(message: str, *key: str | int) -> PydanticCustomError:
    return PydanticCustomError(_ERROR_TYPE, "{message}", {"message": message, "key": _key(key)})


def _duration_input(value: Any) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _invalid(str(exc)) from None


def _stall_input(value: Any) -> str | float:
    if isinstance(value, str) and value.strip().lower() in ("auto", "off"):
        return value.strip().lower()
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise _invalid(
            f"expected 'auto', 'off' or a duration such as '5s', got {_show(value)}"
        ) from None
    if not seconds > 0:
        raise _invalid(f"expected a positive duration, got {_show(value)}")
    return seconds


def _size_input(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise _invalid(str(exc)) from None


def _hedge_after_input(value: Any) -> str | float:
    if isinstance(value, str) and value.strip().lower() in _PERCENTILES:
        return value.strip().lower()
    try:
        return parse_duration(value)
    except ValueError:
        hint = _suggest(value, _PERCENTILES) if isinstance(value, str) else ""
        raise _invalid(
            f"expected 'p50', 'p90', 'p95', 'p99' or a duration such as '400ms', "
            f"got {_show(value)}{hint}"
        ) from None


def _target_input(value: Any) -> str:
    if isinstance(value, Target):
        return value.name
    if not isinstance(value, str):
        raise _invalid(f"expected a 'provider:model' string, got {_show(value)}")
    try:
        Target.parse(value)
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    return value


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


def _verify_input(value: Any) -> bool | str | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        path = os.path.expanduser(value.strip())
        if not os.path.exists(path):
            raise _invalid(f"{value!r}: no such CA file or directory")
        return path
    raise _invalid(f"expected true, false or the path of a CA file (PEM), got {_show(value)}")


Duration = Annotated[float, BeforeValidator(_duration_input)]


def _profile_input(value: Any) -> Any:
    """A simulator's profile: a preset's name, or a table whose durations (``"70ms"``) become
    seconds; its fields are checked with the provider (``ProviderConfig._check_simulator``)."""
    if not isinstance(value, Mapping):
        return value
    from .testing._profile import DURATION_FIELDS

    table = dict(value)
    for name in DURATION_FIELDS:
        given = table.get(name)
        try:
            if isinstance(given, str):
                table[name] = parse_duration(given)
            elif name == "stall_range" and isinstance(given, list):
                table[name] = [parse_duration(v) if isinstance(v, str) else v for v in given]
        except ValueError as exc:
            raise _invalid(str(exc), name) from None
    return table


SimulatorProfile = Annotated[str | dict[str, Any] | None, BeforeValidator(_profile_input)]


class SimulatorPhase(BaseModel):
    """One ``[[providers.<name>.phases]]`` entry of a simulated provider: some of its profile's
    fields replaced ``after`` the simulator started (it slows, fails or recovers mid-run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after: Duration
    profile: Annotated[dict[str, Any], BeforeValidator(_profile_input)]


Policy = Literal[
    "fastest", "hedge", "race", "failover", "weighted", "prefix", "least-loaded", "round-robin"
]
Statistic = Literal["p50", "p95", "p99", "mean"]


class ProviderConfig(BaseModel):
    """One ``[providers.<name>]`` table: a catalog vendor, one based on a catalog ``kind``, or a
    server the catalog does not know (then ``base_url`` is required).

    Fields left unset come from the catalog entry. ``continuation = false`` (or ``None``) turns
    continuation off; ``api_key_env = ""`` (or ``None``) says the provider needs no key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str | None = None
    """The catalog entry this provider is based on; default: the table's own name."""
    base_url: str | None = None
    api_key: SecretStr | None = None
    """The API key itself; prefer ``api_key_env`` to keep keys out of files."""
    api_key_env: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    api_key_env_fallbacks: tuple[str, ...] | None = None
    """Older names of ``api_key_env``, read when it is unset (the catalog's, unless
    ``api_key_env`` is given here)."""
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Extra headers, added to the catalog entry's."""
    request_id_headers: tuple[str, ...] | None = None
    """Response headers naming the vendor's request id, tried before ``x-request-id``."""
    continuation: Continuation | None = None
    protocol: Literal["openai", "anthropic"] | None = None
    prompt_caching: Literal["none", "automatic", "explicit"] | None = None
    stream_usage: bool | None = None
    stream_usage_continuous: bool | None = None
    responses: bool | None = None
    responses_stored: bool | None = None
    self_hosted: bool | None = None
    display_name: str | None = None
    docs: str | None = None
    verify: Annotated[bool | str | None, BeforeValidator(_verify_input)] = None
    """TLS trust of this provider's ``https://`` base URL: ``true`` (the system's roots or
    ``SSL_CERT_FILE``), ``false`` (no verification: for a test server only), or the path of a CA
    file (PEM) or directory; unset, the client's own ``verify``."""
    context_window: ContextWindow | None = None
    """Tokens (prompt plus answer) every model of this provider takes at most, e.g. 32768 for a
    self-hosted server started with that context length; it replaces the catalog's windows."""
    context_windows: dict[str, ContextWindow] = Field(default_factory=dict)
    """Context windows by model name (``{ "qwen2.5-7b-instruct" = 32768 }``), added to the
    catalog's; a model named here takes its window from here, before ``context_window``."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Prices by model name (``[providers.<name>.prices."<model>"]``, docs/cost.md), added to
    the catalog's: a model named here takes its price from here. ``"*"`` prices every model
    without its own (a self-hosted server: ``gpu_hour = { usd = 2.5, tokens_per_second =
    2400 }``, or ``input = 0, output = 0``)."""
    usage: UsageFields | None = None
    """Where the server's ``usage`` reports each token class; unset: the catalog's or the
    protocol's."""
    profile: SimulatorProfile = None
    """``kind = "simulator"`` only: how the simulated provider behaves, a preset's name
    (``instant``, ``fast-but-spiky``, ``steady-slow``, ``flaky``) or a table of its fields,
    optionally on a preset (``{ preset = "flaky", rate_503 = 0.2 }``); unset: ``instant``."""
    phases: tuple[SimulatorPhase, ...] = ()
    """``kind = "simulator"`` only: profile changes at given times after its start."""

    @model_validator(mode="after")
    def _check_simulator(self) -> ProviderConfig:
        given = self.model_fields_set
        if self.kind != SIMULATOR:
            for name in ("profile", "phases"):
                if name in given:
                    raise _invalid(f'{name} is for kind = "{SIMULATOR}" providers only', name)
            return self
        for name in _SIMULATOR_OWN:
            if name in given:
                raise _invalid(
                    f"a simulated provider has its own {name} (it starts on 127.0.0.1 with the "
                    f"client, with the simulators' CA): remove {name}",
                    name,
                )
        from .testing._profile import check_fields, profile_of

        try:
            profile_of(self.profile, "profile")
            after = -1.0
            for index, phase in enumerate(self.phases):
                check_fields(phase.profile, f"phases.{index}.profile")
                if phase.after <= after:
                    raise ValueError(f"phases.{index}.after: the phases must come in time order")
                after = phase.after
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        return self

    @field_validator("continuation", mode="before")
    @classmethod
    def _check_continuation(cls, value: Any) -> Any:
        if value is False:
            return None
        if value is True:
            raise _invalid("expected a table such as { message = { prefix = true } } or false")
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url: httpx.URL | None = httpx.URL(value)
        except httpx.InvalidURL:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise _invalid(f"expected an http:// or https:// URL, got {_show(value)}")
        return value


class RouteConfig(BaseModel):
    """One ``[models.<name>]`` table: the targets a model name routes to, and the policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: list[Annotated[str, BeforeValidator(_target_input)]] = Field(min_length=1)
    """``"provider:model"`` strings, split on the first colon."""
    policy: Policy = "hedge"
    hedge_after: Annotated[
        Literal["p50", "p90", "p95", "p99"] | float, BeforeValidator(_hedge_after_input)
    ] = "p95"
    """A percentile of the first target's live TTFT, or seconds."""
    hedge_budget: float = Field(default=0.1, ge=0, le=1)
    """The fraction of extra requests hedging may add."""
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
    stall_timeout: Annotated[Literal["auto", "off"] | float, BeforeValidator(_stall_input)] = "auto"
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
                raise _invalid(f"{target!r} is listed twice", "targets", index)
            seen.add(target)
        count = len(self.targets)
        if self.race > count:
            raise _invalid(
                f"expected at most {count} (the number of targets), got {self.race}", "race"
            )
        if self.weights is not None and len(self.weights) != count:
            raise _invalid(
                f"expected {count} numbers (one per target), got {len(self.weights)}", "weights"
            )
        if self.policy == "weighted" and self.weights is None:
            raise _invalid(
                "required by policy = 'weighted': one positive number per target",
                "weights",
            )
        for target in self.context_windows:
            if target not in seen:
                raise _invalid(
                    f"{target!r} is not one of this route's targets{_suggest(target, seen)}",
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
                raise _invalid("an example must not be blank", "examples", index)
        if self.description is not None and not self.description.strip():
            raise _invalid("a description must not be blank", "description")
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
                raise _invalid("a class name must be a non-empty string", "tiers")
        for label in self.classes:
            if label not in self.tiers:
                raise _invalid(
                    f"{label!r} is not a class of tiers{_suggest(label, self.tiers)}",
                    "classes",
                    label,
                )
        if self.classifier is not None:
            if self.examples is not None or any(c.has_examples for c in self.classes.values()):
                raise _invalid(
                    "give either a fitted classifier or examples (a file or classes), not both",
                    "classifier",
                )
            return self
        for label in self.tiers:
            given = self.classes.get(label)
            if given is not None and not given.has_examples and given.allow is None:
                raise _invalid("an empty class: give examples or a description", "classes", label)
            if self.examples is None and (given is None or not given.has_examples):
                raise _invalid(
                    f"class {label!r} has no examples: give classes.{_key([label])}.examples, "
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

    @field_validator("prompt_classes")
    @classmethod
    def _check_classes(cls, value: list[int]) -> list[int]:
        for index in range(1, len(value)):
            if value[index] <= value[index - 1]:
                raise _invalid(
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


Size = Annotated[int, BeforeValidator(_size_input)]


def _redis_url_input(value: Any) -> Any:
    if isinstance(value, str) and not value.startswith(("redis://", "rediss://", "unix://")):
        raise _invalid("expected a redis://, rediss:// or unix:// URL")
    return value


class RedisSettings(BaseModel):
    """The ``[redis]`` table: the server a fleet of app instances shares (cache and stats)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[SecretStr, BeforeValidator(_redis_url_input)] = SecretStr(
        "redis://127.0.0.1:6379/0"
    )
    """A ``redis://`` URL; it may carry a password, so it is kept secret (never shown)."""
    url_env: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
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
            raise _invalid("give url or url_env, not both", "url_env")
        name = data["url_env"]
        if not isinstance(name, str) or not _ENV_VAR_NAME.fullmatch(name):  # never echoed
            raise _invalid("expected the name of an environment variable (A-Z, 0-9, _)", "url_env")
        value = os.environ.get(name, "")
        if not value:
            raise _invalid(f"{name} is not set (it should hold the Redis URL)", "url_env")
        if not value.startswith(("redis://", "rediss://", "unix://")):  # never echoed
            raise _invalid(f"{name}: expected a redis://, rediss:// or unix:// URL", "url_env")
        return {**data, "url": value}


CACHE_DIR_ENV = "LLMROUTE_CACHE_DIR"
"""Where llmroute keeps what it can rebuild (the disk cache's default ``path``, fitted tier
classifiers); default ``$XDG_CACHE_HOME/llmroute``, else ``~/.cache/llmroute``."""


def default_cache_dir() -> str:
    """``$LLMROUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/llmroute``, else ``~/.cache/llmroute``."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return os.path.expanduser(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llmroute")


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


_ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_KEY_NAME = r"^[A-Za-z0-9._-]{1,64}$"


def _env_var_input(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_VAR_NAME.fullmatch(value) or value.startswith("sk-"):
        # Never echo the input: it may be a key pasted where its variable's name belongs.
        raise _invalid("expected the name of an environment variable (A-Z, 0-9, _), not a key")
    return value


def _path_input(value: Any) -> Any:
    if isinstance(value, str) and value:
        return os.path.expanduser(value)
    return _empty_is_none(value)


_PERIODS = ("day", "month")


def _period_input(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in _PERIODS:
        return value.strip().lower()
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise _invalid(
            f"expected 'day', 'month' or a duration such as '12h', got {_show(value)}"
        ) from None
    if not seconds >= 1:
        raise _invalid(f"expected a period of at least 1 s, got {_show(value)}")
    return seconds


BudgetPeriod = Annotated[str | float, BeforeValidator(_period_input)]

MAX_COUNT = 10**15
"""The largest limit or budget a key or team may have: a Redis script's numbers are doubles,
exact only below 2**53."""
KeyName = Annotated[str, Field(pattern=_KEY_NAME)]


def timestamp_input(value: Any) -> Any:
    """A moment as Unix seconds: a number, a TOML or ISO 8601 date-time (UTC unless it says
    otherwise: ``2027-01-31T00:00:00Z``), or ``None``."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        if value is not None and not (math.isfinite(value) and 0 <= value < 2**40):
            raise _invalid("expected a Unix time in seconds or a date-time (2027-01-31T00:00:00Z)")
        return value
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            moment = None
    if isinstance(moment, datetime.date) and not isinstance(moment, datetime.datetime):
        moment = datetime.datetime(moment.year, moment.month, moment.day)
    if not isinstance(moment, datetime.datetime):
        raise _invalid(
            f"expected a date-time such as 2027-01-31T00:00:00Z or Unix seconds, got {_show(value)}"
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


Timestamp = Annotated[float, BeforeValidator(timestamp_input)]


class ModelLimits(BaseModel):
    """One model name's own limits within a key or a team (``model_limits.<model>``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """Requests per minute to this model name."""
    tpm: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """Tokens per minute to this model name."""


class TeamSettings(BaseModel):
    """A team's limits (``[gateway.teams.<name>]``, a keys file's ``[teams.<name>]``, or the
    admin API): every key of the team counts against them, beside its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    tpm: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    budget_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    budget_period: BudgetPeriod | None = None
    model_limits: dict[str, ModelLimits] | None = None
    soft_limit: float | None = Field(default=None, gt=0, lt=1)
    """The share of the budget at which the gateway says so, once per period (a webhook, a log
    line and a metric)."""


class KeySettings(BaseModel):
    """What one gateway key may do: ``[gateway.limits]`` for every key, ``[gateway.tenants.
    <name>]`` for one key (only the fields it sets replace the defaults), or the key's own table
    in ``keys_file``. Unset: no such limit (see docs/gateway.md, "Keys and their limits")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """Requests per minute (a sliding minute, shared by every replica with Redis)."""
    tpm: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """Tokens per minute: a request counts its estimate (prompt and ``max_tokens``) when it is
    admitted, corrected to its answer's ``usage`` when it ends."""
    budget_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    """Tokens per ``budget_period``; once spent, requests get 429 ``insufficient_quota``."""
    budget_period: BudgetPeriod | None = None
    """``"day"`` (a UTC day), ``"month"`` (a UTC calendar month) or a duration (``"12h"``;
    periods then start at whole multiples of it since 1970)."""
    models: list[str] | None = None
    """The model names (routes, tiered names) the key may use; unset: all of them."""
    default_max_tokens: int | None = Field(default=None, ge=1)
    """Given to a request that names no ``max_tokens`` (``max_output_tokens`` for Responses)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """A request asking for more is refused with 400 (never shortened)."""
    ttft_target_ms: float | None = Field(default=None, gt=0)
    """The key's latency goal, as a request's own ``ttft_target_ms`` (which wins)."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight; unset: ``max_concurrency_per_key``."""
    slo_ttft_ms: float | None = Field(default=None, gt=0)
    """The key's latency objective: ``slo_percentile`` % of its requests get their first token
    within this many milliseconds (docs/gateway.md, "Latency objectives")."""
    slo_percentile: float = Field(default=95.0, gt=0, lt=100)
    admin: bool = False
    """May read every key's usage (``GET /admin/usage``) and manage keys (``/admin/keys``)."""
    team: KeyName | None = None
    """The team whose limits and budget the key shares with the team's other keys."""
    model_limits: dict[str, ModelLimits] | None = None
    """Limits of the key's requests to one model name (``rpm``, ``tpm``), beside its own."""
    soft_limit: float | None = Field(default=None, gt=0, lt=1)
    """The share of ``budget_tokens`` at which the gateway says so, once per period."""


def merge_key_settings(base: KeySettings, own: KeySettings | None) -> KeySettings:
    """``base`` with the fields ``own`` sets replaced."""
    if own is None:
        return base
    data = base.model_dump(exclude_unset=True)
    data.update(own.model_dump(exclude_unset=True))
    return KeySettings.model_validate(data)


def key_settings_problem(settings: KeySettings, routes: Iterable[str]) -> tuple[str, str] | None:
    """The first mistake of a key's merged settings, as ``(field, sentence)``: a budget
    without its period or the reverse, a default ``max_tokens`` above the maximum, a model
    name that is not a route; ``None`` when there is none."""
    if (settings.budget_tokens is None) != (settings.budget_period is None):
        if settings.budget_period is None:
            return "budget_period", (
                "budget_tokens needs a budget_period ('day', 'month' or a duration such as '12h')"
            )
        return "budget_tokens", "budget_period needs budget_tokens (the tokens per period)"
    if (
        settings.default_max_tokens is not None
        and settings.max_tokens is not None
        and settings.default_max_tokens > settings.max_tokens
    ):
        return "default_max_tokens", (
            f"default_max_tokens ({settings.default_max_tokens}) is above max_tokens "
            f"({settings.max_tokens})"
        )
    return _routes_problem(settings.models, settings.model_limits, routes)


def team_settings_problem(settings: TeamSettings, routes: Iterable[str]) -> tuple[str, str] | None:
    """The first mistake of a team's settings, as ``(field, sentence)`` (see
    :func:`key_settings_problem`); ``None`` when there is none."""
    if (settings.budget_tokens is None) != (settings.budget_period is None):
        if settings.budget_period is None:
            return "budget_period", "budget_tokens needs a budget_period ('day', 'month', '12h')"
        return "budget_tokens", "budget_period needs budget_tokens (the tokens per period)"
    return _routes_problem(None, settings.model_limits, routes)


def _routes_problem(
    models: Iterable[str] | None,
    model_limits: Mapping[str, ModelLimits] | None,
    routes: Iterable[str],
) -> tuple[str, str] | None:
    known = list(routes)
    for field_name, names in (("models", models or ()), ("model_limits", model_limits or {})):
        for name in names:
            if name not in known:
                return (
                    field_name,
                    f"{_show(name)} is not a model name of this config{_suggest(name, known)}",
                )
    return None


def _digest_input(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value.strip()):
        return value.strip().lower()
    # Never echo the input: it may be the key itself, pasted where its digest belongs.
    raise _invalid(
        "expected the key's SHA-256 digest as 64 hex digits "
        '(printf %s "$KEY" | sha256sum), not the key'
    )


Digest = Annotated[str, BeforeValidator(_digest_input)]


class KeyEntry(KeySettings):
    """A key of ``keys_file``: where its value is (``env``) or its digest (``sha256``), and
    its settings."""

    env: Annotated[str | None, BeforeValidator(_env_var_input)] = None
    """The environment variable holding the key (read when the file is read)."""
    sha256: Digest | None = Field(default=None, repr=False)
    """The key's SHA-256 digest (hex): the key itself is in no file."""
    expires_at: Timestamp | None = None
    """When the key stops being accepted (Unix seconds, or a date-time; UTC unless given)."""

    @model_validator(mode="after")
    def _one_source(self) -> KeyEntry:
        if (self.env is None) == (self.sha256 is None):
            raise _invalid("give the key as env (a variable's name) or sha256 (its digest)", "env")
        return self

    def settings(self) -> KeySettings:
        """The settings this table gives (``env``, ``sha256`` and ``expires_at`` left out)."""
        data = self.model_dump(exclude_unset=True, exclude={"env", "sha256", "expires_at"})
        return KeySettings.model_validate(data)


class PreviousDigest(BaseModel):
    """A rotated key's former value, accepted until ``until``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: Digest = Field(repr=False)
    until: Timestamp


MANAGED_FIELDS = frozenset(
    {"sha256", "prefix", "previous", "expires_at", "created_at", "updated_at"}
)
"""A managed key's fields that are not settings."""


class ManagedKeyEntry(KeySettings):
    """A key made by the gateway's admin API (stored in Redis, or as ``[api_keys.<name>]`` in
    ``keys_file``): its digest, the digests of its former values still in their overlap, and
    its settings. The key itself is stored nowhere."""

    sha256: Digest = Field(repr=False)
    prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{0,16}$")] = ""
    """The key's first characters, shown to tell it from others (never enough to use it)."""
    previous: list[PreviousDigest] = Field(default_factory=list)
    expires_at: Timestamp | None = None
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None

    def settings(self) -> KeySettings:
        data = self.model_dump(exclude_unset=True, exclude=set(MANAGED_FIELDS))
        return KeySettings.model_validate(data)


class ManagedTeamEntry(TeamSettings):
    """A team made by the admin API (in Redis, or ``[api_teams.<name>]`` in ``keys_file``)."""

    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None

    def settings(self) -> TeamSettings:
        data = self.model_dump(exclude_unset=True, exclude={"created_at", "updated_at"})
        return TeamSettings.model_validate(data)


class KeysFile(BaseModel):
    """``keys_file``: ``[keys.<name>]`` and ``[teams.<name>]`` tables written by people, and
    the ``[api_keys.<name>]`` and ``[api_teams.<name>]`` the admin API writes when the gateway
    has no Redis (docs/gateway.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[KeyName, KeyEntry] = Field(default_factory=dict)
    teams: dict[KeyName, TeamSettings] = Field(default_factory=dict)
    api_keys: dict[KeyName, ManagedKeyEntry] = Field(default_factory=dict)
    api_teams: dict[KeyName, ManagedTeamEntry] = Field(default_factory=dict)


def read_keys_file(path: str, config: Config) -> KeysFile:
    """Every table of ``keys_file`` at ``path``, each key's settings checked with ``config``'s
    ``[gateway.limits]`` merged in; :class:`ConfigError` naming the file, the table and the
    field (never a key's value) for any mistake, or a name ``gateway.keys`` already has."""
    data = _read_toml(path, missing=f"{path}: no such file (gateway.keys_file)")
    # Every message below shows the names: a key pasted as one is refused first, unshown.
    names: list[str] = list(data)
    for table in ("keys", "teams", "api_keys", "api_teams"):
        tables = data.get(table)
        names += list(tables) if isinstance(tables, dict) else []
    for name in names:
        if name.lower().startswith("sk-"):
            raise ConfigError(f"{path}: a key's name looks like a key: name it, e.g. [keys.app]")
        if not re.fullmatch(_KEY_NAME, name):
            raise ConfigError(
                f"{path}: a name is not letters, digits, '.', '_' and '-' (at most 64), as a "
                "key's name in [keys.<name>] is (it is not shown: it may be a key)"
            )
    try:
        contents = KeysFile.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    gateway = config.gateway or GatewaySettings()
    routes = [*config.models, *config.tiered]
    for table, entries in (("keys", contents.keys), ("api_keys", contents.api_keys)):
        for name, entry in entries.items():
            where = f"{path}: {table}.{_key([name])}"
            if table == "keys" and name in gateway.keys:
                raise ConfigError(f"{where}: gateway.keys has a key of this name already")
            try:
                merged = merge_key_settings(gateway.limits, entry.settings())
            except pydantic.ValidationError as exc:
                raise ConfigError(_describe(exc, where)) from None
            problem = key_settings_problem(merged, routes)
            if problem is not None:
                raise ConfigError(f"{where}.{problem[0]}: {problem[1]}")
    for table, teams in (("teams", contents.teams), ("api_teams", contents.api_teams)):
        for name, team in teams.items():
            problem = team_settings_problem(team, routes)
            if problem is not None:
                raise ConfigError(f"{path}: {table}.{_key([name])}.{problem[0]}: {problem[1]}")
    return contents


def load_keys_file(path: str, config: Config) -> dict[str, KeyEntry]:
    """The keys of ``keys_file`` at ``path`` (its ``[keys.<name>]`` tables; see
    :func:`read_keys_file`)."""
    return dict(read_keys_file(path, config).keys)


class RouteObjective(BaseModel):
    """A ``[gateway.slos.<route>]`` table: the route's latency objective."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: float = Field(gt=0)
    """``percentile`` % of the route's requests get their first token within this long."""
    percentile: float = Field(default=95.0, gt=0, lt=100)


class GatewaySettings(BaseModel):
    """The ``[gateway]`` table: ``llmroute serve``, the OpenAI-compatible gateway (see
    docs/gateway.md). Keys are named here and read from the environment, never from the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[
        Annotated[str, Field(pattern=_KEY_NAME)], Annotated[str, BeforeValidator(_env_var_input)]
    ] = Field(default_factory=lambda: {"default": "LLMROUTE_GATEWAY_KEY"})
    """The gateway's API keys: a name (shown in metrics and logs) -> the environment variable
    holding the key. Default: one key named ``default`` in ``LLMROUTE_GATEWAY_KEY`` (none
    when ``keys_file`` is given)."""
    keys_file: Annotated[str | None, BeforeValidator(_path_input)] = None
    """A TOML file of more keys, each with its settings, read again when it changes or on
    SIGHUP (docs/gateway.md, "Keys that change without a restart"); it holds the keys'
    SHA-256 digests or the names of their environment variables, never the keys."""
    keys_reload_interval: Annotated[Duration, Field(gt=0)] = 1.0
    """How often ``keys_file`` is checked for a change."""
    revoked_streams: Literal["finish", "cut"] = "finish"
    """What becomes of a revoked key's streams in flight on a reload: they ``finish``, or are
    ``cut`` (ended with an error event, the upstream cancelled)."""
    limits: KeySettings = Field(default_factory=KeySettings)
    """Every key's limits and defaults (``[gateway.limits]``)."""
    tenants: dict[Annotated[str, Field(pattern=_KEY_NAME)], KeySettings] = Field(
        default_factory=dict
    )
    """One key's settings (``[gateway.tenants.<key name>]``): the fields given replace
    ``limits``'s."""
    slos: dict[str, RouteObjective] = Field(default_factory=dict)
    """Latency objectives by route (``[gateway.slos.<model name>]``)."""
    teams: dict[KeyName, TeamSettings] = Field(default_factory=dict)
    """Teams (``[gateway.teams.<name>]``): limits and budgets their keys share."""
    soft_limit_webhook: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """An ``http(s)://`` URL the gateway POSTs to when a key or team reaches its
    ``soft_limit`` share of a budget (once per period), beside a log line and a metric."""
    keys_sync_interval: Annotated[Duration, Field(gt=0)] = 0.25
    """With ``limits_backend = "redis"``: how often a replica asks Redis whether the admin
    API's keys changed (a key made on one replica works on every other within this long)."""
    limits_on_redis_error: Literal["local", "refuse"] = "local"
    """With ``limits_backend = "redis"`` and Redis unreachable: count in this replica
    (``local``) or refuse requests with 503 (``refuse``); logged once per outage."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    """0: any free port (the one chosen is printed)."""
    certfile: Annotated[str | None, BeforeValidator(_path_input)] = None
    """A PEM certificate (chain): with ``keyfile``, the gateway serves HTTPS, HTTP/2 by ALPN."""
    keyfile: Annotated[str | None, BeforeValidator(_path_input)] = None
    max_body_bytes: Annotated[Size, Field(gt=0)] = 4 * 2**20
    """Larger request bodies are refused with 413."""
    max_concurrency_per_key: int = Field(default=64, ge=1)
    """Requests in flight per key (a stream counts until it ends); more are refused with 429."""
    retry_after: Annotated[Duration, Field(gt=0)] = 1.0
    """Seconds a 429 for ``max_concurrency_per_key`` asks the client to wait (Retry-After)."""
    metrics_public: bool = False
    """Serve ``/metrics`` without a key (for a scraper on a private network)."""
    live_page: bool = False
    """Serve the live page at ``/admin/live`` (docs/observability.md): its data only to a key
    with ``admin = true``. Off: no page, and nothing sampled."""
    cache_namespace_per_key: bool = True
    """Keep each key's cached answers apart (``true``, the default), or share them between all
    keys (``false``). ``cache_groups`` shares them between some keys only."""
    cache_groups: dict[Annotated[str, Field(pattern=_KEY_NAME)], list[str]] = Field(
        default_factory=dict
    )
    """Keys whose cached answers are shared: a group name -> key names (a key in one group)."""
    idle_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    """A connection with no request in flight (or whose request headers have not all arrived)
    is closed after this long."""
    handshake_timeout: Annotated[Duration, Field(gt=0)] = 10.0
    """A TLS handshake must end within this long."""
    body_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    """A request body must arrive whole within this long, else 408. A body being read holds no
    per-key slot."""
    write_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    """A write to a client that does not read may wait this long; then the response is cut
    (HTTP/2: the stream is reset; HTTP/1.1: the connection closed) and the upstream cancelled."""
    drain_timeout: Annotated[Duration, Field(ge=0)] = 10.0
    """On SIGTERM or SIGINT (``llmroute serve``), the gateway stops taking requests (503) and
    lets those in flight finish for up to this long; then the rest are ended with a
    ``gateway_shutdown`` error event and their upstream streams cancelled. A second signal ends
    them at once; 0 ends them at once. ``llmroute serve --drain`` overrides it."""
    max_retry_after: Annotated[Duration, Field(ge=0)] = 60.0
    """An upstream's Retry-After passed on to a client is capped at this many seconds."""
    limits_backend: Literal["memory", "redis"] = "memory"
    """Where ``max_concurrency_per_key`` is counted: in this process, or in the ``[redis]``
    server, shared by every replica of the gateway."""
    slot_lease: Annotated[Duration, Field(gt=0)] = 60.0
    """With ``limits_backend = "redis"``: a request's slot lapses this long after its replica
    last renewed it (a replica renews every ``write_timeout / 4`` while the request runs; a
    replica that dies frees its slots after this long)."""
    h2_max_concurrent_streams: int = Field(default=256, ge=1, le=2**31 - 1)
    """HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: more open streams on one connection are a
    protocol error (GOAWAY)."""
    h2_max_resets: int = Field(default=200, ge=1)
    """HTTP/2 streams a client may reset, per connection and 10
    seconds (a token bucket); more: GOAWAY ENHANCE_YOUR_CALM (rapid reset)."""
    h2_max_control_frames: int = Field(default=1000, ge=1)
    """HTTP/2 frames carrying no request (PING, SETTINGS, PRIORITY, empty DATA, unknown),
    per connection and 10 seconds (a token bucket); more: GOAWAY ENHANCE_YOUR_CALM."""

    @model_validator(mode="before")
    @classmethod
    def _no_default_key_with_a_file(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("keys_file") and "keys" not in data:
            return {**data, "keys": {}}
        return data

    @field_validator("keys")
    @classmethod
    def _check_key_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower().startswith("sk-"):
                # A name shows in metrics and logs; this one looks like a key (never echoed).
                raise _invalid('a key\'s name looks like a key: name it, e.g. app = "ENV_VAR"')
        return value

    @model_validator(mode="after")
    def _check_tls(self) -> GatewaySettings:
        if (self.certfile is None) != (self.keyfile is None):
            missing = "keyfile" if self.keyfile is None else "certfile"
            raise _invalid("certfile and keyfile go together", missing)
        return self

    @model_validator(mode="after")
    def _check_keys(self) -> GatewaySettings:
        if not self.keys and self.keys_file is None:
            raise _invalid("the gateway needs a key: name one here, or give keys_file", "keys")
        for name in self.tenants:
            if name.lower().startswith("sk-"):
                raise _invalid(
                    "a key's name looks like a key: name it, e.g. [tenants.app]", "tenants"
                )
            if name not in self.keys:
                raise _invalid(
                    f"{name!r} is not a key name of gateway.keys{_suggest(name, self.keys)} "
                    "(a key in keys_file has its settings in its own table there)",
                    "tenants",
                    name,
                )
        return self

    @field_validator("soft_limit_webhook")
    @classmethod
    def _check_webhook(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise _invalid("expected an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _check_lease(self) -> GatewaySettings:
        if self.slot_lease < self.write_timeout / 2:
            raise _invalid("slot_lease must be at least half of write_timeout", "slot_lease")
        return self

    @model_validator(mode="after")
    def _check_cache_groups(self) -> GatewaySettings:
        seen: dict[str, str] = {}
        for group, names in self.cache_groups.items():
            for name in names:
                if name not in self.keys:
                    raise _invalid(f"cache_groups.{group}: {name!r} is not a key name")
                if name in seen:
                    raise _invalid(f"key {name!r} is in cache groups {seen[name]!r} and {group!r}")
                seen[name] = group
        return self


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

    _source: str = PrivateAttr(default=_DEFAULT_SOURCE)

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
                raise _invalid("is both a route and a tiered model name", "models", name)
            for label, route in tiered.tiers.items():
                if route not in self.models:
                    raise _invalid(self._not_a_tier(route), "models", name, "tiers", label)
                if label in self.models and label != route:  # it would shadow forcing that route
                    raise _invalid(
                        f"class {label!r} is named like a route but goes to {route!r}: "
                        "name the class otherwise (llmroute.tier names a class or a route)",
                        "models",
                        name,
                        "tiers",
                        label,
                    )
            if tiered.default not in self.models:
                raise _invalid(self._not_a_tier(tiered.default), "models", name, "default")
            routes = {*tiered.tiers.values(), tiered.default}
            for label, given in tiered.classes.items():
                for index, route in enumerate(given.allow or ()):
                    if route not in routes:
                        raise _invalid(
                            f"{route!r} is not a tier of models.{_key([name])} (one of: "
                            f"{', '.join(repr(r) for r in sorted(routes))})"
                            f"{_suggest(route, routes)}",
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
                raise _invalid(_unknown_route(route, names), "gateway", "slos", route)
        for team, settings in gateway.teams.items():
            problem = team_settings_problem(settings, names)
            if problem is not None:
                raise _invalid(f"team {team!r}: {problem[1]}", "gateway", "teams", team, problem[0])
        for key in gateway.keys:
            merged = merge_key_settings(gateway.limits, gateway.tenants.get(key))
            problem = key_settings_problem(merged, names)
            if problem is not None:
                table = "tenants" if key in gateway.tenants else "limits"
                where = ("gateway", "tenants", key) if table == "tenants" else ("gateway", "limits")
                raise _invalid(f"key {key!r}: {problem[1]}", *where, problem[0])
        return self

    def _not_a_tier(self, name: str) -> str:
        if name in self.tiered:
            return f"{name!r} is a tiered model name; a tier must be a route"
        return _unknown_route(name, self.models)

    @model_validator(mode="after")
    def _check_references(self) -> Config:
        catalog = load_catalog()
        for name, provider in self.providers.items():
            if not name or ":" in name:
                raise _invalid(
                    "a provider name must be non-empty and contain no ':'", "providers", name
                )
            if provider.kind is not None and provider.kind not in (*catalog, SIMULATOR):
                raise _invalid(
                    f"unknown kind {provider.kind!r}: not in the catalog"
                    + (
                        _suggest(provider.kind, [*catalog, SIMULATOR])
                        or f" (one of: {', '.join([*catalog, SIMULATOR])})"
                    ),
                    "providers",
                    name,
                    "kind",
                )
            if provider.kind is None and name not in catalog and provider.base_url is None:
                raise _invalid(
                    "base_url is required for a provider that is not in the catalog "
                    "(or set kind = ...)",
                    "providers",
                    name,
                )
        known = [*self.providers, *(name for name in catalog if name not in self.providers)]
        if self.default_provider is not None and self.default_provider not in known:
            raise _invalid(_unknown_provider(self.default_provider, known), "default_provider")
        for route, settings in self.models.items():
            for index, target in enumerate(settings.target_list()):
                if target.provider not in known:
                    raise _invalid(
                        _unknown_provider(target.provider, known), "models", route, "targets", index
                    )
        return self


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
    source: str = field(default=_DEFAULT_SOURCE, compare=False)
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
        return _validate(source, _DEFAULT_SOURCE)
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
                _key([route]),
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

    key = f"models.{_key([name])}"
    for module in ("numpy", "wordllama"):
        if importlib.util.find_spec(module) is None:
            from ._install import install_hint

            raise ConfigError(
                f"{source}: {key}: a tiered model needs the request classifier, whose "
                f"dependency {module} is not installed: {install_hint('tiers')}"
            )
    base = Path(source).parent if source != _DEFAULT_SOURCE else Path.cwd()
    paths: dict[str, Path | None] = {}
    for field_name in ("examples", "classifier"):
        value = getattr(tiered, field_name)
        path = None
        if value is not None:
            shown = _show(value)
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
    config = _validate({"providers": {name: dict(table)}}, _DEFAULT_SOURCE)
    return _resolve_provider(name, config, load_catalog(), environ, {})


def route_config(name: str, table: Mapping[str, Any]) -> RouteConfig:
    """A ``[models.<name>]`` table given in code, validated (errors name ``models.<name>``)."""
    try:
        return RouteConfig.model_validate(dict(table))
    except pydantic.ValidationError as exc:
        prefix = f"models.{_key([name])}"
        raise ConfigError(
            format_validation_error(exc, source=_DEFAULT_SOURCE, prefix=prefix)
        ) from None


def _simulator_spec(name: str, settings: ProviderConfig, address: SimulatorAddress) -> ProviderSpec:
    """What a simulated provider is, as a catalog entry would say: llmroute's simulator serves
    both wire protocols, continues an assistant prefix, streams usage and the Responses API."""
    from .testing._profile import profile_of

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
    key = f"providers.{_key([name])}"
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
                f"{source}: providers.{_key([provider.name])}.verify: {provider.verify!r} differs "
                f"from providers.{_key([other.name])}.verify ({other.verify!r}), and both reach "
                f"{host}:{port} over the same connections: give them the same verify"
            )


def _with_slash(url: httpx.URL) -> httpx.URL:
    path = url.path if url.path.endswith("/") else url.path + "/"
    return url.copy_with(path=path)


def _load_file(path: str, *, missing: str) -> Config:
    return _validate(_read_toml(path, missing=missing), path)


def _read_toml(path: str, *, missing: str) -> dict[str, Any]:
    """The TOML file at ``path``; :class:`ConfigError` saying where it is not valid TOML."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(missing) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the path
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        position = _TOML_POSITION.search(text)
        where = ""
        if position is not None:
            text = text[: position.start()]
            where = f"line {position[1]}, column {position[2]}: "
        text = text.replace(" (at end of document)", "")
        if text[:1].isupper() and text[1:2].islower():
            text = text[0].lower() + text[1:]
        raise ConfigError(f"{path}: {where}not valid TOML: {text}") from None
    return data


def _validate(data: Mapping[str, Any], source: str) -> Config:
    load_catalog()
    try:
        config = Config.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
    config._source = source
    return config


def _key(parts: Iterable[str | int]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
            out = f"{out}.{text}" if out else text
    return out


def _join(key: str, more: str) -> str:
    if not key or not more:
        return key or more
    return key + more if more.startswith("[") else f"{key}.{more}"


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _suggest(word: object, choices: Iterable[str]) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown_route(name: str, routes: Iterable[str]) -> str:
    return f"{name!r} is not a route (a [models] table with targets){_suggest(name, routes)}"


def _unknown_provider(name: str, known: Sequence[str]) -> str:
    return f"unknown provider {name!r}: not in [providers] nor the catalog{_suggest(name, known)}"


def _fields_at(loc: Sequence[str | int]) -> list[str]:
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


_EXPECTED = {
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "list_type": "expected an array",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _env_name(name: str) -> str:
    """An environment variable's name for a message, unless it looks like a pasted secret."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) and not name.startswith("sk-"):
        return name
    return "the variable named by api_key_env (which does not look like a variable name)"


def _describe(exc: pydantic.ValidationError, source: str) -> str:
    """Pydantic's errors in the words of a config file; inputs under ``api_key`` never shown."""
    errors = exc.errors()
    base = format_validation_error(exc, source=source).split("\n")
    lines = []
    for index, err in enumerate(errors):
        given = err["loc"]
        loc = ("models", *given[1:]) if given[:1] == ("tiered",) else given  # as written
        kind = err["type"]
        ctx: dict[str, Any] = err.get("ctx") or {}
        key = _key(loc)
        # A key pasted in the wrong place must not be echoed: inputs under api_key, api_key_env
        # or headers, and whole provider entries, are never shown.
        secret = (
            "api_key" in loc
            or "api_key_env" in loc
            or "api_key_env_fallbacks" in loc
            or "headers" in loc
            or "sha256" in loc
            or "env" in loc
            or (len(loc) == 2 and loc[0] == "providers")
        )
        got = "" if secret else f", got {_show(err.get('input'))}"
        if "[key]" in loc and loc[:2] in (("gateway", "keys"), ("gateway", "tenants")):
            # A gateway key's name that is no name may be the key itself: never echoed.
            where = _key(loc[:2])
            lines.append(
                f"{source}: {where}: a key's name is letters, digits, '.', '_' and '-' (at "
                "most 64); one is not (it is not shown: it may be a key)"
            )
            continue
        if kind == _ERROR_TYPE:
            key = _join(key, str(ctx.get("key", "")))
            what = str(ctx.get("message", err["msg"]))
        elif kind == "literal_error":
            expected = str(ctx.get("expected", ""))
            what = f"expected {expected}{got}"
            if not secret:
                what += _suggest(err.get("input"), re.findall(r"'([^']*)'", expected))
        elif kind == "missing":
            what = "required key is missing"
        elif kind == "extra_forbidden":
            what = "unknown key" + _suggest(loc[-1], _fields_at(given[:-1]))
        elif kind in _EXPECTED:
            what = _EXPECTED[kind] + got
        elif kind in _BOUNDS:
            name, words = _BOUNDS[kind]
            bound = ctx.get(name)
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)
            what = f"expected a number {words} {bound}{got}"
        elif kind == "too_short":
            what = (
                f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
            )
        else:
            dotted = ".".join(str(part) for part in loc if part != "")
            prefix = f"{source}: {dotted or '(top level)'}: "
            line = base[index] if len(base) == len(errors) else ""
            safe = not secret and not isinstance(err.get("input"), Mapping | list)
            what = line.removeprefix(prefix) if safe and line.startswith(prefix) else err["msg"]
        lines.append(f"{source}: {key or '(top level)'}: {what}")
    return "\n".join(lines)
