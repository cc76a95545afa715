"""Where a continued answer joins the text so far (``llmroute.routing.splice``): reasoning dropped,
an echoed prefix stripped however it is split across deltas, a wrong echo never spliced."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmroute.protocols.openai import build_chunk
from llmroute.routing.splice import ContinuationMismatch, Splice

REQUEST = httpx.Request("POST", "https://vendor.invalid/v1/chat/completions")
PREFIX = "Voici votre réponse :\n"
REST = " Bonjour, matelot !"


def chunk(finish: str | None = None, **delta: Any) -> Any:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return build_chunk(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [choice],
        }
    )


def passed(splice: Splice, chunks: list[Any]) -> str:
    """The content the caller would get from ``chunks`` after the splice."""
    return "".join(c.choices[0].delta.content or "" for c in chunks if splice.admit(c))


def cuts(text: str, points: list[int]) -> list[str]:
    edges = [0, *sorted({p % (len(text) + 1) for p in points}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(edges) if b > a]


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_an_echo_is_stripped_however_it_is_split(points: list[int]) -> None:
    splice = Splice(PREFIX, request=REQUEST, target="mistral:m")
    pieces = [chunk(content=piece) for piece in cuts(PREFIX + REST, points)]
    assert passed(splice, pieces) == REST
    assert splice.pending == "" and splice.unfinished() is None


def test_reasoning_is_dropped_and_content_beside_it_kept() -> None:
    splice = Splice("", request=REQUEST, target="deepseek:m")
    pieces = [
        chunk(role="assistant", content=""),
        chunk(content=None, reasoning_content="Let me think"),
        chunk(content=" Hello", reasoning=" more"),
        chunk(content=" world"),
    ]
    kept = [c for c in pieces if splice.admit(c)]
    assert "".join(c.choices[0].delta.content or "" for c in kept) == " Hello world"
    assert splice.reasoned
    assert all("reasoning_content" not in (c.choices[0].delta.model_extra or {}) for c in kept)
    assert all("reasoning" not in (c.choices[0].delta.model_extra or {}) for c in kept)
    assert kept[0].choices[0].delta.role == "assistant"  # untouched chunks pass as they are


def test_a_chunk_emptied_by_the_echo_still_carries_its_finish_reason() -> None:
    splice = Splice(PREFIX, request=REQUEST, target="mistral:m")
    assert passed(splice, [chunk(content=PREFIX)]) == ""
    end = chunk(finish="stop", content="")
    assert splice.admit(end) and end.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("answer", [REST, PREFIX[:5] + "X" + REST, " " + PREFIX + REST])
def test_an_answer_that_does_not_begin_with_the_prefix_is_refused(answer: str) -> None:
    splice = Splice(PREFIX, request=REQUEST, target="mistral:m")
    with pytest.raises(ContinuationMismatch, match="did not begin with the text so far"):
        for piece in cuts(answer, [3, 8]):
            splice.admit(chunk(content=piece))


def test_an_echo_cut_short_is_reported_at_the_end() -> None:
    splice = Splice(PREFIX, request=REQUEST, target="mistral:m")
    assert passed(splice, [chunk(content=PREFIX[:7])]) == ""
    assert splice.pending == PREFIX[7:]
    error = splice.unfinished()
    assert isinstance(error, ContinuationMismatch) and error.target == "mistral:m"
