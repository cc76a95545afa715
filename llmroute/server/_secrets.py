"""The secret strings of resolved providers, to scrub from error text the gateway or
``llmroute bench`` shows (API keys, and the values of headers that carry credentials)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .._config import ResolvedProvider

__all__ = ["is_secret_header", "provider_secrets", "scrub"]

# Headers that carry credentials by name (Azure's api-key, Anthropic's x-api-key, Google's
# x-goog-api-key, a bearer token in Authorization), and any whose name says it does.
_SECRET_NAMES = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "x-goog-api-key", "cookie"}
)
_SECRET_WORDS = re.compile(r"auth|key|token|secret|passw|cookie|signature|credential", re.I)
_MIN_LENGTH = 4  # shorter values are not scrubbed (they would mangle ordinary text)


def is_secret_header(name: str) -> bool:
    """Whether a header of this name carries a credential."""
    return name.lower() in _SECRET_NAMES or bool(_SECRET_WORDS.search(name))


def provider_secrets(providers: Iterable[ResolvedProvider]) -> list[str]:
    """The providers' API keys and secret header values (also the credential after a scheme,
    ``Bearer <token>``'s token), longest first, so a longer secret is replaced before a part."""
    found: set[str] = set()
    for provider in providers:
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


def scrub(text: str, secrets: Iterable[str], replacement: str) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced."""
    for secret in secrets:
        text = text.replace(secret, replacement)
    return text
