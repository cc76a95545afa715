"""Where a continued answer joins the text the caller already has.

A continuation (see :mod:`.continuation`) asks another target for the rest of an answer whose text
so far is the trailing assistant message. What that target streams back is not all the rest:

- **reasoning** (``reasoning_content`` / ``reasoning`` deltas, a model that thinks first, such
  as DeepSeek V4 by default) is no part of the answer's text. The caller already saw the first
  attempt's reasoning, or none: a continuation's reasoning is dropped, never spliced in;
- **the prefix again**, where the vendor's answer begins with the prefix it was given (the
  catalog's ``echoes_prefix``: Mistral). Exactly that text is stripped, however the vendor
  splits it across deltas. An answer that does not begin with it (the vendor stopped echoing,
  or echoed something else) cannot be told apart from a continuation that happens to start
  like the prefix, so it is never guessed at: the continuation fails as a break
  (:class:`ContinuationMismatch`), nothing of it having reached the caller.
"""

from __future__ import annotations

import httpx
from openai.types.chat import ChatCompletionChunk

from .._errors import APIError, quote
from ..protocols.openai import is_preamble_chunk

__all__ = ["REASONING_FIELDS", "ContinuationMismatch", "Splice"]

REASONING_FIELDS = ("reasoning_content", "reasoning")
"""The delta fields vendors stream reasoning in (DeepSeek, vLLM, SGLang, OpenRouter...)."""


class ContinuationMismatch(APIError):
    """Raised when a continuing target's answer does not begin with the text so far, though
    its vendor documents that it does: the continuation is a break, not spliced."""

    def __init__(self, request: httpx.Request, *, target: str, expected: str, got: str) -> None:
        text = (
            f"The continuation from target {target!r} did not begin with the text so far "
            f"(expected {quote(expected)}, got {quote(got)})"
        )
        super().__init__(text, request, body=None)  # type: ignore[arg-type]
        self.target = target


class Splice:
    """Filters the chunks of one continuing stream before the caller sees them.

    ``echo`` is the text the vendor repeats first (the prefix where the catalog says it
    echoes, else ``""``). :meth:`admit` strips reasoning and what is left of the echo from a
    chunk, in place, and says whether the chunk still carries anything for the caller.
    """

    __slots__ = ("_echo", "_request", "_target", "reasoned", "stripped")

    def __init__(self, echo: str, *, request: httpx.Request, target: str) -> None:
        self._echo = echo
        self._request = request
        self._target = target
        self.reasoned = False
        """Reasoning was dropped from this stream (its usage may count it)."""
        self.stripped = False
        """Reasoning or echoed text was dropped from this stream: its usage may count text
        the caller never gets (Mistral's usage may or may not count the echo; not documented)."""

    @property
    def pending(self) -> str:
        """The part of the echo not received yet (``""`` once it all came, or none was due)."""
        return self._echo

    def admit(self, chunk: ChatCompletionChunk) -> bool:
        """Strip the chunk; ``False`` when stripping left nothing in it (drop it)."""
        changed = False
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.__pydantic_extra__
            if extra:
                for key in REASONING_FIELDS:
                    if key in extra:
                        del extra[key]
                        delta.model_fields_set.discard(key)
                        changed = self.reasoned = self.stripped = True
            echo = self._echo
            content = delta.content
            if echo and content:
                size = min(len(content), len(echo))
                if content[:size] != echo[:size]:
                    raise ContinuationMismatch(
                        self._request, target=self._target, expected=echo, got=content
                    )
                delta.content = content[size:]
                self._echo = echo[size:]
                changed = self.stripped = True
        return not (changed and is_preamble_chunk(chunk))

    def unfinished(self) -> ContinuationMismatch | None:
        """At the end of the continuing answer: the error when its echo was cut short."""
        if not self._echo:
            return None
        return ContinuationMismatch(self._request, target=self._target, expected=self._echo, got="")
