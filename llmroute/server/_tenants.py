"""The gateway's tenants: each key's name, how it is recognised, and what it may do.

One :class:`Tenants` holds everything read at once — ``gateway.keys`` (keys in environment
variables), ``keys_file`` (more keys, by variable or by SHA-256 digest, with their settings),
``[gateway.limits]`` and ``[gateway.tenants.<name>]`` — and is replaced whole on a reload, so a
request sees one consistent set: a key's ring entry and its limits never come from two reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .._config import Config, GatewaySettings, KeySettings, load_keys_file, merge_key_settings
from ._auth import KeyRing

__all__ = ["Tenant", "Tenants", "file_stamp"]


@dataclass(frozen=True, slots=True)
class Tenant:
    """One key's name and merged settings."""

    name: str
    settings: KeySettings
    concurrency: int
    """Requests in flight it may have."""

    @property
    def limited(self) -> bool:
        """Whether it has a rate limit or a budget to count against."""
        s = self.settings
        return s.rpm is not None or s.tpm is not None or s.budget_tokens is not None

    def may_use(self, model: str) -> bool:
        models = self.settings.models
        return models is None or model in models


class Tenants:
    """The keys and their :class:`Tenant` settings (see the module's docstring)."""

    __slots__ = ("admins", "by_name", "ring", "stamp")

    def __init__(self, ring: KeyRing, by_name: Mapping[str, Tenant], stamp: object = None) -> None:
        self.ring = ring
        self.by_name = dict(by_name)
        self.admins = any(t.settings.admin for t in self.by_name.values())
        """Whether a key is an admin's: then only such keys read what covers every key."""
        self.stamp = stamp
        """What ``keys_file`` looked like when read (:func:`file_stamp`)."""

    @classmethod
    def load(cls, config: Config, environ: Mapping[str, str] = os.environ) -> Tenants:
        """Read every key and its settings; :class:`~llmroute.ConfigError` naming the key and
        the field (never a key) on any mistake."""
        settings = config.gateway or GatewaySettings()
        path = settings.keys_file
        stamp = file_stamp(path) if path is not None else None
        entries = load_keys_file(path, config) if path is not None else {}
        more = {name: e.env for name, e in entries.items() if e.env is not None}
        digests = {
            name: bytes.fromhex(e.sha256) for name, e in entries.items() if e.sha256 is not None
        }
        ring = KeyRing.from_settings(
            settings, environ, digests=digests, more=more, where=f"{path}: keys"
        )
        own = {name: settings.tenants.get(name) for name in settings.keys}
        own |= {name: entry.settings() for name, entry in entries.items()}
        by_name: dict[str, Tenant] = {}
        for name, given in own.items():
            merged = merge_key_settings(settings.limits, given)
            concurrency = merged.max_concurrency or settings.max_concurrency_per_key
            by_name[name] = Tenant(name, merged, concurrency)
        return cls(ring, by_name, stamp)

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    def match(self, authorization: str | None) -> Tenant | None:
        """The tenant whose key an ``Authorization: Bearer <key>`` header carries."""
        name = self.ring.match(authorization)
        return None if name is None else self.by_name[name]

    def revoked_by(self, newer: Tenants) -> set[str]:
        """The names of keys this set has that ``newer`` no longer accepts (gone, or their key
        changed)."""
        return {
            name
            for name in self.by_name
            if name not in newer.by_name or newer.ring.digest(name) != self.ring.digest(name)
        }

    def __repr__(self) -> str:
        return f"Tenants(names={self.names!r})"


def file_stamp(path: str) -> object:
    """What tells a changed file from the one read before: its modification time, size and
    inode (``None`` when it cannot be read), as an editor's rename or an in-place write
    changes one of them."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
