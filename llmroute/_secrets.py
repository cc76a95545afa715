"""The secret strings of resolved providers, to scrub from error text the gateway or
``llmroute bench`` shows (API keys, and the values of headers that carry credentials)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .config import SIMULATOR, ResolvedProvider

__all__ = ["is_secret_header", "masked_forms", "provider_secrets", "scrub"]

# Headers that carry credentials by name (Azure's api-key, Anthropic's x-api-key, Google's
# x-goog-api-key, a bearer token in Authorization), and any whose name says it does.
_SECRET_NAMES = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "x-goog-api-key", "cookie"}
)
_SECRET_WORDS = re.compile(r"auth|key|token|secret|passw|cookie|signature|credential", re.I)
_MIN_LENGTH = 4  # shorter values are not scrubbed (they would mangle ordinary text)
_MIN_MASKED = 12  # a secret's masked forms are looked for when it is at least this long
# How vendors mask a key they echo: a run of stars (bullets, dots), three or more dots or an
# ellipsis, or x's, between a head of the key and its last 4 characters (``sk-...abcd``,
# ``sk-proj-********wxyz``, ``sk-a…wxyz``), or after the head alone (``sk-pr****``).
_MASK = r"(?:[*\u2022\u00b7]{2,}|\.{3,}|\u2026|[xX]{4,})"


def is_secret_header(name: str) -> bool:
    """Whether a header of this name carries a credential."""
    return name.lower() in _SECRET_NAMES or bool(_SECRET_WORDS.search(name))


def provider_secrets(providers: Iterable[ResolvedProvider]) -> list[str]:
    """The providers' API keys and secret header values (also the credential after a scheme,
    ``Bearer <token>``'s token), longest first, so a longer secret is replaced before a part."""
    found: set[str] = set()
    for provider in providers:
        if provider.kind == SIMULATOR:
            continue  # a simulated provider's key is a placeholder, no secret
        if provider.api_key:
            found.add(provider.api_key)
        for name, value in provider.headers.items():
            if not is_secret_header(name):
                continue
            value = value.strip()
            found.add(value)
            scheme, _, credential = value.partition(" ")
            if credential.strip() and scheme.isalpha():
                found.add(credential.strip())
    return sorted((s for s in found if len(s) >= _MIN_LENGTH), key=len, reverse=True)


def masked_forms(secrets: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern matching the masked forms of ``secrets`` (those of at least 12 characters)
    as vendors echo them in a 401's message: the key's first characters and/or a mask, then its
    last 4 characters (``sk-...abcd``, ``sk-proj-****abcd``, ``****abcd``), or its first 4 and a
    mask (``sk-p****``). ``None`` when no secret is long enough."""
    forms: set[str] = set()
    for secret in secrets:
        if len(secret) < _MIN_MASKED:
            continue
        tail = re.escape(secret[-4:])
        forms.add(rf"[\w-]*{_MASK}[\w-]{{0,4}}?{tail}(?![A-Za-z0-9])")
        forms.add(rf"{re.escape(secret[:4])}[\w-]*?{_MASK}")
    if not forms:
        return None
    return re.compile("|".join(sorted(forms, key=len, reverse=True)))


def scrub(
    text: str,
    secrets: Iterable[str],
    replacement: str,
    masked: re.Pattern[str] | None = None,
) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced, then what ``masked``
    (:func:`masked_forms`) matches."""
    for secret in secrets:
        text = text.replace(secret, replacement)
    if masked is not None:
        text = masked.sub(replacement, text)
    return text
