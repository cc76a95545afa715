"""The keys a gateway accepts now and how they change while it runs: ``keys_file`` read again
when it changes (or on :meth:`LiveKeys.reload`, SIGHUP), the admin API's keys and teams kept
in Redis read again when another replica changed them, and each key's cache namespace."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping

import anyio

from ..cache import NAMESPACE_PATTERN
from ..config import Config, ConfigError, GatewaySettings
from ._keystore import FileKeyStore, KeyStore, RedisKeyStore, StoreUnavailable
from ._metrics import GatewayMetrics
from ._tenants import Managed, Tenants, file_stamp

__all__ = ["LiveKeys", "group_namespace", "key_namespace"]

log = logging.getLogger("llmroute.server")


class LiveKeys:
    """The keys accepted now (:attr:`tenants`, replaced whole on a change), where the admin
    API keeps its own (:attr:`store`), and each key's cache namespace. ``revoked`` is told the
    names of the keys a change revoked."""

    def __init__(
        self,
        config: Config,
        environ: Mapping[str, str],
        metrics: GatewayMetrics,
        revoked: Callable[[set[str]], None],
    ) -> None:
        self.config = config
        self.settings = config.gateway or GatewaySettings()
        self._environ = environ
        self._metrics = metrics
        self._revoked = revoked
        self.store, self.managed = _key_store(config)
        self.tenants = Tenants.load(config, environ, self.managed)
        self.namespaces = _namespaces(self.settings, self.tenants.names)
        metrics.keys.set(len(self.tenants.names))

    def reload(self) -> bool:
        """Read the keys again; on a mistake keep them as they were (logged as a sentence).
        Returns whether the keys were replaced."""
        return self._rebuild(counted=True)

    def apply_managed(self, managed: Managed) -> None:
        """The admin API's keys and teams changed (here, or on another replica): accept them
        now."""
        if isinstance(self.store, RedisKeyStore):
            self.managed = managed
        self._rebuild(counted=False)

    def _rebuild(self, *, counted: bool) -> bool:
        try:
            newer = Tenants.load(self.config, self._environ, self.managed)
        except (ConfigError, ValueError) as exc:
            if counted:
                self._metrics.reloads.labels("error").inc()
            log.error("gateway keys not reloaded (the keys before stay): %s", exc)
            return False
        revoked = self.tenants.revoked_by(newer)
        self.tenants = newer
        self.namespaces = _namespaces(self.settings, newer.names)
        if counted:
            self._metrics.reloads.labels("ok").inc()
        self._metrics.keys.set(len(newer.names))
        log.info(
            "gateway keys %s: %d key(s)%s",
            "reloaded" if counted else "changed",
            len(newer.names),
            f"; revoked: {', '.join(sorted(revoked))}" if revoked else "",
        )
        if revoked:
            self._revoked(set(revoked))
        return True

    def revoked_since(self, before: Tenants | None, key: str) -> bool:
        """Whether ``key``, authenticated by the keys ``before``, was revoked by a change since,
        with ``revoked_streams = "cut"`` (its streams in flight were cut then, before it was
        one)."""
        if before is None or before is self.tenants or self.settings.revoked_streams != "cut":
            return False
        return not before.kept(key, self.tenants)

    async def watch_store(self) -> None:
        """With Redis: read the admin API's keys again whenever their version changes (checked
        every ``keys_sync_interval``), so a key made on another replica works here too."""
        store = self.store
        if not isinstance(store, RedisKeyStore):
            return
        down = False
        while True:
            await anyio.sleep(self.settings.keys_sync_interval)
            try:
                known = self.managed.version if self.managed is not None else None
                if await store.version() != known:
                    self.apply_managed(await store.load())
            except StoreUnavailable as exc:
                if not down:
                    log.warning("gateway keys: %s; the keys known stay until it answers", exc)
                down = True
                continue
            if down:
                log.info("gateway keys: the key store answers again")
            down = False

    async def watch_file(self) -> None:
        """Reload when ``keys_file`` changes (checked every ``keys_reload_interval``)."""
        path = self.settings.keys_file
        if path is None:
            return
        while True:
            await anyio.sleep(self.settings.keys_reload_interval)
            if file_stamp(path) != self.tenants.stamp:
                if not self.reload():
                    self.tenants.stamp = file_stamp(path)  # logged once, not every interval


def group_namespace(group: str) -> str:
    """The cache namespace of a ``cache_groups`` group: ``gateway-group.<group>``, or
    ``gateway-group-`` and 40 hex digits of its SHA-256 when too long (no key's namespace can
    be either)."""
    namespace = f"gateway-group.{group}"
    if NAMESPACE_PATTERN.fullmatch(namespace):
        return namespace
    return "gateway-group-" + hashlib.sha256(group.encode()).hexdigest()[:40]


def key_namespace(name: str) -> str:
    """The cache namespace of a gateway key's answers (``cache_namespace_per_key``):
    ``gateway.<name>``, or, for a name too long for a namespace's 64 characters,
    ``gateway-`` and 40 hex digits of its SHA-256 (no ``gateway.<name>`` can be that)."""
    namespace = f"gateway.{name}"
    if NAMESPACE_PATTERN.fullmatch(namespace):
        return namespace
    return "gateway-" + hashlib.sha256(name.encode()).hexdigest()[:40]


def _namespaces(settings: GatewaySettings, names: list[str]) -> dict[str, str]:
    """Each key's cache namespace: its own (``cache_namespace_per_key``), its group's
    (``cache_groups``), or none (every key shares the default namespace)."""
    if not settings.cache_namespace_per_key:
        return {}
    spaces = {name: key_namespace(name) for name in names}
    for group, members in settings.cache_groups.items():
        for name in members:
            spaces[name] = group_namespace(group)
    return spaces


def _key_store(config: Config) -> tuple[KeyStore | None, Managed | None]:
    """Where the admin API keeps its keys (Redis with ``limits_backend = "redis"``, else
    ``keys_file``, else nowhere), and, with Redis, its keys now (none, logged, when it cannot
    be reached: the watch reads them once it answers)."""
    settings = config.gateway or GatewaySettings()
    if settings.limits_backend == "redis":
        redis = config.redis
        store = RedisKeyStore(
            redis.url.get_secret_value(), prefix=redis.prefix, timeout=redis.timeout
        )
        try:
            return store, store.load_now()
        except StoreUnavailable as exc:
            log.warning("gateway keys: %s; the admin API's keys are read once it answers", exc)
            return store, Managed(version=-1)
    if settings.keys_file is not None:
        return FileKeyStore(settings.keys_file), None
    return None, None
