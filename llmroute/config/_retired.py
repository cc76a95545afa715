"""Keys a config may still set that no longer do anything. Each is dropped with a warning that
names the file and the key and says it can be removed, never an error: an old config loads."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ._messages import dotted

__all__ = ["RETIRED", "drop_retired"]

log = logging.getLogger("llmroute")

RETIRED: dict[tuple[str, ...], str] = {
    (
        "providers",
        "*",
        "docs",
    ): "the catalog's link to the vendor's documentation; nothing reads it",
    ("providers", "*", "prompt_caching"): (
        "whether the vendor caches prompts by itself is the catalog's note; no routing reads it"
    ),
}
"""Where a retired key sits (``"*"``: any table's name) -> why it has no effect."""


def drop_retired(data: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """``data`` without the :data:`RETIRED` keys it sets, each logged as a warning."""
    for path, why in RETIRED.items():
        data = _drop(data, path, (), source, why)
    return data


def _drop(table: Any, path: tuple[str, ...], where: tuple[str, ...], source: str, why: str) -> Any:
    if not isinstance(table, Mapping):
        return table
    head, rest = path[0], path[1:]
    names = [name for name in table if head in ("*", name)]
    if not names:
        return table
    if not rest:
        for name in names:
            log.warning(
                "%s: %s has no effect and can be removed (%s)",
                source,
                dotted((*where, name)),
                why,
            )
        return {key: value for key, value in table.items() if key not in names}
    changed = {name: _drop(table[name], rest, (*where, name), source, why) for name in names}
    return {**table, **changed}
