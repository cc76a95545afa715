"""What one answer used, for its key's usage and limits: the vendors' ``usage`` where it came,
else the gateway's own count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..routing import estimate_request
from ..routing.splice import REASONING_FIELDS
from ._exchange import cache_hit

__all__ = ["Tally"]


def _carries_tokens(chunk: Any) -> bool:
    """Whether a streamed chunk brings answer tokens (text, reasoning, a tool call), not only
    a role, a finish reason or usage."""
    for choice in chunk.choices or ():
        if getattr(choice, "text", None):  # a completion's
            return True
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        if delta.content or delta.tool_calls or delta.refusal:
            return True
        extra = getattr(delta, "__pydantic_extra__", None)
        if extra and any(extra.get(key) for key in REASONING_FIELDS):
            return True
    return False


class Tally:
    """What one answer used: the vendors' usage where it came, else the gateway's count
    (the prompt's estimate; a streamed chunk with text a token). A cache hit used nothing. Per
    chunk it costs a few attribute reads: the hot path is the streamed chunk's."""

    __slots__ = (
        "answer",
        "body",
        "cache_hit",
        "chunks",
        "completion",
        "kind",
        "prompt",
        "prompt_estimate",
        "usage",
    )

    def __init__(self, body: Mapping[str, Any], kind: str, prompt: int | None = None) -> None:
        self.body, self.kind = body, kind
        self.prompt_estimate = prompt
        """The prompt's tokens as the gateway counted them, if it did (else counted here)."""
        self.prompt: int | None = None
        self.completion: int | None = None
        self.chunks = 0
        self.cache_hit = False
        self.answer = False  # a whole answer came (with or without usage)
        self.usage: Any = None
        """The vendor's last chat or completion ``usage`` object, as it sent it."""

    def _usage(self, usage: Any, prompt: str, completion: str) -> None:
        p, c = getattr(usage, prompt, None), getattr(usage, completion, None)
        if isinstance(p, int):
            self.prompt = p
        if isinstance(c, int):
            self.completion = c

    def chunk(self, chunk: Any) -> None:
        if _carries_tokens(chunk):
            self.chunks += 1  # a count of tokens only where no vendor sent usage
        usage = chunk.usage
        if usage is not None:
            self.usage = usage
            self._usage(usage, "prompt_tokens", "completion_tokens")

    def event(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        if kind == "response.output_text.delta":
            self.chunks += 1
        elif kind in ("response.completed", "response.incomplete"):
            response = getattr(event, "response", None)
            usage = getattr(response, "usage", None)
            if usage is not None:
                self._usage(usage, "input_tokens", "output_tokens")

    def streamed(self, route: Any) -> None:
        """A routed stream's report: its usage as the vendors counted it."""
        usage = getattr(route, "usage", None)
        if usage is not None and self.completion is None:
            self._usage(usage, "prompt_tokens", "completion_tokens")

    def answered(self, result: Any) -> None:
        self.cache_hit = cache_hit(result)
        self.answer = True
        usage = getattr(result, "usage", None)
        if usage is None:
            return
        if hasattr(usage, "input_tokens"):  # the Responses API's
            self._usage(usage, "input_tokens", "output_tokens")
        else:
            self.usage = usage
            self._usage(usage, "prompt_tokens", "completion_tokens")
            if self.completion is None and isinstance(self.prompt, int):
                self.completion = 0  # embeddings: no completion

    def used(self) -> tuple[int, int]:
        """Prompt and completion tokens (none for a cache hit)."""
        if self.cache_hit:
            return 0, 0
        if self.prompt is None and self.completion is None and not self.chunks and not self.answer:
            return 0, 0  # nothing came back: nothing was used that anyone counted
        if self.prompt is not None:
            prompt = self.prompt
        elif self.prompt_estimate is not None:
            prompt = self.prompt_estimate
        else:
            prompt = estimate_request(self.body, self.kind).prompt_tokens
        completion = self.completion if self.completion is not None else self.chunks
        return prompt, completion
