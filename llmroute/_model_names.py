"""Model names that are not routes: a near miss of one is a typo, caught before any request.

The client calls :func:`check_model_name` with the name a call asked for, the route names and
the config's ``unknown_models`` setting, before anything leaves the machine. The rule is pure
(no I/O), so it is tested on its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Literal

from ._errors import UnknownModelError

__all__ = ["UnknownModels", "check_model_name", "edit_distance", "suggest_route"]

UnknownModels = Literal["suggest", "default", "error"]
"""What a model name that is not a route does: ``suggest`` (a near miss of a route raises, any
other name goes to the default provider), ``default`` (every such name goes there, as with
openai), ``error`` (every such name raises)."""


def edit_distance(a: str, b: str, limit: int) -> int:
    """The optimal-string-alignment distance of ``a`` and ``b`` (insertions, deletions,
    substitutions and swaps of two adjacent characters, each 1), or ``limit + 1`` once it is
    known to exceed ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] | None = None
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(current[j - 1] + 1, row[j] + 1, row[j - 1] + cost)
            if (
                before is not None
                and i > 1
                and j > 1
                and a[i - 1] == b[j - 2]
                and a[i - 2] == b[j - 1]
            ):
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before, row = row, current
    return min(row[-1], limit + 1)


def _allowed(route: str) -> int:
    """Edits a near miss of ``route`` may have: 1 up to 5 characters, 2 beyond."""
    return 1 if len(route) <= 5 else 2


def suggest_route(name: str, routes: Iterable[str]) -> str | None:
    """The route ``name`` is most likely a typo of, or ``None``.

    ``name`` is a near miss of a route when it differs only in letter case, or by at most 1 edit
    (routes of up to 5 characters) or 2 edits (longer routes), a swap of two adjacent characters
    counting as one: ``"caht"`` and ``"Chat"`` for ``"chat"``. The closest route wins, then the
    first. A name that is a route is not a near miss of another.
    """
    names = list(routes)
    if name in names:
        return None
    best: tuple[int, str] | None = None
    folded = name.casefold()
    for route in names:
        limit = _allowed(route)
        distance = 0 if folded == route.casefold() else edit_distance(name, route, limit)
        if distance <= limit and (best is None or distance < best[0]):
            best = (distance, route)
    return None if best is None else best[1]


def check_model_name(
    name: str, routes: Collection[str], unknown_models: UnknownModels = "suggest"
) -> None:
    """Raise :class:`UnknownModelError` when ``name`` must not be sent as it is.

    A route passes. With ``suggest`` (the default) a near miss of a route raises ("did you mean
    'chat'?") and any other name passes (to the default provider); with ``default`` every name
    passes; with ``error`` every name that is not a route raises. The message names the routes.
    """
    if name in routes or unknown_models == "default":
        return
    listed = sorted(routes)
    known = ", ".join(repr(r) for r in listed) or "(none)"
    suggestion = suggest_route(name, listed)
    if suggestion is not None:
        raise UnknownModelError(
            f"model {name!r} is not a route: did you mean {suggestion!r}? The routes are: {known}. "
            '(A name meant for the default provider: set unknown_models = "default" in the '
            "config.)",
            model=name,
            routes=listed,
            suggestion=suggestion,
        )
    if unknown_models == "error":
        raise UnknownModelError(
            f'model {name!r} is not a route, and the config sets unknown_models = "error": '
            f"the routes are: {known}",
            model=name,
            routes=listed,
            suggestion=None,
        )
