"""The account of one answer's tokens, across every attempt that wrote it.

A routed stream may be continued on other targets (:mod:`.continuation`); the caller still gets
one answer, one ``usage`` and one ``max_tokens``. :class:`TokenAccount` keeps the answer's text,
the token chunks the caller got, the tokens the broken attempts delivered (counted low, see
:mod:`.tokens`) and the vendors' own counts, so that a continuation asks for the rest of the
caller's limit, the answer ends at that limit, and the usage the caller sees covers the whole
answer. It knows nothing of HTTP or of the race; the engine and the answer reader feed it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

from openai.types.chat import ChatCompletionChunk

from .._types import RouteReport
from ..protocols.openai import ChatStreamDecoder, build_chunk
from .tokens import TokenCounts, estimate_tokens, visible_tokens

__all__ = ["TokenAccount", "token_limit"]


def token_limit(body: Mapping[str, Any]) -> int | None:
    """The caller's limit on the answer's tokens: the smaller of ``max_tokens`` and
    ``max_completion_tokens`` (``None``: no limit asked)."""
    limits = [
        value
        for key in ("max_tokens", "max_completion_tokens")
        if isinstance(value := body.get(key), int) and not isinstance(value, bool)
    ]
    return min(limits) if limits else None


class TokenAccount:
    """The text and tokens of one answer so far, and the vendors' counts of them."""

    __slots__ = (
        "_counted",
        "_model",
        "_prompt_tokens",
        "_report",
        "_since",
        "continuous_asked",
        "delivered",
        "limit",
        "prompt_usage",
        "reasoned",
        "text",
        "tokens",
        "uncounted",
        "usage_asked",
    )

    def __init__(self, body: Mapping[str, Any], prompt_tokens: int, report: RouteReport) -> None:
        self._report = report
        self._prompt_tokens = prompt_tokens
        self._model = body.get("model", "")
        self.text: list[str] = []
        """The text of choice 0, delta by delta (every attempt's, as the caller got it)."""
        self.tokens = 0
        """Token chunks yielded (``timings.tokens``); a chunk may carry several tokens."""
        self.delivered = 0
        """Completion tokens the attempts that broke mid-answer delivered (each counted by
        :meth:`delivered_by`): what a continuation's ``max_tokens`` and ``usage`` account for."""
        self.limit = token_limit(body)
        """The caller's ``max_tokens`` / ``max_completion_tokens`` (the smaller): held on the
        whole answer, however many attempts it took."""
        asked = body.get("stream_options")
        self.usage_asked = isinstance(asked, Mapping) and bool(asked.get("include_usage"))
        """Whether the caller asked for usage in the stream (llmroute asks targets for it
        anyway, to count their tokens, and leaves out what the caller did not ask for)."""
        self.continuous_asked = self.usage_asked and bool(
            cast(Mapping[str, Any], asked).get("continuous_usage_stats")
        )
        self.prompt_usage: int | None = None
        """The prompt tokens of the vendors' latest usage (for an answer llmroute ends)."""
        self._since = 0
        """Where the current attempt's text starts in ``text``."""
        self.reasoned = False
        """The answer streamed reasoning (its first attempt: the caller saw it)."""
        self.uncounted = False
        """The current attempt's usage may count text the caller never gets as the answer's:
        reasoning (shown, or dropped from a continuation) or a prefix its vendor echoed and
        llmroute stripped. Its text deltas count it then (a lower bound: never cut short)."""
        self._counted: tuple[int, int] | None = None
        """The current attempt's own usage count of its completion tokens, and the length of
        ``text`` it covers (a vendor that sends usage with its chunks, or at the end)."""

    def continued(self) -> None:
        """A continuation took over: its text, usage and reasoning are counted from here."""
        self._since, self._counted, self.uncounted = len(self.text), None, False

    def broke(self, tokens: int, how: str) -> None:
        """The current attempt broke after delivering ``tokens`` (counted ``how``)."""
        self.delivered += tokens
        if how != "usage":  # the caller's completion_tokens are at least what it says
            self.estimated("completion_tokens")

    def cut(self, before: int) -> None:
        """The answer ends at the caller's limit before the chunk whose text began at
        ``before``: its text is no part of the answer, nor in the vendor's count."""
        del self.text[before:]
        if (self._counted or (0, 0))[1] > len(self.text):
            self._counted = None  # it counted the chunk

    def _counted_now(self, decoder: ChatStreamDecoder | None) -> tuple[int, int] | None:
        """The current attempt's own usage count and the length of ``text`` it covers: from
        its chunks, or Anthropic's ``message_delta`` once its answer finished; none for an
        attempt whose count may include text it did not deliver (``uncounted``)."""
        if self.uncounted:
            return None
        counted = self._counted
        if counted is None and decoder is not None and decoder.finished:
            usage = getattr(decoder, "usage", None)  # Anthropic's, from message_delta
            if isinstance(usage, dict):
                count = visible_tokens(usage)
                if count is not None:
                    counted = (count, len(self.text))
        return counted if counted is not None and counted[1] >= self._since else None

    def delivered_by(
        self, decoder: ChatStreamDecoder | None, counts: TokenCounts
    ) -> tuple[int, str, int | None]:
        """The completion tokens the current attempt delivered, counted so as never to be
        more than the vendor's count, how they were counted, and the calibrated estimate.

        The count: the vendor's usage where it covers the text (``"usage"``, its visible
        tokens: reasoning tokens left out), plus one token per delta with text after it or
        without it (``"deltas"``): a delta with text holds at least one token. Only this lower
        bound sizes a continuation and ends an answer at the caller's limit (a high count
        would cut the answer short). The estimate from the target's completed answers
        (``counts``, :mod:`.tokens`; ``None`` where the usage covers all) is for the route
        report only."""
        text = self.text
        counted = self._counted_now(decoder)
        start, tokens, how = self._since, 0, "deltas"
        if counted is not None:
            tokens, start = counted[0], counted[1]
            how = "usage"
        estimate: int | None = None
        if start < len(text):
            rest = text[start:]
            more, _ = estimate_tokens("".join(rest), len(rest), counts)
            estimate = tokens + max(more, len(rest))
            tokens += len(rest)
            how = "deltas"
        return tokens, how, estimate

    def calibrate(self, decoder: ChatStreamDecoder | None, counts: TokenCounts) -> None:
        """A completed answer of plain text: its vendor's count against its text and deltas,
        recorded in the target's ``counts``."""
        counted = self._counted_now(decoder)
        text = self.text
        if counted is not None and counted[1] == len(text) and len(text) > self._since:
            rest = text[self._since :]
            counts.record(counted[0], "".join(rest), len(rest))

    def combined(self) -> int:
        """The tokens of a continued answer so far, counted low: what the broken attempts
        delivered, plus the continuing attempt's usage or one token per delta."""
        counted, since = self._counted, self._since
        if counted is not None and counted[1] >= since:
            own = counted[0] + len(self.text) - counted[1]
        else:
            own = len(self.text) - since
        return self.delivered + own

    def ending(
        self, template: ChatCompletionChunk | None, chunk_id: str | None, tokens: int
    ) -> list[Any]:
        """The chunks that end an answer llmroute ended at the caller's limit: the
        ``finish_reason="length"`` chunk, and the usage chunk when the caller asked for it."""
        base: dict[str, Any] = {
            "id": chunk_id or "chatcmpl-llmroute",
            "object": "chat.completion.chunk",
            "created": template.created if template is not None else int(time.time()),
            "model": template.model if template is not None else self._model,
        }
        finish = {"index": 0, "delta": {}, "finish_reason": "length", "logprobs": None}
        out: list[Any] = [build_chunk({**base, "choices": [finish]})]
        if self.usage_asked:
            prompt = self.prompt_usage if self.prompt_usage is not None else self._prompt_tokens
            if self.prompt_usage is None:
                self.estimated("prompt_tokens")
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": tokens,
                "total_tokens": prompt + tokens,
            }
            out.append(build_chunk({**base, "choices": [], "usage": usage}))
        return out

    def estimated(self, field: str) -> None:
        """``usage.<field>`` of the caller's answer is llmroute's count, not a vendor's."""
        if field not in self._report.usage_estimated:
            self._report.usage_estimated.append(field)

    def usage_seen(self, chunk: ChatCompletionChunk, usage: Any) -> None:
        """A chunk with the vendor's usage: remember its count of the visible text so far,
        and add what earlier attempts delivered when the answer was continued (the prompt
        tokens then are the first attempt's, where its vendor streamed them)."""
        completion = getattr(usage, "completion_tokens", None)
        visible = visible_tokens(usage)
        if not isinstance(completion, int) or visible is None:
            return
        if not self.uncounted:
            self._counted = (visible, len(self.text))
        prompt = getattr(usage, "prompt_tokens", None)
        if isinstance(prompt, int) and not self.delivered:
            self.prompt_usage = prompt
        report = self._report
        report.usage = usage
        if not self.delivered:
            return
        total = completion + self.delivered
        update: dict[str, Any] = {"completion_tokens": total}
        if self.prompt_usage is not None:
            prompt = update["prompt_tokens"] = self.prompt_usage
        if isinstance(prompt, int):
            update["total_tokens"] = prompt + total
        chunk.usage = report.usage = usage.model_copy(update=update)
