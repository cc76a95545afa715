"""Money per attempt (llmroute.pricing): recorded usage shapes of each vendor family against
figures worked by hand from the vendors' price pages, unknown prices, config overrides, and bad
price tables refused naming the file and key. Pure: no servers, no clock."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from llmroute._catalog import CatalogError, load_catalog, parse_provider
from llmroute._prices import ModelPrice
from llmroute.config import ConfigError, resolve_provider
from llmroute.pricing import TokenUsage, UsageError, attempt_cost, cost_of, read_usage

CATALOG = load_catalog()


def _cost(provider: str, model: str, usage: dict[str, Any], **kw: Any) -> Decimal | None:
    return attempt_cost(CATALOG[provider], model, usage, **kw).amount


# --- OpenAI (Chat Completions usage) -------------------------------------------------------
# Prices: https://developers.openai.com/api/docs/pricing, read 2026-12-06 through dated copies
# (gpt-6.1-sol $2 input / $0.10 cached / $10 output; gpt-6-luna $0.10 / $0.01 / $0.50, above
# 272K prompt tokens $0.20 / $0.02 / $0.75). cached_tokens is part of prompt_tokens and
# reasoning_tokens part of completion_tokens: reasoning is billed once, as output.
OPENAI_USAGE = {
    "prompt_tokens": 1486,
    "completion_tokens": 651,
    "total_tokens": 2137,
    "prompt_tokens_details": {"cached_tokens": 1408, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 512, "audio_tokens": 0},
}


def test_openai_cached_and_reasoning_tokens() -> None:
    # 78 fresh x $2 + 1408 cached x $0.10 + 651 output (512 of them reasoning) x $10, per 1M
    # = 0.000156 + 0.0001408 + 0.00651
    assert _cost("openai", "gpt-6.1-sol", OPENAI_USAGE) == Decimal("0.0068068")
    tokens = read_usage(OPENAI_USAGE, CATALOG["openai"].usage_fields)
    assert tokens == TokenUsage(input=78, cache_read=1408, output=651, reasoning=512)


def test_openai_long_prompt_tier_applies_above_272k_only() -> None:
    above = {"prompt_tokens": 300_000, "completion_tokens": 2_000}
    above["prompt_tokens_details"] = {"cached_tokens": 100_000}  # type: ignore[assignment]
    # 200K x $0.20 + 100K x $0.02 + 2K x $0.75 = 0.04 + 0.002 + 0.0015
    assert _cost("openai", "gpt-6-luna", above) == Decimal("0.0435")
    at = {**above, "prompt_tokens": 272_000}
    # not above 272K: 172K x $0.10 + 100K x $0.01 + 2K x $0.50 = 0.0172 + 0.001 + 0.001
    assert _cost("openai", "gpt-6-luna", at) == Decimal("0.0192")


def test_an_unpriced_tier_makes_the_cost_unknown_not_the_base_price() -> None:
    cost = attempt_cost(CATALOG["openai"], "gpt-6.1-sol", {"prompt_tokens": 400_000})
    assert cost.amount is None
    assert "400000 prompt tokens" in cost.unknown


# --- Anthropic (Messages usage) ------------------------------------------------------------
# Prices: https://platform.claude.com/docs/zh-CN/models/opus-5-5/overview, read 2026-12-06
# (Claude Opus 5.5: $4 input, $5 5-minute writes, $8 1-hour writes, $0.20 hits, $20 output).
# input_tokens excludes cache reads and writes; cache_creation splits writes by lifetime.
ANTHROPIC_USAGE = {
    "input_tokens": 50,
    "cache_read_input_tokens": 100_000,
    "cache_creation_input_tokens": 20_000,
    "cache_creation": {"ephemeral_5m_input_tokens": 5_000, "ephemeral_1h_input_tokens": 15_000},
    "output_tokens": 1_000,
}


def test_anthropic_cache_reads_and_both_write_lifetimes() -> None:
    # 50 x $4 + 100K x $0.20 + 5K x $5 + 15K x $8 + 1K x $20, per 1M
    # = 0.0002 + 0.02 + 0.025 + 0.12 + 0.02
    cost = attempt_cost(CATALOG["anthropic"], "claude-opus-5-5", ANTHROPIC_USAGE)
    assert cost.amount == Decimal("0.1852")
    assert cost.currency == "USD" and cost.estimated == ()
    assert [line.token_class for line in cost.lines] == [
        "input",
        "cache_read",
        "cache_write",
        "cache_write_1h",
        "output",
    ]


def test_anthropic_writes_without_the_lifetime_split_are_5_minute_writes() -> None:
    usage = {"input_tokens": 0, "cache_creation_input_tokens": 1_000, "output_tokens": 0}
    # 1K x $5 (Claude Opus 5.5's 5-minute write) = 0.005
    assert _cost("anthropic", "claude-opus-5-5", usage) == Decimal("0.005")


# Prices: https://platform.claude.com/docs/en/models/haiku-5-5/overview, read 2026-12-06 (with
# third-party copies for the cache rates): prompts up to 100K $0.10 / $0.01 hits / $0.50; over
# 100K (input, reads and writes counted) $0.50 / $0.05 / $2.50 on every token of the request.
def test_anthropic_haiku_long_prompt_counts_cache_reads_toward_the_threshold() -> None:
    over = {"input_tokens": 80_000, "cache_read_input_tokens": 30_000, "output_tokens": 500}
    # 110K prompt tokens: 80K x $0.50 + 30K x $0.05 + 500 x $2.50 = 0.04 + 0.0015 + 0.00125
    assert _cost("anthropic", "claude-haiku-5-5", over) == Decimal("0.04275")
    under = {**over, "cache_read_input_tokens": 10_000}
    # 90K: 80K x $0.10 + 10K x $0.01 + 500 x $0.50 = 0.008 + 0.0001 + 0.00025
    assert _cost("anthropic", "claude-haiku-5-5", under) == Decimal("0.00835")


# --- DeepSeek ------------------------------------------------------------------------------
# Prices: https://api-docs.deepseek.com/quick_start/pricing, read 2026-12-06: deepseek-v4-pro
# peak $0.044 hit / $1.32 miss / $3.96 output (off-peak half). Usage fields:
# https://api-docs.deepseek.com/guides/kv_cache (prompt_cache_hit_tokens + miss = prompt_tokens).
def test_deepseek_cache_hits_and_reasoning_at_the_peak_rate() -> None:
    usage = {
        "prompt_tokens": 10_000,
        "prompt_cache_hit_tokens": 8_000,
        "prompt_cache_miss_tokens": 2_000,
        "completion_tokens": 3_000,
        "completion_tokens_details": {"reasoning_tokens": 2_500},
    }
    cost = attempt_cost(CATALOG["deepseek"], "deepseek-v4-pro", usage)
    # 8K x $0.044 + 2K x $1.32 + 3K x $3.96 = 0.000352 + 0.00264 + 0.01188
    assert cost.amount == Decimal("0.014872")
    assert cost.estimated == ("peak rate; off-peak hours cost half",)


# --- Gemini (OpenAI-compatible endpoint) ---------------------------------------------------
# Prices: https://ai.google.dev/gemini-api/docs/pricing, read 2026-12-06 through copies: Gemini
# 3.8 Flash $0.75 input / $3.75 output (thinking included) through 2026-12-31. Usage shape from
# https://discuss.ai.google.dev/t/question-with-usage-in-openai-compatibility/98760 (2025-08):
# completion_tokens leaves the thinking out; total_tokens has it.
def test_gemini_thinking_outside_completion_tokens_is_billed_as_output() -> None:
    usage = {"prompt_tokens": 758, "completion_tokens": 102, "total_tokens": 1725}
    # output = 1725 - 758 = 967: 758 x $0.75 + 967 x $3.75 = 0.0005685 + 0.00362625
    assert _cost("gemini", "gemini-3.8-flash", usage) == Decimal("0.00419475")
    same = {**usage, "completion_tokens": 967}  # an endpoint that counts thinking in completion
    assert _cost("gemini", "gemini-3.8-flash", same) == Decimal("0.00419475")


def test_a_promotional_price_is_unknown_after_its_last_day() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    day = datetime.date(2027, 1, 2)
    cost = attempt_cost(CATALOG["gemini"], "gemini-3.8-flash", usage, day=day)
    assert cost.amount is None and "until 2026-12-31" in cost.unknown
    assert _cost("gemini", "gemini-3.8-flash", usage, day=datetime.date(2026, 12, 31))


# --- Unknown prices and malformed usage ----------------------------------------------------
@pytest.mark.parametrize(
    ("provider", "model"),
    [("openai", "gpt-6.1-terra"), ("groq", "openai/gpt-oss-20b"), ("openai", "gpt-nope")],
)
def test_a_model_without_a_price_is_unknown_never_zero(provider: str, model: str) -> None:
    cost = attempt_cost(CATALOG[provider], model, {"prompt_tokens": 5, "completion_tokens": 5})
    assert cost.amount is None and cost.unknown == f"no price known for {model}"


def test_tokens_of_a_class_without_a_price_make_the_cost_unknown() -> None:
    price = ModelPrice(input=Decimal(1), output=Decimal(2))
    cost = cost_of(TokenUsage(input=10, cache_read=5), price, model="m")
    assert cost.amount is None and cost.unknown == "no cached_input price known for m"


@pytest.mark.parametrize(
    ("usage", "message"),
    [
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}, "more than"),
        ({"prompt_tokens": -1}, "usage.prompt_tokens: expected a whole number"),
        ({"prompt_tokens": 2.5}, "usage.prompt_tokens: expected a whole number"),
        ({"prompt_tokens": True}, "usage.prompt_tokens: expected a whole number"),
    ],
)
def test_malformed_usage_is_named(usage: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        read_usage(usage, CATALOG["openai"].usage_fields)
    cost = attempt_cost(CATALOG["openai"], "gpt-6.1-sol", usage)
    assert cost.amount is None and message in cost.unknown


def test_sums_of_many_small_costs_do_not_drift() -> None:
    price = ModelPrice(input=Decimal("0.1"), output=Decimal("0.3"))
    one = cost_of(TokenUsage(input=1, output=1), price, model="m").amount
    assert one is not None
    assert sum([one] * 1_000_000, Decimal(0)) == Decimal("0.4")  # floats give 0.39999999...


def test_reasoning_priced_apart_is_never_counted_twice() -> None:
    price = ModelPrice(input=Decimal(1), output=Decimal(10), reasoning=Decimal(20))
    cost = cost_of(TokenUsage(input=0, output=1_000, reasoning=400), price, model="m")
    # 600 answer tokens x $10 + 400 reasoning x $20 = 0.006 + 0.008
    assert cost.amount == Decimal("0.014")


# --- Config overrides ----------------------------------------------------------------------
def test_a_config_price_replaces_the_catalogs_for_that_model_only() -> None:
    provider = resolve_provider(
        "deepseek",
        {"api_key": "k", "prices": {"deepseek-v4-pro": {"input": 1, "output": 2}}},
    )
    usage = {"prompt_tokens": 1_000, "completion_tokens": 1_000}
    assert attempt_cost(provider.spec, "deepseek-v4-pro", usage).amount == Decimal("0.003")
    # the catalog's flash price is kept: 1K x $0.30 + 1K x $1.20
    assert attempt_cost(provider.spec, "deepseek-v4-flash", usage).amount == Decimal("0.0015")


def test_a_self_hosted_server_priced_by_gpu_hour() -> None:
    # $3.60 an hour at 1,000 tokens a second: 3.6M tokens an hour, $1.00 a million tokens
    provider = resolve_provider(
        "sglang",
        {
            "base_url": "http://127.0.0.1:30000/v1",
            "prices": {"*": {"gpu_hour": {"usd": 3.60, "tokens_per_second": 1000}}},
        },
    )
    usage = {"prompt_tokens": 1_500, "completion_tokens": 500}
    cost = attempt_cost(provider.spec, "any-model", usage)
    assert cost.amount == Decimal("0.002")
    assert cost.estimated == ("GPU time at the stated throughput",)


def test_a_config_names_where_its_server_reports_cached_tokens() -> None:
    usage_fields = {
        "prompt": "usage_in",
        "prompt_includes_cache": True,
        "cache_read": "usage_cached",
        "completion": "usage_out",
    }
    price = {"input": 1, "cached_input": "0.5", "output": 2}
    provider = resolve_provider(
        "vllm",
        {"base_url": "http://127.0.0.1:8000/v1", "usage": usage_fields, "prices": {"*": price}},
    )
    usage = {"usage_in": 1_000, "usage_cached": 600, "usage_out": 100}
    # 400 x $1 + 600 x $0.50 + 100 x $2 = 0.0004 + 0.0003 + 0.0002
    assert attempt_cost(provider.spec, "m", usage).amount == Decimal("0.0009")


def test_a_free_server_costs_zero_when_the_config_says_so() -> None:
    provider = resolve_provider(
        "ollama", {"prices": {"*": {"input": 0, "output": 0, "cached_input": 0}}}
    )
    usage = {"prompt_tokens": 10, "completion_tokens": 10}
    assert attempt_cost(provider.spec, "llama", usage).amount == Decimal(0)


@pytest.mark.parametrize(
    ("price", "message"),
    [
        ({"input": -1, "output": 1}, "prices.m.input: "),
        ({"input": 1}, "prices.m: Value error, a price needs input and output"),
        ({"input": "lots", "output": 1}, "prices.m.input: Input should be a valid decimal"),
        ({"input": 1, "output": 1, "currency": "EUR"}, "prices.m.currency: expected 'USD'"),
        (
            {"input": 1, "output": 1, "tiers": [{"above_prompt_tokens": 9, "input": 1}]},
            "a tier needs input and output",
        ),
        (
            {"input": 1, "output": 1, "tiers": [{"above_prompt_tokens": 9, "priced": False}] * 2},
            "above_prompt_tokens must increase",
        ),
        ({"input": 1, "output": 1, "gpu_hour": {"usd": 1, "tokens_per_second": 1}}, "gpu_hour"),
    ],
)
def test_a_bad_price_is_refused_naming_the_file_and_key(
    price: dict[str, Any], message: str
) -> None:
    data = {"base_url": "https://api.x.test/v1", "prices": {"m": price}}
    with pytest.raises(CatalogError) as raised:
        parse_provider("x", data, source="providers/x.toml")
    assert "providers/x.toml: prices.m" in str(raised.value) and message in str(raised.value)
    with pytest.raises(ConfigError) as raised_config:
        resolve_provider("deepseek", {"api_key": "k", "prices": {"m": price}})
    assert "providers.deepseek.prices.m" in str(raised_config.value)
    assert message in str(raised_config.value)
