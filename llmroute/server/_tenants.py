"""The gateway's tenants: each key's name, how it is recognised, and what it may do.

One :class:`Tenants` holds everything read at once — ``gateway.keys`` (keys in environment
variables), ``keys_file`` (more keys, by variable or by SHA-256 digest, with their settings, and
teams), ``[gateway.limits]``, ``[gateway.tenants.<name>]``, ``[gateway.teams.<name>]`` and the
keys and teams the admin API made (:class:`Managed`) — and is replaced whole on a reload or a
change made over the API, so a request sees one consistent set: a key's ring entry, its limits
and its team never come from two reads.

On a name used twice the declared one wins: ``gateway.keys`` and ``[gateway.teams]`` over
``keys_file``, and both over what the admin API made (which is then not used, and logged).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

import pydantic

from ..config import (
    Config,
    ConfigError,
    GatewaySettings,
    KeyEntry,
    KeySettings,
    ManagedKeyEntry,
    ManagedTeamEntry,
    TeamSettings,
    key_settings_problem,
    merge_key_settings,
    read_keys_file,
    team_settings_problem,
)
from ._auth import KeyRing, bearer_digest

__all__ = [
    "NANOS",
    "Managed",
    "Scope",
    "Team",
    "Tenant",
    "Tenants",
    "file_stamp",
    "team_scope",
    "to_nanos",
    "usd",
]

log = logging.getLogger("llmroute.server")


@dataclass(frozen=True, slots=True)
class Managed:
    """The keys and teams the admin API made, as its store holds them now."""

    keys: Mapping[str, ManagedKeyEntry] = field(default_factory=dict)
    teams: Mapping[str, ManagedTeamEntry] = field(default_factory=dict)
    version: object = None
    """What tells this set from the next one (the store's change counter)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """One set of counters a request is counted against: a key's own, a team's, or either's
    for one model name. ``id`` names the counters (a key's name for its own; ``#`` and ``@``,
    which no key name has, mark a model's and a team's)."""

    id: str
    label: str
    """How refusals name it: ``key 'app'``, ``team 'ml' (key 'app')``, with ``model 'chat'``."""
    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_period: str | float | None = None
    soft_limit: float | None = None
    owner: str = ""
    """The key's or the team's name (soft-limit alerts name it)."""
    kind: str = "key"
    """``key`` or ``team``."""
    budget_nanos: int | None = None
    """The money budget (``budget_usd``) in nano-dollars, over ``budget_period``."""

    @property
    def soft_at(self) -> int | None:
        """The tokens spent at which the soft limit is reached."""
        if self.soft_limit is None or self.budget_tokens is None:
            return None
        return max(1, int(self.budget_tokens * self.soft_limit))


@dataclass(frozen=True, slots=True)
class Team:
    """One team's name and limits."""

    name: str
    settings: TeamSettings
    source: str = "config"
    """``config`` (``[gateway.teams]``), ``file`` (``keys_file``) or ``api``."""


NANOS = 10**9
"""Nano-dollars in a dollar: the unit money budgets are counted in."""


def _has_limits(s: KeySettings | TeamSettings) -> bool:
    budgets = s.budget_tokens is not None or s.budget_usd is not None
    return s.rpm is not None or s.tpm is not None or budgets


def to_nanos(usd: Decimal | None) -> int | None:
    """A budget in USD as nano-dollars (``None`` stays ``None``)."""
    return None if usd is None else int(usd * NANOS)


def usd(nanos: int) -> str:
    """Nano-dollars as a decimal string of dollars (``"0.000123"``, ``"5"``): exact, unlike a
    float."""
    return f"{(Decimal(nanos) / NANOS).normalize():f}"


def _scopes(
    name: str, settings: KeySettings, team: Team | None
) -> tuple[tuple[Scope, ...], dict[str, tuple[Scope, ...]]]:
    """A key's scopes for any request (its own, its team's) and, by model name, with the
    model's own added."""
    base: list[Scope] = []
    if _has_limits(settings):
        base.append(
            Scope(
                name,
                f"key {name!r}",
                settings.rpm,
                settings.tpm,
                settings.budget_tokens,
                settings.budget_period,
                settings.soft_limit,
                name,
                budget_nanos=to_nanos(settings.budget_usd),
            )
        )
    shared = team_scope(team, name) if team is not None else None
    if shared is not None:
        base.append(shared)
    t = team.settings if team is not None else None
    by_model: dict[str, list[Scope]] = {}
    for model, limits in (settings.model_limits or {}).items():
        if limits.rpm is not None or limits.tpm is not None:
            label = f"model {model!r} in key {name!r}"
            scope = Scope(f"{name}#{model}", label, limits.rpm, limits.tpm, owner=name)
            by_model.setdefault(model, []).append(scope)
    if team is not None and t is not None:
        for model, limits in (t.model_limits or {}).items():
            if limits.rpm is not None or limits.tpm is not None:
                label = f"model {model!r} in team {team.name!r} (key {name!r})"
                scope = Scope(
                    f"@{team.name}#{model}",
                    label,
                    limits.rpm,
                    limits.tpm,
                    owner=team.name,
                    kind="team",
                )
                by_model.setdefault(model, []).append(scope)
    return tuple(base), {model: (*base, *more) for model, more in by_model.items()}


def team_scope(team: Team, key: str | None = None) -> Scope | None:
    """The team's own scope (``None`` when it has no rate limit nor budget); ``key`` names the
    key whose request it counts, in refusals."""
    t = team.settings
    if not _has_limits(t):
        return None
    return Scope(
        "@" + team.name,
        f"team {team.name!r} (key {key!r})" if key is not None else f"team {team.name!r}",
        t.rpm,
        t.tpm,
        t.budget_tokens,
        t.budget_period,
        t.soft_limit,
        team.name,
        "team",
        to_nanos(t.budget_usd),
    )


@dataclass(frozen=True, slots=True)
class Tenant:
    """One key's name and merged settings, its team, and the scopes its requests count in."""

    name: str
    settings: KeySettings
    concurrency: int
    """Requests in flight it may have."""
    team: Team | None = None
    expires_at: float | None = None
    """When the key stops being accepted (Unix seconds); ``None``: never."""
    source: str = "config"
    """``config`` (``gateway.keys``), ``file`` (``keys_file``) or ``api`` (the admin API's)."""
    scopes: tuple[Scope, ...] = field(init=False, repr=False, compare=False)
    """What a request is counted against whatever its model (its own limits, its team's)."""
    model_scopes: Mapping[str, tuple[Scope, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base, by_model = _scopes(self.name, self.settings, self.team)
        object.__setattr__(self, "scopes", base)
        object.__setattr__(self, "model_scopes", by_model)

    @property
    def limited(self) -> bool:
        """Whether it has a rate limit or a budget to count against (its own, its team's or
        a model's)."""
        return bool(self.scopes) or bool(self.model_scopes)

    def scopes_for(self, model: str | None) -> tuple[Scope, ...]:
        """The scopes a request to ``model`` is counted in."""
        if model is None:
            return self.scopes
        return self.model_scopes.get(model, self.scopes)

    def may_use(self, model: str) -> bool:
        models = self.settings.models
        return models is None or model in models


class Tenants:
    """The keys and their :class:`Tenant` settings (see the module's docstring)."""

    __slots__ = ("_digests", "_values", "admins", "by_name", "managed", "ring", "stamp", "teams")

    def __init__(
        self,
        ring: KeyRing,
        by_name: Mapping[str, Tenant],
        stamp: object = None,
        *,
        digests: Mapping[bytes, tuple[str, float | None]] | None = None,
        teams: Mapping[str, Team] | None = None,
        managed: Managed | None = None,
    ) -> None:
        self.ring = ring
        self.by_name = dict(by_name)
        self.admins = any(t.settings.admin for t in self.by_name.values())
        """Whether a key is an admin's: then only such keys read what covers every key."""
        self.stamp = stamp
        """What ``keys_file`` looked like when read (:func:`file_stamp`)."""
        self._digests = dict(digests or {})
        """The admin API's keys: digest -> (name, accepted until: a rotated value's overlap)."""
        values: dict[str, set[bytes]] = {}
        for value, (name, _) in self._digests.items():
            values.setdefault(name, set()).add(value)
        self._values = {name: frozenset(found) for name, found in values.items()}
        self.teams = dict(teams or {})
        self.managed = managed if managed is not None else Managed()
        """The admin API's keys and teams these were built with."""

    @classmethod
    def load(
        cls,
        config: Config,
        environ: Mapping[str, str] = os.environ,
        managed: Managed | None = None,
    ) -> Tenants:
        """Read every key and its settings; :class:`~llmroute.ConfigError` naming the key and
        the field (never a key) on any mistake of the config or ``keys_file``. ``managed``: the
        admin API's keys and teams from Redis; without it, ``keys_file``'s ``[api_keys]`` and
        ``[api_teams]`` are (with it, those are declared keys like the file's others)."""
        settings = config.gateway or GatewaySettings()
        path = settings.keys_file
        stamp = file_stamp(path) if path is not None else None
        contents = read_keys_file(path, config) if path is not None else None
        entries: dict[str, KeyEntry | ManagedKeyEntry] = dict(contents.keys) if contents else {}
        file_api = Managed(
            dict(contents.api_keys) if contents is not None else {},
            dict(contents.api_teams) if contents is not None else {},
        )
        if managed is None:
            managed = file_api
        else:  # the file's own API tables are declared ones beside Redis's
            entries |= {n: e for n, e in file_api.keys.items() if n not in entries}
        routes = [*config.models, *config.tiered]
        file_teams = contents.teams if contents is not None else {}
        teams = _teams(settings, file_teams, file_api, managed, routes)
        more = {
            n: e.env for n, e in entries.items() if isinstance(e, KeyEntry) and e.env is not None
        }
        digests = {
            name: bytes.fromhex(e.sha256) for name, e in entries.items() if e.sha256 is not None
        }
        ring = KeyRing.from_settings(
            settings,
            environ,
            digests=digests,
            more=more,
            where=f"{path}: keys",
            required=not managed.keys,
        )
        by_name = _declared_tenants(settings, entries, teams, path)
        api_digests = _add_managed_keys(by_name, managed, settings, teams, routes)
        return cls(ring, by_name, stamp, digests=api_digests, teams=teams, managed=managed)

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    def match(self, authorization: str | None, now: float = 0.0) -> Tenant | None:
        """The tenant whose key an ``Authorization: Bearer <key>`` header carries, if the key
        is still accepted at ``now`` (Unix seconds): not past its ``expires_at``, nor a
        rotated value past its overlap."""
        candidate, given = bearer_digest(authorization)
        name = self.ring.match_digest(candidate, given)
        if name is None:
            found = self._digests.get(candidate) if given else None
            if found is None:
                return None
            name, until = found
            if until is not None and now >= until:
                return None
        tenant = self.by_name[name]
        if tenant.expires_at is not None and now >= tenant.expires_at:
            return None
        return tenant

    def accepted(self, name: str) -> frozenset[bytes]:
        """The digests of the values of key ``name`` accepted (a rotated key's former ones in
        their overlap too)."""
        own = self.ring.digest(name)
        found = self._values.get(name, frozenset())
        return found | {own} if own is not None else found

    def kept(self, name: str, newer: Tenants) -> bool:
        """Whether ``newer`` still accepts key ``name`` (some value of it this set accepts)."""
        return name in newer.by_name and bool(self.accepted(name) & newer.accepted(name))

    def revoked_by(self, newer: Tenants) -> set[str]:
        """The names of keys this set has that ``newer`` no longer accepts (gone, or none of
        their values accepted any more: a key rotated with an overlap is not revoked)."""
        return {name for name in self.by_name if not self.kept(name, newer)}

    def __repr__(self) -> str:
        return f"Tenants(names={self.names!r})"


def _teams(
    settings: GatewaySettings,
    file_teams: Mapping[str, TeamSettings],
    file_api: Managed,
    managed: Managed,
    routes: list[str],
) -> dict[str, Team]:
    """Every team: the config's, ``keys_file``'s (its ``[api_teams]`` too when the admin API's
    come from Redis), then the admin API's that no declared team shadows."""
    teams = {n: Team(n, t, "config") for n, t in settings.teams.items()}
    for name, team in file_teams.items():
        teams.setdefault(name, Team(name, team, "file"))
    if managed is not file_api:
        for name, entry in file_api.teams.items():
            teams.setdefault(name, Team(name, entry.settings(), "file"))
    for name, entry in managed.teams.items():
        if name in teams:
            log.warning(
                "gateway: team %r of the admin API is declared too: the declared one is used",
                name,
            )
            continue
        settings_of = _checked_team(name, entry, routes)
        if settings_of is not None:
            teams[name] = Team(name, settings_of, "api")
    return teams


def _declared_tenants(
    settings: GatewaySettings,
    entries: Mapping[str, KeyEntry | ManagedKeyEntry],
    teams: Mapping[str, Team],
    path: str | None,
) -> dict[str, Tenant]:
    """The config's keys and ``keys_file``'s, each with ``[gateway.limits]`` merged in."""
    own: dict[str, tuple[KeySettings | None, float | None, str]] = {
        name: (settings.tenants.get(name), None, "config") for name in settings.keys
    }
    for name, entry in entries.items():
        own[name] = (entry.settings(), entry.expires_at, "file")
    by_name: dict[str, Tenant] = {}
    for name, (given, expires_at, source) in own.items():
        merged = merge_key_settings(settings.limits, given)
        team = _team_of(
            name,
            merged,
            teams,
            f"{path}: keys.{name}" if source == "file" else f"gateway.tenants.{name}",
        )
        concurrency = merged.max_concurrency or settings.max_concurrency_per_key
        by_name[name] = Tenant(name, merged, concurrency, team, expires_at, source)
    return by_name


def _add_managed_keys(
    by_name: dict[str, Tenant],
    managed: Managed,
    settings: GatewaySettings,
    teams: Mapping[str, Team],
    routes: list[str],
) -> dict[bytes, tuple[str, float | None]]:
    """Add the admin API's keys that no declared key shadows to ``by_name``; their digests
    (and their previous secrets', with when each stops working)."""
    api_digests: dict[bytes, tuple[str, float | None]] = {}
    for name, entry in managed.keys.items():
        if name in by_name:
            log.warning(
                "gateway: key %r of the admin API is declared too: the declared one is used",
                name,
            )
            continue
        tenant = _managed_tenant(name, entry, settings, teams, routes)
        if tenant is None:
            continue
        by_name[name] = tenant
        api_digests[bytes.fromhex(entry.sha256)] = (name, None)
        for previous in entry.previous:
            api_digests.setdefault(bytes.fromhex(previous.sha256), (name, previous.until))
    return api_digests


def _team_of(
    name: str, settings: KeySettings, teams: Mapping[str, Team], where: str
) -> Team | None:
    if settings.team is None:
        return None
    team = teams.get(settings.team)
    if team is None:
        raise ConfigError(
            f"{where}.team: no team {settings.team!r} (declare it in [gateway.teams], in "
            "keys_file's [teams], or over the admin API)"
        )
    return team


def _checked_team(name: str, entry: ManagedTeamEntry, routes: list[str]) -> TeamSettings | None:
    settings = entry.settings()
    problem = team_settings_problem(settings, routes)
    if problem is not None:  # the config changed under it: the team is not used, and said so
        log.error("gateway: team %r of the admin API is not used: %s: %s", name, *problem)
        return None
    return settings


def _managed_tenant(
    name: str,
    entry: ManagedKeyEntry,
    settings: GatewaySettings,
    teams: Mapping[str, Team],
    routes: list[str],
) -> Tenant | None:
    """An admin API key as a tenant, or ``None`` (logged) when the config no longer fits it
    (a route or team it names is gone)."""
    try:
        merged = merge_key_settings(settings.limits, entry.settings())
    except pydantic.ValidationError as exc:
        log.error("gateway: key %r of the admin API is not used: %s", name, exc.errors()[0]["msg"])
        return None
    problem = key_settings_problem(merged, routes)
    if problem is None and merged.team is not None and merged.team not in teams:
        problem = ("team", f"no team {merged.team!r}")
    if problem is not None:
        log.error("gateway: key %r of the admin API is not used: %s: %s", name, *problem)
        return None
    team = teams.get(merged.team) if merged.team is not None else None
    concurrency = merged.max_concurrency or settings.max_concurrency_per_key
    return Tenant(name, merged, concurrency, team, entry.expires_at, "api")


def file_stamp(path: str) -> object:
    """What tells a changed file from the one read before: its modification time, size and
    inode (``None`` when it cannot be read), as an editor's rename or an in-place write
    changes one of them."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
