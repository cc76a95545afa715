"""Samples as the live stats record and exchange them: the outcomes of an attempt, the plain
:data:`SampleEvent` a fleet shares and a stats file keeps (with the checks an event from
elsewhere passes), the bounded :class:`SampleJournal` they wait in, and the prompt-length
classes TTFT samples are kept by (with the prompt-token estimate that picks one)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

__all__ = [
    "CANCELLED",
    "ERROR",
    "FAILURES",
    "INTERRUPTED",
    "OK",
    "OUTBOX_MAXLEN",
    "OUTCOMES",
    "RATE_LIMITED",
    "SAMPLE_KINDS",
    "TIMEOUT",
    "Outcome",
    "SampleEvent",
    "SampleJournal",
    "class_label",
    "estimate_prompt_tokens",
    "event_values",
    "optional_seconds",
    "prompt_class",
    "seconds_value",
    "token_count",
]

Outcome = Literal["ok", "error", "timeout", "rate_limited", "cancelled", "interrupted"]

OK: Final = "ok"
ERROR: Final = "error"  # connection errors, 5xx, malformed responses
TIMEOUT: Final = "timeout"  # no first token by the deadline, read timeouts
RATE_LIMITED: Final = "rate_limited"  # 429
CANCELLED: Final = "cancelled"  # lost a hedge or a race
INTERRUPTED: Final = "interrupted"  # broke after tokens had arrived
OUTCOMES: Final[tuple[Outcome, ...]] = (OK, ERROR, TIMEOUT, RATE_LIMITED, CANCELLED, INTERRUPTED)
FAILURES: Final = (ERROR, TIMEOUT, RATE_LIMITED)

SampleEvent: TypeAlias = Sequence[str | float | None]
"""One recorded sample as plain JSON-ready data, ``(target, kind, *values)``, one of:
``(target, "t", seconds, prompt_tokens)`` a TTFT, ``(target, "c", elapsed, prompt_tokens)`` a
censored TTFT, ``(target, "s", itl, tokens_per_s)`` a stream's speed (either may be ``None``),
``(target, "l", seconds)`` a whole-response latency, ``(target, "o", outcome)`` an outcome.
"""
SAMPLE_KINDS: Final = ("t", "c", "s", "l", "o")
OUTBOX_MAXLEN: Final = 10_000


def prompt_class(tokens: int, bounds: Sequence[int]) -> int:
    """The index of the class a prompt of ``tokens`` falls in: the first bound it is under.

    A prompt of at least the last bound is in the last class, ``len(bounds)``.
    """
    return bisect.bisect_right(bounds, tokens)


def _tokens_label(tokens: int) -> str:
    for unit in (1024, 1000):
        if tokens >= unit and tokens % unit == 0:
            return f"{tokens // unit}k"
    return str(tokens)


def class_label(index: int, bounds: Sequence[int]) -> str:
    """A short name for class ``index``: ``"<1k"``, ``"1k-8k"``, ..., ``">=32k"``."""
    if not 0 <= index <= len(bounds):
        raise ValueError(f"class {index} is out of range for {len(bounds)} bounds")
    if index == 0:
        return f"<{_tokens_label(bounds[0])}"
    if index == len(bounds):
        return f">={_tokens_label(bounds[-1])}"
    return f"{_tokens_label(bounds[index - 1])}-{_tokens_label(bounds[index])}"


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """A rough, fast token count of chat messages: text characters // 4, plus 4 per message.

    Text is string content or the ``text`` of ``{"type": "text"}`` parts; other parts, and
    messages that are not mappings, count nothing.
    """
    characters = 0
    count = 0
    for message in messages:
        count += 1
        # exact types first: a parsed body's dicts, lists and strs skip the ABCs' checks (a
        # 4 MiB body of 130,000 parts counted in half the time, on a gateway's event loop)
        if type(message) is not dict and not isinstance(message, Mapping):
            continue
        content: Any = message.get("content")  # Any: the checks below are by exact type
        kind = type(content)
        if kind is str or (kind is not list and isinstance(content, str)):
            characters += len(content)
        elif kind is list or isinstance(content, Iterable):
            characters += _text_characters(content)
    return characters // 4 + 4 * count


def _text_characters(parts: Iterable[Any]) -> int:
    """The characters of the ``text`` of a content list's ``{"type": "text"}`` parts."""
    characters = 0
    for part in parts:
        if (type(part) is dict or isinstance(part, Mapping)) and part.get("type") == "text":
            text = part.get("text")
            if type(text) is str or isinstance(text, str):
                characters += len(text)
    return characters


class SampleJournal:
    """A bounded outbox of recorded samples; when full, the oldest is dropped and counted."""

    __slots__ = ("dropped", "events")

    def __init__(self, maxlen: int = OUTBOX_MAXLEN) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be at least 1, got {maxlen!r}")
        self.events: deque[SampleEvent] = deque(maxlen=maxlen)
        self.dropped = 0

    def add(self, event: SampleEvent) -> None:
        """Keep one event."""
        events = self.events
        if len(events) == events.maxlen:
            self.dropped += 1
        events.append(event)

    def drain(self) -> list[SampleEvent]:
        """Take every event kept, oldest first."""
        taken = list(self.events)
        self.events.clear()
        return taken


def seconds_value(value: object) -> float:
    """``value`` from an event as seconds: a finite non-negative number, else ``TypeError``
    (not a number) or ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected seconds, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"expected finite non-negative seconds, got {value!r}")
    return float(value)


def token_count(value: object) -> int:
    """``value`` from an event as a token count: a non-negative int, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a token count, got {value!r}")
    return value


def optional_seconds(value: object) -> float | None:
    """``value`` from an event as seconds (:func:`seconds_value`), or ``None``."""
    return None if value is None else seconds_value(value)


def event_values(kind: str, values: Sequence[object]) -> tuple[Any, ...]:
    """The values of an event of ``kind`` (:data:`SampleEvent`, after its target and kind),
    checked and converted: ``(seconds, prompt_tokens)`` for ``"t"`` and ``"c"``, ``(itl,
    tokens_per_s)`` for ``"s"`` (either ``None``), ``(seconds,)`` for ``"l"``, ``(outcome,)``
    for ``"o"``. Raises ``ValueError`` or ``TypeError`` when the event is malformed."""
    if kind in ("t", "c"):
        seconds, tokens = values
        return seconds_value(seconds), token_count(tokens)
    if kind == "s":
        itl, tokens_per_s = values
        return optional_seconds(itl), optional_seconds(tokens_per_s)
    if kind == "l":
        (seconds,) = values
        return (seconds_value(seconds),)
    if kind == "o":
        (outcome,) = values
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        return (outcome,)
    raise ValueError(f"unknown sample kind {kind!r}")
