"""Counting the tokens of a partial answer: what a stream delivered before it broke.

A continuation asks the next target for the rest of the caller's ``max_tokens``, so it must know
how many of them the broken stream used. Vendors count exactly only in ``usage``: on every chunk
with vLLM's and SGLang's ``stream_options.continuous_usage_stats``, else at the end of an answer
that completed (:func:`visible_tokens`: its ``completion_tokens`` less the hidden reasoning
tokens they include, which are no part of the text).

Without the vendor's count, llmroute's accounts use **one token per streamed delta with text**:
a delta with text holds at least one whole token (vendors stream tokens as they are decoded,
one or several to a delta), so this count is never more than the vendor's, whatever the text
(a count from the text's bytes is not: one token can be 16 spaces or a long run of dashes, so
bytes over 8 can exceed the tokens). A low count asks the continuation for more than the rest:
the answer may run past ``max_tokens``, never fall short of it.

:class:`TokenCounts` (one per target in its live stats) keeps what the target's completed
answers reported against their text, and :func:`estimate_tokens` estimates a partial answer's
tokens from it, for the route report only (``tokens_estimate``):

- **tokens per delta**: most OpenAI-style vendors send one token per delta, Anthropic and some
  others several;
- **bytes per token** of the UTF-8 text: English runs 3-5, code fewer, CJK about 3 per character.

The estimate may be high or low (a target's text changes language, its deltas their packing);
it never sizes a continuation.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

__all__ = [
    "ANSWERS_KEPT",
    "DEFAULT_BYTES_PER_TOKEN",
    "MIN_ANSWER_TOKENS",
    "TokenCounts",
    "estimate_tokens",
    "visible_tokens",
]

DEFAULT_BYTES_PER_TOKEN = 8.0
"""Bytes per token the estimate assumes before a target's answers calibrated it: about twice
what English (~4), code (~3) and Chinese (~3-4) run."""
ANSWERS_KEPT = 32
"""Completed answers a target's counts keep (the newest)."""
MIN_ANSWER_TOKENS = 4
"""Answers shorter than this teach nothing about a target's tokens (their ratios are noise)."""


@dataclass(frozen=True, slots=True)
class _Answer:
    tokens: int
    text_bytes: int
    deltas: int
    """Streamed deltas with text (0: not streamed)."""


class TokenCounts:
    """What one target's completed answers said of its tokens: per delta and per byte."""

    __slots__ = ("_answers",)

    def __init__(self, kept: int = ANSWERS_KEPT) -> None:
        self._answers: deque[_Answer] = deque(maxlen=kept)

    def record(self, tokens: int, text: str, deltas: int = 0) -> None:
        """A completed answer: the vendor's count of its ``tokens``, its ``text`` and, when
        streamed, the deltas with text it came in."""
        size = len(text.encode())
        if tokens >= MIN_ANSWER_TOKENS and size > 0:
            self._answers.append(_Answer(tokens, size, deltas))

    def __len__(self) -> int:
        return len(self._answers)

    def per_delta(self) -> tuple[float, float] | None:
        """The fewest and most tokens per delta of the streamed answers kept (None: none)."""
        ratios = [a.tokens / a.deltas for a in self._answers if a.deltas]
        return (min(ratios), max(ratios)) if ratios else None

    def bytes_per_token(self) -> tuple[float, float] | None:
        """The fewest and most bytes per token of the answers kept (None: none)."""
        ratios = [a.text_bytes / a.tokens for a in self._answers]
        return (min(ratios), max(ratios)) if ratios else None


def _spread(bounds: tuple[float, float]) -> float:
    return (bounds[1] - bounds[0]) / bounds[0] if bounds[0] > 0 else math.inf


def estimate_tokens(text: str, deltas: int, counts: TokenCounts) -> tuple[int, str]:
    """An estimate of the tokens a target delivered as ``text`` in ``deltas`` streamed deltas
    with text, by its ``counts``, and how: ``"deltas"`` (its tokens per delta) or
    ``"estimate"`` (bytes). For the route report: not a bound either way.

    Of the two ratios, the one that varied less over the target's answers is used, each at
    its low end. Another target's ratios are not borrowed, even for the same model: a partial text's
    bytes per token vary more than a whole answer's, and a borrowed ratio has not even seen
    this vendor's deltas."""
    per_delta = counts.per_delta()
    per_byte = counts.bytes_per_token()
    if per_delta is not None and (per_byte is None or _spread(per_delta) <= _spread(per_byte)):
        return math.floor(deltas * per_delta[0] + 1e-9), "deltas"
    most = per_byte[1] if per_byte is not None else DEFAULT_BYTES_PER_TOKEN
    return max(deltas, math.floor(len(text.encode()) / most)), "estimate"


def visible_tokens(usage: Any) -> int | None:
    """The completion tokens of a vendor's ``usage`` (an object or a dict) that are the
    answer's text: ``completion_tokens`` less the hidden reasoning tokens it includes
    (``completion_tokens_details.reasoning_tokens``: o-series, GPT-5 and later models)."""

    def get(obj: Any, key: str) -> Any:
        if isinstance(obj, Mapping):
            return cast(Mapping[str, Any], obj).get(key)
        return getattr(obj, key, None)

    completion = get(usage, "completion_tokens")
    if not isinstance(completion, int) or isinstance(completion, bool):
        return None
    reasoning = get(get(usage, "completion_tokens_details"), "reasoning_tokens")
    if isinstance(reasoning, int) and not isinstance(reasoning, bool) and reasoning > 0:
        return max(0, completion - reasoning)
    return completion
