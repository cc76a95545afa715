"""``llmroute.routing.estimate_request``: a request's tokens, from its JSON body alone."""

from __future__ import annotations

from typing import Any

import pytest

from llmroute.routing import RequestEstimate, estimate_request
from llmroute.routing.windows import MAX_TOKENS_CAP


@pytest.mark.parametrize(
    ("kind", "body", "prompt", "answer"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 7}, 14, 7),
        ("chat", {"messages": "not a list", "max_completion_tokens": 3}, 0, 3),
        ("responses", {"instructions": "y" * 8, "input": "z" * 8, "max_output_tokens": 5}, 12, 5),
        ("completions", {"prompt": ["abcd" * 3, [1, 2, 3]], "max_tokens": 2}, 6, 2),
        ("embeddings", {"input": "e" * 20}, 5, 0),
        ("completions", {"prompt": [7] * 1000}, 1000, 0),  # token ids, once counted as none
        ("embeddings", {"input": [1, True, None, "abcd", [2, 2]]}, 4, 0),
        ("chat", {"messages": [], "max_tokens": 10**20}, 0, MAX_TOKENS_CAP),
        ("chat", {"messages": [], "max_tokens": True}, 0, 0),
    ],
)
def test_estimate_request(kind: str, body: dict[str, Any], prompt: int, answer: int) -> None:
    estimate = estimate_request(body, kind)
    assert estimate == RequestEstimate(prompt, answer)
    assert estimate.tokens == prompt + answer
