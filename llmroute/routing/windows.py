"""Context windows: which targets a request is sent to, by its size, and where a context-length
error may go next. Pure functions of the targets' declared windows and the request.

A request needs room for its prompt and for the answer it asks for (``max_tokens``,
``max_completion_tokens``, Responses' ``max_output_tokens``; with none of them, the prompt
alone). The prompt is not tokenized: :func:`~.stats.estimate_prompt_tokens` counts four
characters a token (plus 4 a message), and a target is left out only when three quarters of
that estimate (one token per 5⅓ characters: more than English prose takes, at 3-5 characters a
token, or code, at fewer, or Chinese, at one or two) plus the answer's room exceed its window.

The count thus errs low. A request that would fit is left out only for text that packs more
than 5⅓ characters into a token (long runs of one character or of spaces); a request that
does not fit may be sent (images, tool definitions and non-text parts count nothing), and the
vendor's context-length error then fails over to a target with a larger window. Targets
without a declared window are never left out, and when every target would be left out the
request still goes to those with the largest window: an estimate never refuses a request, the
vendor decides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "FIT_SHARE",
    "MAX_TOKENS_CAP",
    "answer_room",
    "larger_windows",
    "needed_tokens",
    "refused_sizes",
    "refused_window",
    "too_long",
]

FIT_SHARE = 0.75
"""The share of :func:`~.stats.estimate_prompt_tokens` counted against a window."""

_ROOM_KEYS = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "responses": ("max_output_tokens",),
}


MAX_TOKENS_CAP = 1 << 40
"""A body's ``max_tokens`` is read clamped to ``0..MAX_TOKENS_CAP``, wherever it is counted
(a window, a key's limits, the tier classifier's features): far beyond any model's context,
and exact in a double (a Redis Lua number) however large the number the client sent."""


def answer_room(body: Mapping[str, Any], kind: str = "chat") -> int:
    """The tokens a request asks room for in its answer (0 when it names no limit), at most
    :data:`MAX_TOKENS_CAP`."""
    for key in _ROOM_KEYS.get(kind, _ROOM_KEYS["chat"]):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, MAX_TOKENS_CAP)
    return 0


def needed_tokens(prompt_estimate: int, room: int) -> int:
    """The tokens a request is counted as needing: :data:`FIT_SHARE` of the prompt's estimate,
    plus the answer's room."""
    return int(prompt_estimate * FIT_SHARE) + room


def too_long(windows: Mapping[str, int | None], needed: int) -> dict[str, int]:
    """The targets (of those the request could go to) to leave out, with their windows: those
    whose declared window is below ``needed``, unless that is all of them; then only those
    below the largest window, so the request still goes somewhere."""
    over = {name: w for name, w in windows.items() if w is not None and w < needed}
    if over and len(over) == len(windows):
        largest = max(over.values())
        over = {name: w for name, w in over.items() if w < largest}
    return over


def larger_windows(windows: Mapping[str, int | None], than: int) -> list[str]:
    """The targets whose declared window is larger than ``than`` (where a request that one
    window refused may still fit), in the order given."""
    return [name for name, w in windows.items() if w is not None and w > than]


_WINDOW = (
    # OpenAI, vLLM: "This model's maximum context length is 8192 tokens."
    re.compile(r"maximum context length is (\d{1,9}) tokens"),
    # SGLang: "... longer than the model's context length (4096 tokens)."
    re.compile(r"context length \((\d{1,9}) tokens\)"),
    # Anthropic: "prompt is too long: 210000 tokens > 200000 maximum"
    re.compile(r"\d{1,9} tokens > (\d{1,9}) maximum"),
)
_NEEDED = (
    # OpenAI: "However, your messages resulted in 8245 tokens"; OpenAI, vLLM: "However, you
    # requested 5000 tokens (4000 in the messages, 1000 in the completion)"
    re.compile(r"(?:resulted in|you requested) (\d{1,9}) tokens"),
    re.compile(r"The input \((\d{1,9}) tokens\)"),  # SGLang: the prompt alone
    re.compile(r"too long: (\d{1,9}) tokens > \d{1,9} maximum"),  # Anthropic
)


def refused_sizes(message: str) -> tuple[int | None, int | None]:
    """What a context-length error's ``message`` says of the refusing target's window and of
    the tokens the request needs (at least), each ``None`` when it says nothing recognised.

    Read conservatively: only the vendors' own phrasings (OpenAI's, vLLM's, SGLang's,
    Anthropic's), whole numbers of tokens, and a window only when it is below the need it
    names (a message that contradicts itself says nothing)."""
    window = needed = None
    for pattern in _WINDOW:
        found = pattern.search(message)
        if found:
            window = int(found.group(1))
            break
    for pattern in _NEEDED:
        found = pattern.search(message)
        if found:
            needed = int(found.group(1))
            break
    if window is not None and (window < 1 or (needed is not None and needed <= window)):
        return None, None
    return window, needed if needed is not None and needed > 0 else None


def refused_window(declared: int | None, message: str, estimate: int) -> int:
    """The context window a context-length error rules out: the refusing target's
    ``declared`` one, else the one its error ``message`` names (:func:`refused_sizes`), else
    the request's own ``estimate`` of what it needs (which errs low); a need the message names
    raises it (a window must hold ``needed`` at least)."""
    said, needed = refused_sizes(message)
    window = declared if declared is not None else said
    if window is None:
        window = estimate
    if needed is not None:
        window = max(window, needed - 1)
    return window
