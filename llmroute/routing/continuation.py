"""Continuing a broken answer on another target: the rules, without the race.

When the winner's stream breaks after its first token, the engine races the route's
continuation targets (those whose catalog entry has a ``continuation``) for the rest of the
answer, with the text so far as a trailing assistant message. This module says whether an
answer may be continued and why not, in which order the targets are asked, what the
continuing request's body is, and how the continuing stream joins the text (:mod:`.splice`);
:func:`~.answering.continue_answer` runs the race. A broken answer that cannot be continued
ends in :class:`~llmroute.StreamInterrupted` with the text so far.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import httpx

from .._errors import APIError, StreamInterrupted
from .policies import RouteView
from .route import Route, RouteTarget
from .splice import Splice

__all__ = [
    "continuation_body",
    "continuation_order",
    "interrupted",
    "no_continuation_target",
    "not_continuable",
    "splice_for",
]


def continuation_body(
    body: dict[str, Any], target: RouteTarget, prefix: str, delivered: int
) -> None:
    """Make ``body`` (the target's own copy) ask ``target`` for the rest of an answer whose
    text so far is ``prefix``: the vendor's assistant-prefix message and fields (the
    catalog's), and what is left of the caller's limit after the ``delivered`` tokens."""
    continuation = target.continuation
    if continuation is None:
        return
    message = {"role": "assistant", "content": prefix, **continuation.message}
    body["messages"] = [*body["messages"], message]
    body.update(continuation.body)
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int):
            body[key] = max(1, body[key] - delivered)


def not_continuable(
    route: Route, *, continued: int, continuable: bool, reasoned: bool, partial: str
) -> str | None:
    """Why a broken answer cannot be continued, or ``None`` if it can: continuation is off,
    it broke while the model reasoned (no text yet), it is not plain text (tools, several
    choices, the Responses API) or it was continued ``max_continuations`` times already."""
    if continued >= route.max_continuations:
        continuable = False
    reasoning = continuable and reasoned and not partial
    if route.continue_on_break and continuable and not reasoning:
        return None
    if not route.continue_on_break:
        return "continuation is off"
    if reasoning:
        return "it broke while the model was reasoning, before its text began"
    return "the answer is not plain text or was continued too often"


def continuation_order(
    route: Route, view: RouteView, *, left_out: Collection[str], broken: Sequence[str]
) -> tuple[str, ...]:
    """The targets that may continue the answer, best first: those that have not broken
    in this answer, then available ones, then by predicted median TTFT."""
    candidates = [
        t.name for t in route.targets if t.continuation is not None and t.name not in left_out
    ]
    return tuple(
        sorted(
            candidates,
            key=lambda t: (t in broken, not view.available(t), view.predict(t, 0.5)),
        )
    )


def no_continuation_target(route: Route, mismatched: Collection[str]) -> str:
    """Why no target was left to continue the answer."""
    if mismatched:
        return (
            f"the continuation on {', '.join(sorted(mismatched))} did not begin with "
            "the text so far"
        )
    return f"no target of route {route.name!r} supports continuation"


def interrupted(
    broke: str, why: str, request: httpx.Request, partial: str, failure: APIError
) -> StreamInterrupted:
    """The error of an answer that broke and was not continued (raise it from ``failure``)."""
    return StreamInterrupted(
        f"{broke}; {why}. The text so far is in .partial_text.",
        request,
        partial_text=partial,
        cause=failure.__cause__ or failure,
    )


def splice_for(target: RouteTarget, request: httpx.Request, text: Sequence[str]) -> Splice:
    """The splice of a continuing stream from ``target``: its reasoning dropped, and the
    text so far stripped from its start where its vendor echoes the prefix."""
    continuation = target.continuation
    echo = "".join(text) if continuation and continuation.echoes_prefix else ""
    return Splice(echo, request=request, target=target.name)
