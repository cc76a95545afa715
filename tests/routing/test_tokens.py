"""Counting a partial answer's tokens from a target's completed answers (routing/tokens.py)."""

from __future__ import annotations

from openai.types import CompletionUsage
from openai.types.completion_usage import CompletionTokensDetails

from llmroute.routing.tokens import (
    ANSWERS_KEPT,
    DEFAULT_BYTES_PER_TOKEN,
    TokenCounts,
    estimate_tokens,
    visible_tokens,
)


def test_before_calibration_one_token_a_delta_or_eight_bytes_whichever_is_more() -> None:
    counts = TokenCounts()
    assert estimate_tokens("the a of to", 4, counts) == (4, "estimate")
    long = "x" * 80  # one delta of 80 bytes: at least 10 tokens by the default
    assert estimate_tokens(long, 1, counts) == (int(80 / DEFAULT_BYTES_PER_TOKEN), "estimate")


def test_one_token_a_delta_counts_deltas_exactly() -> None:
    counts = TokenCounts()
    counts.record(30, "word " * 30, 30)
    counts.record(12, "a " * 12, 12)  # very different bytes per token, the same per delta
    assert counts.per_delta() == (1.0, 1.0)
    assert estimate_tokens("internationalization " * 7, 7, counts) == (7, "deltas")


def test_deltas_that_vary_more_than_bytes_count_by_the_most_bytes_per_token() -> None:
    counts = TokenCounts()
    counts.record(40, "abcd" * 40, 8)  # 4 bytes a token, 5 tokens a delta
    counts.record(40, "abcde" * 40, 20)  # 5 bytes a token, 2 tokens a delta
    assert counts.bytes_per_token() == (4.0, 5.0)
    # 100 bytes: 20 tokens at the most bytes per token (25 at the fewest): it errs low.
    assert estimate_tokens("z" * 100, 3, counts) == (20, "estimate")
    # Never fewer than one token a delta.
    assert estimate_tokens("z" * 10, 4, counts) == (4, "estimate")


def test_several_tokens_a_delta_count_at_the_fewest_seen() -> None:
    counts = TokenCounts()
    counts.record(30, "w " * 30, 10)  # 3 a delta
    counts.record(40, "wxyz " * 40, 14)  # 2.86 a delta (a short last delta); bytes vary more
    low, high = counts.per_delta() or (0.0, 0.0)
    assert high == 3.0 and 2.85 < low < 2.86
    assert estimate_tokens("w " * 30, 10, counts) == (28, "deltas")  # 30 delivered: low


def test_short_answers_teach_nothing_and_the_newest_are_kept() -> None:
    counts = TokenCounts()
    counts.record(3, "one two three", 3)
    counts.record(10, "", 0)
    assert len(counts) == 0 and counts.per_delta() is None and counts.bytes_per_token() is None
    for _ in range(ANSWERS_KEPT):
        counts.record(10, "w " * 10, 10)
    counts.record(20, "w " * 20, 10)
    assert len(counts) == ANSWERS_KEPT
    assert counts.per_delta() == (1.0, 2.0)


def test_the_vendors_count_of_the_text_leaves_out_its_hidden_reasoning_tokens() -> None:
    # reasoning models (o-series, GPT-5 and later) count their hidden reasoning in
    # completion_tokens: counted as the text's tokens, it would size a continuation too small
    # and cut the answer short.
    usage = CompletionUsage(
        prompt_tokens=10,
        completion_tokens=300,
        total_tokens=310,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=256),
    )
    assert visible_tokens(usage) == 44
    assert visible_tokens({"completion_tokens": 30}) == 30  # Anthropic's, as a dict
    assert visible_tokens({"completion_tokens": 30, "completion_tokens_details": None}) == 30
    assert visible_tokens(None) is None and visible_tokens({"completion_tokens": "30"}) is None
