"""The gateway's API keys: read from the environment, matched in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

from ..config import ConfigError, GatewaySettings

__all__ = ["KeyRing", "bearer_digest", "digest"]

_BEARER = "bearer "


def _usable(key: str) -> bool:
    """Whether a client can send ``key`` in an HTTP header: printable ASCII (a header's bytes
    reach the app decoded as latin-1, so a UTF-8 key would never match)."""
    return key.isascii() and key.isprintable()


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


digest = _digest


def bearer_digest(authorization: str | None) -> tuple[bytes, bool]:
    """The SHA-256 digest of the key an ``Authorization: Bearer <key>`` header carries, and
    whether it carries one (the digest of nothing otherwise)."""
    given = b""
    if authorization is not None and authorization[: len(_BEARER)].lower() == _BEARER:
        given = authorization[len(_BEARER) :].strip().encode("utf-8", "surrogateescape")
    return _digest(given), bool(given)


def read_key(table: str, name: str, variable: str, environ: Mapping[str, str]) -> str:
    """The key in ``environ[variable]``; :class:`ConfigError` naming ``table.name`` and the
    variable (never a value) when it is unset, empty, or not printable ASCII."""
    value = environ.get(variable, "").strip()
    if not value:
        raise ConfigError(
            f"{table}.{name}: the environment variable {variable} is not set "
            "(it holds the gateway key clients send as 'Authorization: Bearer <key>')"
        )
    if not _usable(value):
        raise ConfigError(
            f"{table}.{name}: the environment variable {variable} holds characters "
            "other than printable ASCII; a client cannot send such a key in an HTTP "
            "header (use letters, digits and punctuation)"
        )
    return value


class KeyRing:
    """The gateway's keys by name. Only SHA-256 digests are kept, so a key's length and bytes
    never steer a comparison, and the repr shows names only."""

    __slots__ = ("_digests",)

    def __init__(
        self,
        keys: Mapping[str, str],
        digests: Mapping[str, bytes] | None = None,
        *,
        required: bool = True,
    ) -> None:
        """``keys``: name -> the key itself (each non-empty printable ASCII); ``digests``:
        name -> a key's SHA-256 digest, for keys given only so (``keys_file``'s ``sha256``).
        ``required``: at least one key (else the admin API's keys may be the only ones)."""
        if required and not keys and not digests:
            raise ValueError("a gateway needs at least one key")
        for name, key in keys.items():
            if not key or not _usable(key):  # the key is never shown
                raise ValueError(f"gateway key {name!r}: empty or not printable ASCII")
        self._digests = [(name, _digest(key.encode())) for name, key in keys.items()]
        for name, digest in (digests or {}).items():
            if len(digest) != hashlib.sha256().digest_size:
                raise ValueError(f"gateway key {name!r}: a SHA-256 digest is 32 bytes")
            self._digests.append((name, digest))

    def digest(self, name: str) -> bytes | None:
        """The digest of the key ``name`` (to tell a key that changed on a reload)."""
        return next((digest for own, digest in self._digests if own == name), None)

    @classmethod
    def from_settings(
        cls,
        settings: GatewaySettings,
        environ: Mapping[str, str] = os.environ,
        digests: Mapping[str, bytes] | None = None,
        more: Mapping[str, str] | None = None,
        where: str = "gateway.keys",
        required: bool = True,
    ) -> KeyRing:
        """The keys ``settings.keys`` names, read from ``environ``, and ``more`` (name ->
        variable, from ``keys_file``, named ``where`` in errors) and ``digests``;
        :class:`ConfigError` naming the variable (never a value) when one is unset, empty, or
        not printable ASCII."""
        keys: dict[str, str] = {}
        for table, variables in (("gateway.keys", settings.keys), (where, more or {})):
            for name, variable in variables.items():
                keys[name] = read_key(table, name, variable, environ)
        if required and not keys and not digests:
            raise ConfigError(
                "gateway: no key (gateway.keys and keys_file name none): a gateway answers "
                "only requests with one of its keys"
            )
        return cls(keys, digests, required=required)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._digests]

    def match(self, authorization: str | None) -> str | None:
        """The name of the key an ``Authorization: Bearer <key>`` header carries, or ``None``.

        Every configured key is compared (``hmac.compare_digest`` over digests), whichever
        matches, so the time taken does not say which key, or how much of one, matched.
        """
        candidate, given = bearer_digest(authorization)
        return self.match_digest(candidate, given)

    def match_digest(self, candidate: bytes, given: bool = True) -> str | None:
        """The name of the key whose digest is ``candidate`` (``given``: a key was sent),
        every configured key compared, as :meth:`match` does."""
        found: str | None = None
        for name, digest in self._digests:
            equal = hmac.compare_digest(candidate, digest)
            if equal and found is None and given:
                found = name
        return found

    def __repr__(self) -> str:
        return f"KeyRing(names={self.names!r})"
