"""The gateway's admin API for keys and teams (``/admin/keys``, ``/admin/teams``), authorized
by a key with ``admin = true``.

Keys are made with a secret shown once, in the answer that made (or rotated) them, and stored
only as its SHA-256 digest (:mod:`._keystore`). A key made here has the settings a key of
``keys_file`` has (its limits, ``models``, ``model_limits``, ``team``, ...) and an optional
``expires_at``; a rotation gives it a new value and keeps the former one accepted for the
``overlap`` asked. Keys declared in the config or ``keys_file`` are listed here too but changed
only there (the declared one wins on a name clash). Every answer is JSON; a mistake is OpenAI's
400 naming the field.

=========================  ======================================================
``GET /admin/keys``        every key (names, prefixes, limits, team, expiry; no secret)
``POST /admin/keys``       make a key: ``{"name": ..., <settings>}`` -> 201 with its ``key``
``GET /admin/keys/N``      one key
``PATCH /admin/keys/N``    change its settings (``null`` clears one)
``POST /admin/keys/N/rotate``  a new value; ``{"overlap": "10m"}`` keeps the old one that long
``DELETE /admin/keys/N``   revoke it
``GET /admin/teams``       every team and its keys
``PUT /admin/teams/N``     make or replace a team: ``{<limits>}``
``GET /admin/teams/N``, ``DELETE /admin/teams/N``  one team; remove one no key uses
=========================  ======================================================
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic_core import PydanticCustomError

from ..config import (
    Config,
    GatewaySettings,
    KeySettings,
    ManagedKeyEntry,
    ManagedTeamEntry,
    PreviousDigest,
    TeamSettings,
    describe,
    key_settings_problem,
    merge_key_settings,
    parse_duration,
    team_settings_problem,
    timestamp_input,
)
from ._auth import digest
from ._tenants import Managed, Tenant, Tenants
from ._validate import clipped

__all__ = ["AdminError", "KeysAdmin", "new_secret"]

_SHOWN_FIELD = 40  # characters of an unknown field's name an error shows (the body is the client's)
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SECRET_PREFIX = "llmr-"
_SHOWN = 12  # characters of a key shown as its prefix: "llmr-" and 7 of its 43 random ones
_MAX_OVERLAP = 366 * 86400.0
_KEY_FIELDS = frozenset(KeySettings.model_fields) - {"admin"}
_TEAM_FIELDS = frozenset(TeamSettings.model_fields)


class AdminError(Exception):
    """An admin API answer other than success: its status, message, code and field."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def new_secret() -> tuple[str, str, str]:
    """A new key: its value (``llmr-`` and 43 URL-safe characters, 256 random bits), its
    SHA-256 digest in hex, and its shown prefix."""
    value = _SECRET_PREFIX + secrets.token_urlsafe(32)
    return value, digest(value.encode()).hex(), value[:_SHOWN]


def _invalid(message: str, param: str | None, code: str = "invalid_value") -> AdminError:
    return AdminError(400, message, code, param)


def _validation(exc: pydantic.ValidationError) -> AdminError:
    error = exc.errors()[0]
    param = ".".join(str(part) for part in error["loc"]) or None
    line = describe(exc, "body").split("\n")[0].removeprefix("body: ")
    line = line.replace(": unknown key", ": unknown field")
    return _invalid(f"Invalid request: {line}.", param)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _invalid("The request body must be a JSON object.", None)
    return body


def _name(value: Any, what: str = "name") -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        # Never echoed: it may be a key pasted where its name belongs.
        raise _invalid(
            f"Invalid '{what}': expected letters, digits, '.', '_' and '-' (at most 64).", what
        )
    if value.lower().startswith(("sk-", _SECRET_PREFIX)):
        raise _invalid(f"Invalid '{what}': it looks like a key; name it, e.g. 'web'.", what)
    return value


def _unknown(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for field in body:
        if field not in allowed:
            hint = (
                " (admin keys are declared in the config or keys_file)" if field == "admin" else ""
            )
            shown = clipped(field, _SHOWN_FIELD)
            raise _invalid(f"Invalid request: {shown!r} is not a field here{hint}.", shown)


def _expiry(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(timestamp_input(value))
    except (ValueError, PydanticCustomError) as exc:
        raise _invalid(f"Invalid 'expires_at': {exc}.", "expires_at") from None


def _overlap(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _invalid(
            "Invalid 'overlap': expected a duration such as '10m' or seconds.", "overlap"
        )
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise _invalid(
            "Invalid 'overlap': expected a duration such as '10m' or seconds.", "overlap"
        ) from None
    if not 0 <= seconds <= _MAX_OVERLAP:
        raise _invalid("Invalid 'overlap': expected 0 to 366 days.", "overlap")
    return seconds


@dataclass(frozen=True, slots=True)
class _Context:
    """What a change is checked against: the config, the keys and teams now, and the time."""

    config: Config
    tenants: Tenants
    now: float

    @property
    def gateway(self) -> GatewaySettings:
        return self.config.gateway or GatewaySettings()

    @property
    def routes(self) -> list[str]:
        return [*self.config.models, *self.config.tiered]

    def refuse_declared_team(self, name: str) -> None:
        """409 ``team_declared`` when team ``name`` is the config's or the keys file's."""
        declared = self.tenants.teams.get(name)
        if declared is not None and declared.source != "api":
            raise AdminError(
                409,
                f"Team {name!r} is declared in the config or keys file; change it there.",
                "team_declared",
                "name",
            )


def _settings_view(settings: pydantic.BaseModel) -> dict[str, Any]:
    data = settings.model_dump(exclude_none=True, exclude_defaults=True)
    data.pop("team", None)
    if "budget_usd" in data:
        data["budget_usd"] = format(data["budget_usd"], "f")  # exact, as a string
    return data


def key_view(tenant: Tenant, entry: ManagedKeyEntry | None, now: float) -> dict[str, Any]:
    """A key as the admin API shows it: never its value nor its digest."""
    out: dict[str, Any] = {
        "object": "key",
        "name": tenant.name,
        "source": tenant.source,
        "prefix": entry.prefix if entry is not None else None,
        "team": tenant.team.name if tenant.team is not None else None,
        "expires_at": tenant.expires_at,
        "expired": tenant.expires_at is not None and now >= tenant.expires_at,
        "limits": _settings_view(tenant.settings),
    }
    if entry is not None:
        out["created_at"] = entry.created_at
        out["updated_at"] = entry.updated_at
        out["previous_until"] = [p.until for p in entry.previous if p.until > now]
    return out


class KeysAdmin:
    """The admin API's operations (see the module's docstring). ``tenants`` gives the keys
    now; ``store`` keeps the API's own; ``applied`` is called with what the store holds after
    each change, to accept it in this replica at once."""

    def __init__(
        self,
        config: Config,
        store: Any,
        tenants: Callable[[], Tenants],
        clock: Callable[[], float],
        applied: Callable[[Managed], None],
    ) -> None:
        self._config = config
        self.store = store
        self._tenants = tenants
        self._clock = clock
        self._applied = applied

    async def _change(self, edit: Callable[[Managed], tuple[Managed, Any]]) -> tuple[Managed, Any]:
        if self.store is None:
            raise AdminError(
                501,
                'This gateway has no key store: give it limits_backend = "redis" (keys kept '
                "in Redis) or gateway.keys_file (keys kept in that file).",
                "no_key_store",
            )
        return await self.store.change(edit)

    def _context(self) -> _Context:
        return _Context(self._config, self._tenants(), self._clock())

    async def handle(self, method: str, path: str, body: Callable[[], Any]) -> tuple[int, Any]:
        """The answer to ``method path``: its status and JSON body; ``body()`` reads the
        request's JSON (for the methods that take one). Raises :class:`AdminError`."""
        parts = path.strip("/").split("/")  # admin, keys|teams, [name], [rotate]
        kind, rest = parts[1], parts[2:]
        if kind == "keys":
            return await self._keys(method, rest, body)
        return await self._teams(method, rest, body)

    # -- keys ---------------------------------------------------------------------------------

    async def _keys(self, method: str, rest: list[str], body: Callable[[], Any]) -> tuple[int, Any]:
        if not rest:
            if method == "GET":
                return 200, await self.list_keys()
            if method == "POST":
                return 201, await self.create(_object(await body()))
            raise _method(method, "GET, POST")
        name = rest[0]
        if len(rest) == 2 and rest[1] == "rotate":
            if method != "POST":
                raise _method(method, "POST")
            return 200, await self.rotate(name, _object(await body()))
        if len(rest) != 1:
            raise AdminError(404, "Unknown admin URL.", "not_found")
        if method == "GET":
            return 200, self.show(name)
        if method == "PATCH":
            return 200, await self.update(name, _object(await body()))
        if method == "DELETE":
            return 200, await self.revoke(name)
        raise _method(method, "GET, PATCH, DELETE")

    async def list_keys(self) -> dict[str, Any]:
        tenants, now = self._tenants(), self._clock()
        data = [
            key_view(t, tenants.managed.keys.get(n) if t.source == "api" else None, now)
            for n, t in sorted(tenants.by_name.items())
        ]
        return {"object": "list", "data": data}

    def show(self, name: str) -> dict[str, Any]:
        tenants = self._tenants()
        tenant = tenants.by_name.get(name)
        if tenant is None:
            raise AdminError(404, "No key of that name.", "key_not_found", "name")
        entry = tenants.managed.keys.get(name) if tenant.source == "api" else None
        return key_view(tenant, entry, self._clock())

    def _key_settings(self, context: _Context, data: Mapping[str, Any]) -> KeySettings:
        """The settings given, checked alone and merged with ``[gateway.limits]``."""
        try:
            settings = KeySettings.model_validate(data)
        except pydantic.ValidationError as exc:
            raise _validation(exc) from None
        merged = merge_key_settings(context.gateway.limits, settings)
        problem = key_settings_problem(merged, context.routes)
        if problem is not None:
            raise _invalid(f"Invalid '{problem[0]}': {problem[1]}.", problem[0])
        return settings

    def _check_team(self, context: _Context, managed: Managed, team: str | None) -> None:
        if team is not None and team not in context.tenants.teams and team not in managed.teams:
            raise _invalid(
                f"Invalid 'team': no team {team!r} (make it with PUT /admin/teams/{team}).", "team"
            )

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if "name" not in body:
            raise _invalid("Missing required parameter: 'name'.", "name", "missing")
        name = _name(body["name"])
        fields = {k: v for k, v in body.items() if k != "name"}
        _unknown(fields, _KEY_FIELDS | {"expires_at"})
        context = self._context()
        expires_at = _expiry(fields.pop("expires_at", None))
        settings = self._key_settings(context, fields)
        value, sha256, prefix = new_secret()

        def edit(managed: Managed) -> tuple[Managed, ManagedKeyEntry]:
            if name in managed.keys or name in context.tenants.by_name:
                raise AdminError(409, f"A key named {name!r} exists already.", "key_exists", "name")
            self._check_team(context, managed, settings.team)
            entry = ManagedKeyEntry.model_validate(
                settings.model_dump(exclude_unset=True)
                | {"sha256": sha256, "prefix": prefix, "created_at": context.now}
                | {"updated_at": context.now}
                | ({"expires_at": expires_at} if expires_at is not None else {})
            )
            return Managed({**managed.keys, name: entry}, managed.teams), entry

        stored, entry = await self._change(edit)
        self._applied(stored)
        return self._shown(name, entry, context.now) | {"key": value}

    def _shown(self, name: str, entry: ManagedKeyEntry, now: float) -> dict[str, Any]:
        tenant = self._tenants().by_name.get(name)
        if tenant is None:  # the config does not fit it (logged): shown from the record
            settings = entry.settings()
            tenant = Tenant(
                name, settings, settings.max_concurrency or 1, None, entry.expires_at, "api"
            )
        return key_view(tenant, entry, now)

    def _own(self, context: _Context, managed: Managed, name: str) -> ManagedKeyEntry:
        """The API's own key ``name`` (404 when none, 409 when it is a declared one)."""
        entry = managed.keys.get(name)
        declared = context.tenants.by_name.get(name)
        if declared is not None and declared.source != "api":
            where = "keys file" if declared.source == "file" else "config"
            raise AdminError(
                409,
                f"Key {name!r} is declared in the {where}; change it there.",
                "key_declared",
                "name",
            )
        if entry is None:
            raise AdminError(404, "No key of that name.", "key_not_found", "name")
        return entry

    async def update(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        _unknown(body, _KEY_FIELDS | {"expires_at"})
        context = self._context()
        fields = dict(body)
        expiry_given = "expires_at" in fields
        expires_at = _expiry(fields.pop("expires_at", None))

        def edit(managed: Managed) -> tuple[Managed, ManagedKeyEntry]:
            entry = self._own(context, managed, name)
            data = entry.settings().model_dump(exclude_unset=True)
            for field, value in fields.items():
                if value is None:
                    data.pop(field, None)
                else:
                    data[field] = value
            settings = self._key_settings(context, data)
            self._check_team(context, managed, settings.team)
            record = entry.model_dump(
                exclude_unset=True,
                include={"sha256", "prefix", "previous", "created_at", "expires_at"},
            )
            if expiry_given:
                record.pop("expires_at", None)
                if expires_at is not None:
                    record["expires_at"] = expires_at
            updated = ManagedKeyEntry.model_validate(
                settings.model_dump(exclude_unset=True) | record | {"updated_at": context.now}
            )
            return Managed({**managed.keys, name: updated}, managed.teams), updated

        stored, entry = await self._change(edit)
        self._applied(stored)
        return self._shown(name, entry, context.now)

    async def rotate(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        _unknown(body, frozenset({"overlap"}))
        overlap = _overlap(body.get("overlap"))
        context = self._context()
        value, sha256, prefix = new_secret()

        def edit(managed: Managed) -> tuple[Managed, ManagedKeyEntry]:
            entry = self._own(context, managed, name)
            kept = [p for p in entry.previous if p.until > context.now]
            if overlap > 0:
                kept.append(PreviousDigest(sha256=entry.sha256, until=context.now + overlap))
            rotated = ManagedKeyEntry.model_validate(
                entry.model_dump(exclude_unset=True)
                | {"sha256": sha256, "prefix": prefix, "updated_at": context.now}
                | {"previous": [p.model_dump() for p in kept]}
            )
            return Managed({**managed.keys, name: rotated}, managed.teams), rotated

        stored, entry = await self._change(edit)
        self._applied(stored)
        shown = self._shown(name, entry, context.now)
        return shown | {
            "key": value,
            "previous_valid_until": context.now + overlap if overlap else None,
        }

    async def revoke(self, name: str) -> dict[str, Any]:
        context = self._context()

        def edit(managed: Managed) -> tuple[Managed, None]:
            self._own(context, managed, name)
            return Managed(
                {n: e for n, e in managed.keys.items() if n != name}, managed.teams
            ), None

        stored, _ = await self._change(edit)
        self._applied(stored)
        return {"object": "key", "name": name, "revoked": True}

    # -- teams --------------------------------------------------------------------------------

    async def _teams(
        self, method: str, rest: list[str], body: Callable[[], Any]
    ) -> tuple[int, Any]:
        if not rest:
            if method == "GET":
                return 200, self.list_teams()
            raise _method(method, "GET")
        if len(rest) != 1:
            raise AdminError(404, "Unknown admin URL.", "not_found")
        name = rest[0]
        if method == "GET":
            return 200, self.show_team(name)
        if method == "PUT":
            return 200, await self.put_team(_name(name, "team"), _object(await body()))
        if method == "DELETE":
            return 200, await self.delete_team(name)
        raise _method(method, "GET, PUT, DELETE")

    def _team_view(self, tenants: Tenants, name: str) -> dict[str, Any]:
        team = tenants.teams[name]
        members = sorted(
            n for n, t in tenants.by_name.items() if t.team is not None and t.team.name == name
        )
        return {
            "object": "team",
            "name": name,
            "source": team.source,
            "limits": _settings_view(team.settings),
            "keys": members,
        }

    def list_teams(self) -> dict[str, Any]:
        tenants = self._tenants()
        return {
            "object": "list",
            "data": [self._team_view(tenants, n) for n in sorted(tenants.teams)],
        }

    def show_team(self, name: str) -> dict[str, Any]:
        tenants = self._tenants()
        if name not in tenants.teams:
            raise AdminError(404, "No team of that name.", "team_not_found", "name")
        return self._team_view(tenants, name)

    async def put_team(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        _unknown(body, _TEAM_FIELDS)
        context = self._context()
        try:
            settings = TeamSettings.model_validate(body)
        except pydantic.ValidationError as exc:
            raise _validation(exc) from None
        problem = team_settings_problem(settings, context.routes)
        if problem is not None:
            raise _invalid(f"Invalid '{problem[0]}': {problem[1]}.", problem[0])

        def edit(managed: Managed) -> tuple[Managed, None]:
            context.refuse_declared_team(name)
            before = managed.teams.get(name)
            created = before.created_at if before is not None else context.now
            entry = ManagedTeamEntry.model_validate(
                settings.model_dump(exclude_unset=True)
                | {"created_at": created, "updated_at": context.now}
            )
            return Managed(managed.keys, {**managed.teams, name: entry}), None

        stored, _ = await self._change(edit)
        self._applied(stored)
        return self._team_view(self._tenants(), name)

    async def delete_team(self, name: str) -> dict[str, Any]:
        context = self._context()

        def edit(managed: Managed) -> tuple[Managed, None]:
            context.refuse_declared_team(name)
            if name not in managed.teams:
                raise AdminError(404, "No team of that name.", "team_not_found", "name")
            users = sorted(n for n, t in context.tenants.by_name.items() if t.settings.team == name)
            users += sorted(n for n, e in managed.keys.items() if e.team == name and n not in users)
            if users:
                raise AdminError(
                    409,
                    f"Team {name!r} has keys ({', '.join(users)}): move or revoke them first.",
                    "team_in_use",
                    "name",
                )
            return Managed(
                managed.keys, {n: t for n, t in managed.teams.items() if n != name}
            ), None

        stored, _ = await self._change(edit)
        self._applied(stored)
        return {"object": "team", "name": name, "deleted": True}


def _method(method: str, allowed: str) -> AdminError:
    error = AdminError(405, f"Method {method} is not allowed here; use {allowed}.")
    error.allow = allowed  # type: ignore[attr-defined]
    return error
