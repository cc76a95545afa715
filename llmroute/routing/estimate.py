"""What a request will take, estimated from its body before it is sent: its prompt's tokens
(four characters a token, no tokenizer) and the room it asks for its answer.

The engine sizes a request against each target's context window with it; a gateway counts a
request against a key's token limits with it before the answer says what was used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .samples import estimate_prompt_tokens
from .windows import answer_room

__all__ = ["RequestEstimate", "estimate_request", "prompt_messages"]


@dataclass(frozen=True, slots=True)
class RequestEstimate:
    """A request's tokens, estimated before it is sent."""

    prompt_tokens: int
    """The prompt's tokens: text characters // 4 (plus 4 a chat message), token ids as given."""
    answer_tokens: int
    """The room the request asks for its answer (its ``max_tokens`` or the like, capped at
    :data:`~llmroute.routing.windows.MAX_TOKENS_CAP`); 0 when it names no limit."""

    @property
    def tokens(self) -> int:
        """Prompt and answer together: what a token limit counts before the answer comes."""
        return self.prompt_tokens + self.answer_tokens


def estimate_request(body: Mapping[str, Any], kind: str = "chat") -> RequestEstimate:
    """The tokens a request's JSON ``body`` will take, for an endpoint ``kind``: ``"chat"``
    (``/chat/completions``), ``"responses"``, ``"completions"`` or ``"embeddings"``. Never
    raises on a body of the wrong shape: what is not text counts nothing."""
    return RequestEstimate(prompt_tokens(body, kind), answer_room(body, kind))


def prompt_tokens(body: Mapping[str, Any], kind: str) -> int:
    """The request's prompt tokens, estimated (four characters a token)."""
    if kind in ("chat", "responses"):
        return estimate_prompt_tokens(prompt_messages(body, kind))
    given = body.get("prompt" if kind == "completions" else "input")
    if isinstance(given, str):
        return len(given) // 4
    if not isinstance(given, list):
        return 0
    characters = tokens = 0
    for item in given:  # one pass: a client's body may hold a million items
        kind_of = type(item)
        if kind_of is int:  # a token id of a flat prompt [1, 2, 3]
            tokens += 1
        elif kind_of is str:
            characters += len(item)
        elif kind_of is list:  # token ids
            tokens += len(item)
    return characters // 4 + tokens


def prompt_messages(body: Mapping[str, Any], kind: str) -> list[Any]:
    """The messages of a call's prompt, for its size: a chat call's ``messages``; a Responses
    call's ``instructions`` and ``input`` (a string, or a list of items)."""
    if kind != "responses":
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []
    out: list[Any] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        out.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
    elif isinstance(given, list):
        out.extend(item for item in given if isinstance(item, Mapping))
    return out
