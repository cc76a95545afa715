"""The secret strings of resolved providers, to scrub from error text the gateway or
``llmroute bench`` shows (API keys, and the values of headers that carry credentials)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .config import SIMULATOR, ResolvedProvider

__all__ = ["MaskedForms", "is_secret_header", "masked_forms", "provider_secrets", "scrub"]

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


class MaskedForms:
    r"""The masked forms of some secrets (:func:`masked_forms`), found in work linear in the
    text: a key's head then a mask (``sk-p****``) with at most 64 characters between them, and
    a mask then a key's last 4 characters (``sk-...abcd``, ``****abcd``), matched on the text
    read backwards so that each match starts at the 4 characters it ends with. Read forwards,
    ``[\w-]*`` then a mask such as ``[xX]{4,}`` made a run of n x's take n**3 steps where no
    key's tail followed: 1,000 x's in an error held the event loop 10 s (a client's 5,000-
    character unknown URL echoed in a 404, minutes)."""

    def __init__(self, heads: re.Pattern[str] | None, tails: re.Pattern[str] | None) -> None:
        self._heads = heads
        self._tails = tails

    def sub(self, replacement: str, text: str) -> str:
        """``text`` with every masked form replaced by ``replacement`` (taken literally)."""
        if self._tails is not None:
            backwards = replacement[::-1]
            text = self._tails.sub(lambda _: backwards, text[::-1])[::-1]
        if self._heads is not None:
            text = self._heads.sub(lambda _: replacement, text)
        return text


def masked_forms(secrets: Iterable[str]) -> MaskedForms | None:
    """What matches the masked forms of ``secrets`` (those of at least 12 characters) as
    vendors echo them in a 401's message: the key's first characters and/or a mask, then its
    last 4 characters (``sk-...abcd``, ``sk-proj-****abcd``, ``****abcd``), or its first 4 and a
    mask (``sk-p****``). ``None`` when no secret is long enough."""
    heads: set[str] = set()
    tails: set[str] = set()
    for secret in secrets:
        if len(secret) < _MIN_MASKED:
            continue
        # Backwards: the tail reversed, up to 4 characters, a mask, then the key's head.
        tails.add(rf"(?<![A-Za-z0-9]){re.escape(secret[-4:][::-1])}[\w-]{{0,4}}?{_MASK}[\w-]*")
        heads.add(rf"{re.escape(secret[:4])}[\w-]{{0,64}}?{_MASK}")
    if not tails:
        return None
    return MaskedForms(_either(heads), _either(tails))


def _either(forms: set[str]) -> re.Pattern[str]:
    return re.compile("|".join(sorted(forms, key=len, reverse=True)))


def scrub(
    text: str,
    secrets: Iterable[str],
    replacement: str,
    masked: MaskedForms | None = None,
) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced, then what ``masked``
    (:func:`masked_forms`) matches."""
    for secret in secrets:
        text = text.replace(secret, replacement)
    if masked is not None:
        text = masked.sub(replacement, text)
    return text
