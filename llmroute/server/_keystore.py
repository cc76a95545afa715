"""Where the admin API keeps the keys and teams it makes: in Redis, shared by every replica at
once (:class:`RedisKeyStore`), or, without Redis, in ``keys_file`` itself, as
``[api_keys.<name>]`` and ``[api_teams.<name>]`` tables after a marker line
(:class:`FileKeyStore`; what is above the marker, the operator's own, is never rewritten).

A store holds a key's SHA-256 digest, never the key. Every change is read-check-write under a
lock (Redis: ``WATCH`` on the records and their version counter; the file: ``flock`` on a lock
file beside it, then an atomic rename), so two replicas changing keys at once never lose one
of the changes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, Protocol, TypeVar

import anyio.to_thread
import pydantic

from .._redis import RedisCaller, RedisConnection
from ..config import ManagedKeyEntry, ManagedTeamEntry
from ._tenants import Managed, file_stamp

__all__ = [
    "MARKER",
    "FileKeyStore",
    "KeyStore",
    "RedisKeyStore",
    "StoreConflict",
    "StoreUnavailable",
    "render_block",
]

log = logging.getLogger("llmroute.server")

T = TypeVar("T")

MARKER = (
    "# --- Keys and teams of the gateway's admin API (llmroute keys). The gateway rewrites "
    "everything below this line; edit above it. ---"
)
_TRIES = 20  # a change retried when another replica's change came first


class StoreUnavailable(Exception):
    """The store cannot be read or written now (Redis unreachable, the file not writable)."""


class StoreConflict(Exception):
    """Another change kept coming first (``_TRIES`` times): try again."""


class KeyStore(Protocol):
    async def load(self) -> Managed:
        """Every key and team the admin API made, and the store's version."""
        ...

    async def version(self) -> object:
        """What changes whenever a key or team does (cheap: read on every sync)."""
        ...

    async def change(self, edit: Callable[[Managed], tuple[Managed, T]]) -> tuple[Managed, T]:
        """Apply ``edit`` (the records now -> the records to store, and a result) atomically;
        ``edit`` may raise to change nothing. Returns what was stored and ``edit``'s result."""
        ...

    async def aclose(self) -> None: ...


def _parse(kind: type[pydantic.BaseModel], raw: Mapping[Any, Any], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else str(name)
        try:
            data = json.loads(value) if isinstance(value, bytes | str) else value
            out[name] = kind.model_validate(data)
        except (ValueError, pydantic.ValidationError) as exc:  # never the record: a digest
            log.error(
                "gateway: %s %r in the key store is unreadable and not used: %s",
                what,
                name,
                type(exc).__name__,
            )
    return out


def _dump(entry: pydantic.BaseModel) -> str:
    return entry.model_dump_json(exclude_unset=True)


class RedisKeyStore:
    """The records in two Redis hashes (``{prefix}:gateway-keys``, ``{prefix}:gateway-teams``:
    name -> JSON) and a version counter (``{prefix}:gateway-keys-version``) every change
    increments, which replicas poll to know when to read them again."""

    def __init__(self, url: str, *, prefix: str, timeout: float) -> None:
        self._redis = RedisConnection(url, timeout=timeout, purpose="the gateway's key store")
        self._calls = RedisCaller(self._redis, {})  # the polls: no worker thread on asyncio
        self._keys = f"{prefix}:gateway-keys"
        self._teams = f"{prefix}:gateway-teams"
        self._version = f"{prefix}:gateway-keys-version"

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        return self._redis.errors

    async def _run(self, call: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(call)
        except self._redis.errors as exc:
            raise StoreUnavailable(
                f"the key store (Redis) cannot be reached: {self._redis.reason(exc)}"
            ) from None

    def _read(self, pipe: Any) -> Managed:
        version, keys, teams = pipe
        return Managed(
            _parse(ManagedKeyEntry, keys, "key"),
            _parse(ManagedTeamEntry, teams, "team"),
            int(version or 0),
        )

    def _load(self) -> Managed:
        pipe = self._redis.client.pipeline(transaction=True)
        pipe.get(self._version).hgetall(self._keys).hgetall(self._teams)
        return self._read(pipe.execute())

    async def load(self) -> Managed:
        return await self._run(self._load)

    def load_now(self) -> Managed:
        """:meth:`load`, blocking (when the gateway starts)."""
        try:
            return self._load()
        except self._redis.errors as exc:
            raise StoreUnavailable(
                f"the key store (Redis) cannot be reached: {self._redis.reason(exc)}"
            ) from None

    async def version(self) -> object:
        key = self._version
        try:
            found = await self._calls.run(lambda client, _: client.get(key))
        except self._redis.errors as exc:
            raise StoreUnavailable(
                f"the key store (Redis) cannot be reached: {self._redis.reason(exc)}"
            ) from None
        return int(found or 0)

    async def change(self, edit: Callable[[Managed], tuple[Managed, T]]) -> tuple[Managed, T]:
        import redis

        def attempt() -> tuple[Managed, T]:
            for _ in range(_TRIES):
                with self._redis.client.pipeline(transaction=True) as pipe:
                    try:
                        pipe.watch(self._version, self._keys, self._teams)
                        before = self._read(
                            (
                                pipe.get(self._version),
                                pipe.hgetall(self._keys),
                                pipe.hgetall(self._teams),
                            )
                        )
                        after, result = edit(before)
                        pipe.multi()
                        self._write(pipe, before, after)
                        pipe.incr(self._version)
                        version = pipe.execute()[-1]
                    except redis.WatchError:
                        continue
                    return Managed(after.keys, after.teams, int(version)), result
            raise StoreConflict("the keys kept changing under this change; try again")

        return await self._run(attempt)

    def _write(self, pipe: Any, before: Managed, after: Managed) -> None:
        for table, old, new in (
            (self._keys, before.keys, after.keys),
            (self._teams, before.teams, after.teams),
        ):
            gone = [name for name in old if name not in new]
            if gone:
                pipe.hdel(table, *gone)
            changed = {
                name: _dump(entry) for name, entry in new.items() if old.get(name) is not entry
            }
            if changed:
                pipe.hset(table, mapping=changed)

    async def aclose(self) -> None:
        await self._calls.aclose()


class FileKeyStore:
    """The records in ``keys_file``, below :data:`MARKER` (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)  # a symlink's target is rewritten, not the link

    async def load(self) -> Managed:
        return await anyio.to_thread.run_sync(self._load)

    def _split(self) -> tuple[str, dict[str, Any]]:
        """The operator's part of the file (all of it without a marker), and the tables of the
        managed part."""
        try:
            with open(self.path, encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            raise StoreUnavailable(f"{self.path}: cannot be read ({exc.strerror})") from None
        head, found, tail = text.partition(MARKER)
        try:
            managed = tomllib.loads(tail) if found else {}
        except tomllib.TOMLDecodeError as exc:
            raise StoreUnavailable(
                f"{self.path}: not valid TOML below the marker ({exc})"
            ) from None
        return head, managed

    def _load(self) -> Managed:
        """The managed part's records (an ``[api_keys]`` table written above the marker by
        hand is the operator's: loaded as a key, never changed by the API)."""
        _, managed = self._split()
        return Managed(
            _parse(ManagedKeyEntry, managed.get("api_keys") or {}, "key"),
            _parse(ManagedTeamEntry, managed.get("api_teams") or {}, "team"),
            file_stamp(self.path),
        )

    async def version(self) -> object:
        return file_stamp(self.path)

    async def change(self, edit: Callable[[Managed], tuple[Managed, T]]) -> tuple[Managed, T]:
        return await anyio.to_thread.run_sync(self._change, edit)

    def _change(self, edit: Callable[[Managed], tuple[Managed, T]]) -> tuple[Managed, T]:
        with self._locked():
            head, _ = self._split()
            after, result = edit(self._load())
            block = render_block(after.keys, after.teams)
            self._write(head.rstrip("\n") + "\n\n" + MARKER + "\n" + block)
        return Managed(after.keys, after.teams, file_stamp(self.path)), result

    @contextmanager
    def _locked(self) -> Any:
        try:
            lock = open(self.path + ".lock", "a")
        except OSError as exc:
            raise StoreUnavailable(
                f"{self.path}: the admin API cannot write beside it ({exc.strerror}); "
                'use Redis (limits_backend = "redis") for a read-only keys file'
            ) from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, text: str) -> None:
        folder = os.path.dirname(self.path)
        try:
            mode = os.stat(self.path).st_mode & 0o777
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".keys-", suffix=".toml")
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, self.path)
        except OSError as exc:
            raise StoreUnavailable(f"{self.path}: cannot be written ({exc.strerror})") from None

    async def aclose(self) -> None:
        return None


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(name: str) -> str:
    return name if _BARE.fullmatch(name) else json.dumps(name)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Decimal):  # a budget in money: exact, as a TOML number
        return format(value, "f")
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} in TOML")


def _table(kind: str, name: str, entry: pydantic.BaseModel) -> Iterable[str]:
    yield f"[{kind}.{_toml_key(name)}]"
    for field, value in entry.model_dump(exclude_unset=True, exclude_none=True).items():
        yield f"{_toml_key(field)} = {_toml_value(value)}"
    yield ""


def render_block(keys: Mapping[str, ManagedKeyEntry], teams: Mapping[str, ManagedTeamEntry]) -> str:
    """The managed part of ``keys_file`` (after :data:`MARKER`)."""
    lines: list[str] = []
    for name in sorted(teams):
        lines += _table("api_teams", name, teams[name])
    for name in sorted(keys):
        lines += _table("api_keys", name, keys[name])
    return "\n".join(lines)
