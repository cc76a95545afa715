"""The SGLang stand-in's prefix cache: a prompt's tokens (one word is one token) and an LRU of
the blocks of prompts prefilled, whose longest run of leading blocks is a request's cached part.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, cast

import llmroute.testing._reply as _reply

BLOCK_TOKENS = 16
"""Tokens per prefix-cache block unless ``--page-size`` is above 1 (SGLang's default page is one
token; 16 keeps the stand-in's cache small and fast)."""


def prompt_token_list(messages: Sequence[Any]) -> list[str]:
    """The prompt as tokens: each message as ``<|im_start|> role words... <|im_end|>``, then
    the generation prompt ``<|im_start|> assistant`` (one word is one token)."""
    tokens: list[str] = []
    for message in messages:
        if isinstance(message, dict):
            msg = cast("dict[str, Any]", message)
            role = str(msg.get("role", "user"))
            tokens += ["<|im_start|>", role, *_reply.message_text(msg).split(), "<|im_end|>"]
    return [*tokens, "<|im_start|>", "assistant"]


class PrefixCache:
    """An LRU of prompt-prefix blocks of BLOCK_TOKENS tokens, chained by hash (a block is only
    found after the blocks before it). A prefix is touched from its end to its start, so the
    ends of the least recent prefixes are evicted first, like the leaves of a radix tree."""

    def __init__(self, capacity_tokens: int, block: int = BLOCK_TOKENS) -> None:
        self.block = block
        self.capacity_blocks = max(1, capacity_tokens // block)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        """Tokens held."""
        return len(self._blocks) * self.block

    def _keys(self, tokens: Sequence[str]) -> Iterator[int]:
        key = 0
        for start in range(0, len(tokens) - self.block + 1, self.block):
            key = hash((key, *tokens[start : start + self.block]))
            yield key

    def match(self, tokens: Sequence[str], *, touch: bool = False) -> int:
        """Cached tokens of this prompt: its leading blocks already held (at most all but one
        token, which is always computed)."""
        hits: list[int] = []
        for key in self._keys(tokens):
            if key not in self._blocks:
                break
            hits.append(key)
        if touch:
            for key in reversed(hits):
                self._blocks.move_to_end(key)
        return min(len(hits) * self.block, max(0, len(tokens) - 1))

    def insert(self, tokens: Sequence[str]) -> None:
        for key in reversed(list(self._keys(tokens))):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
