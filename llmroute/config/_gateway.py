"""The gateway's schema (``llmroute serve``): the ``[gateway]`` table, its keys, tenants, teams
and limits, and ``keys_file``."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal, Protocol

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from .._prices import decimal_input
from ._messages import ConfigError, describe, dotted, invalid, read_toml, show, suggest
from ._values import (
    KEY_NAME,
    Duration,
    Size,
    empty_is_none,
    env_var_input,
    path_input,
    word_or_duration,
)

__all__ = [
    "GatewaySettings",
    "KeyEntry",
    "KeySettings",
    "ManagedKeyEntry",
    "ManagedTeamEntry",
    "ModelLimits",
    "PreviousDigest",
    "RouteObjective",
    "TeamSettings",
    "key_settings_problem",
    "load_keys_file",
    "merge_key_settings",
    "read_keys_file",
    "team_settings_problem",
    "timestamp_input",
]

_PERIODS = ("day", "month")


def _period_input(value: Any) -> Any:
    if value is None:
        return None
    seconds = word_or_duration(value, _PERIODS, "12h")
    if isinstance(seconds, str):
        return seconds
    if not seconds >= 1:
        raise invalid(f"expected a period of at least 1 s, got {show(value)}")
    return seconds


BudgetPeriod = Annotated[str | float, BeforeValidator(_period_input)]

MAX_COUNT = 10**15
"""The largest limit or budget a key or team may have: a Redis script's numbers are doubles,
exact only below 2**53."""
KeyName = Annotated[str, Field(pattern=KEY_NAME)]
MAX_BUDGET_USD = Decimal(10**6)
"""The largest money budget: counted in nano-dollars (10**-9 USD), 10**15 of them at most."""
BudgetUsd = Annotated[
    Decimal,
    BeforeValidator(decimal_input),
    Field(gt=0, le=MAX_BUDGET_USD, decimal_places=9, allow_inf_nan=False, strict=False),
]
"""A money budget in USD: more than 0, at most a million, to the nano-dollar."""


def timestamp_input(value: Any) -> Any:
    """A moment as Unix seconds: a number, a TOML or ISO 8601 date-time (UTC unless it says
    otherwise: ``2027-01-31T00:00:00Z``), or ``None``."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        if value is not None and not (math.isfinite(value) and 0 <= value < 2**40):
            raise invalid("expected a Unix time in seconds or a date-time (2027-01-31T00:00:00Z)")
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
        raise invalid(
            f"expected a date-time such as 2027-01-31T00:00:00Z or Unix seconds, got {show(value)}"
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
    budget_usd: BudgetUsd | None = None
    """Money per ``budget_period`` (USD, at the targets' prices), shared by the team's keys."""


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
    budget_usd: BudgetUsd | None = None
    """Money per ``budget_period`` (USD, at the targets' prices): a request is admitted only if
    its dearest possible cost fits in what is left, then counted at its real cost."""


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
    budgeted = settings.budget_tokens is not None or settings.budget_usd is not None
    if budgeted != (settings.budget_period is not None):
        if settings.budget_period is None:
            given = "budget_tokens" if settings.budget_tokens is not None else "budget_usd"
            return "budget_period", (
                f"{given} needs a budget_period ('day', 'month' or a duration such as '12h')"
            )
        return "budget_tokens", "budget_period needs budget_tokens or budget_usd (per period)"
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
    budgeted = settings.budget_tokens is not None or settings.budget_usd is not None
    if budgeted != (settings.budget_period is not None):
        if settings.budget_period is None:
            given = "budget_tokens" if settings.budget_tokens is not None else "budget_usd"
            return "budget_period", f"{given} needs a budget_period ('day', 'month', '12h')"
        return "budget_tokens", "budget_period needs budget_tokens or budget_usd (per period)"
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
                    f"{show(name)} is not a model name of this config{suggest(name, known)}",
                )
    return None


def _digest_input(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value.strip()):
        return value.strip().lower()
    # Never echo the input: it may be the key itself, pasted where its digest belongs.
    raise invalid(
        "expected the key's SHA-256 digest as 64 hex digits "
        '(printf %s "$KEY" | sha256sum), not the key'
    )


Digest = Annotated[str, BeforeValidator(_digest_input)]


class KeyEntry(KeySettings):
    """A key of ``keys_file``: where its value is (``env``) or its digest (``sha256``), and
    its settings."""

    env: Annotated[str | None, BeforeValidator(env_var_input)] = None
    """The environment variable holding the key (read when the file is read)."""
    sha256: Digest | None = Field(default=None, repr=False)
    """The key's SHA-256 digest (hex): the key itself is in no file."""
    expires_at: Timestamp | None = None
    """When the key stops being accepted (Unix seconds, or a date-time; UTC unless given)."""

    @model_validator(mode="after")
    def _one_source(self) -> KeyEntry:
        if (self.env is None) == (self.sha256 is None):
            raise invalid("give the key as env (a variable's name) or sha256 (its digest)", "env")
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


class RoutedConfig(Protocol):
    """What a keys file is checked against: a :class:`~llmroute.config.Config`'s gateway
    settings and route names (a protocol, so this module needs nothing above it)."""

    @property
    def gateway(self) -> GatewaySettings | None: ...
    @property
    def models(self) -> Mapping[str, Any]: ...
    @property
    def tiered(self) -> Mapping[str, Any]: ...


def read_keys_file(path: str, config: RoutedConfig) -> KeysFile:
    """Every table of ``keys_file`` at ``path``, each key's settings checked with ``config``'s
    ``[gateway.limits]`` merged in; :class:`ConfigError` naming the file, the table and the
    field (never a key's value) for any mistake, or a name ``gateway.keys`` already has."""
    data = read_toml(path, missing=f"{path}: no such file (gateway.keys_file)")
    # Every message below shows the names: a key pasted as one is refused first, unshown.
    names: list[str] = list(data)
    for table in ("keys", "teams", "api_keys", "api_teams"):
        tables = data.get(table)
        names += list(tables) if isinstance(tables, dict) else []
    for name in names:
        if name.lower().startswith("sk-"):
            raise ConfigError(f"{path}: a key's name looks like a key: name it, e.g. [keys.app]")
        if not re.fullmatch(KEY_NAME, name):
            raise ConfigError(
                f"{path}: a name is not letters, digits, '.', '_' and '-' (at most 64), as a "
                "key's name in [keys.<name>] is (it is not shown: it may be a key)"
            )
    try:
        contents = KeysFile.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(describe(exc, path)) from None
    gateway = config.gateway or GatewaySettings()
    routes = [*config.models, *config.tiered]
    for table, entries in (("keys", contents.keys), ("api_keys", contents.api_keys)):
        for name, entry in entries.items():
            where = f"{path}: {table}.{dotted([name])}"
            if table == "keys" and name in gateway.keys:
                raise ConfigError(f"{where}: gateway.keys has a key of this name already")
            try:
                merged = merge_key_settings(gateway.limits, entry.settings())
            except pydantic.ValidationError as exc:
                raise ConfigError(describe(exc, where)) from None
            problem = key_settings_problem(merged, routes)
            if problem is not None:
                raise ConfigError(f"{where}.{problem[0]}: {problem[1]}")
    for table, teams in (("teams", contents.teams), ("api_teams", contents.api_teams)):
        for name, team in teams.items():
            problem = team_settings_problem(team, routes)
            if problem is not None:
                raise ConfigError(f"{path}: {table}.{dotted([name])}.{problem[0]}: {problem[1]}")
    return contents


def load_keys_file(path: str, config: RoutedConfig) -> dict[str, KeyEntry]:
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
        Annotated[str, Field(pattern=KEY_NAME)], Annotated[str, BeforeValidator(env_var_input)]
    ] = Field(default_factory=lambda: {"default": "LLMROUTE_GATEWAY_KEY"})
    """The gateway's API keys: a name (shown in metrics and logs) -> the environment variable
    holding the key. Default: one key named ``default`` in ``LLMROUTE_GATEWAY_KEY`` (none
    when ``keys_file`` is given)."""
    keys_file: Annotated[str | None, BeforeValidator(path_input)] = None
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
    tenants: dict[Annotated[str, Field(pattern=KEY_NAME)], KeySettings] = Field(
        default_factory=dict
    )
    """One key's settings (``[gateway.tenants.<key name>]``): the fields given replace
    ``limits``'s."""
    slos: dict[str, RouteObjective] = Field(default_factory=dict)
    """Latency objectives by route (``[gateway.slos.<model name>]``)."""
    teams: dict[KeyName, TeamSettings] = Field(default_factory=dict)
    """Teams (``[gateway.teams.<name>]``): limits and budgets their keys share."""
    soft_limit_webhook: Annotated[str | None, BeforeValidator(empty_is_none)] = None
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
    certfile: Annotated[str | None, BeforeValidator(path_input)] = None
    """A PEM certificate (chain): with ``keyfile``, the gateway serves HTTPS, HTTP/2 by ALPN."""
    keyfile: Annotated[str | None, BeforeValidator(path_input)] = None
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
    cache_groups: dict[Annotated[str, Field(pattern=KEY_NAME)], list[str]] = Field(
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
                raise invalid('a key\'s name looks like a key: name it, e.g. app = "ENV_VAR"')
        return value

    @model_validator(mode="after")
    def _check_tls(self) -> GatewaySettings:
        if (self.certfile is None) != (self.keyfile is None):
            missing = "keyfile" if self.keyfile is None else "certfile"
            raise invalid("certfile and keyfile go together", missing)
        return self

    @model_validator(mode="after")
    def _check_keys(self) -> GatewaySettings:
        if not self.keys and self.keys_file is None:
            raise invalid("the gateway needs a key: name one here, or give keys_file", "keys")
        for name in self.tenants:
            if name.lower().startswith("sk-"):
                raise invalid(
                    "a key's name looks like a key: name it, e.g. [tenants.app]", "tenants"
                )
            if name not in self.keys:
                raise invalid(
                    f"{name!r} is not a key name of gateway.keys{suggest(name, self.keys)} "
                    "(a key in keys_file has its settings in its own table there)",
                    "tenants",
                    name,
                )
        return self

    @field_validator("soft_limit_webhook")
    @classmethod
    def _check_webhook(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise invalid("expected an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _check_lease(self) -> GatewaySettings:
        if self.slot_lease < self.write_timeout / 2:
            raise invalid("slot_lease must be at least half of write_timeout", "slot_lease")
        return self

    @model_validator(mode="after")
    def _check_cache_groups(self) -> GatewaySettings:
        seen: dict[str, str] = {}
        for group, names in self.cache_groups.items():
            for name in names:
                if name not in self.keys:
                    raise invalid(f"cache_groups.{group}: {name!r} is not a key name")
                if name in seen:
                    raise invalid(f"key {name!r} is in cache groups {seen[name]!r} and {group!r}")
                seen[name] = group
        return self
