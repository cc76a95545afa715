"""A key's settings through one gateway (in memory): ``max_tokens`` bounds and defaults, the
latency goal given to its requests, its objective's counts in ``/metrics``, and its usage as the
admin sees it. The limits across replicas are in test_gateway_tenants.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmroute.server import Gateway
from llmroute.server._checks import default_goal as _default_goal
from llmroute.testing import Profile, Simulator

KEYS = {"app": "gw-keys-app-0123456789", "ops": "gw-keys-ops-0123456789"}
ENVIRON = {"GW_APP": KEYS["app"], "GW_OPS": KEYS["ops"]}
MESSAGES = [{"role": "user", "content": "Tell me about keys."}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with Simulator(profile=Profile(reply_tokens=30, inter_token=0.0), tls=False) as sim:
        config: dict[str, Any] = {
            "providers": {"sim": {"base_url": sim.base_url, "api_key": "sk-keys-upstream-01"}},
            "models": {"chat": {"targets": ["sim:m"]}, "slow": {"targets": ["sim:s"]}},
            "gateway": {
                "keys": {"app": "GW_APP", "ops": "GW_OPS"},
                "limits": {"max_tokens": 20, "tpm": 100_000},
                "tenants": {
                    "app": {"default_max_tokens": 7, "slo_ttft_ms": 60_000},
                    "ops": {"admin": True},
                },
                "slos": {"slow": {"ttft_ms": 0.001, "percentile": 99}},
            },
        }
        with Gateway(config, environ=ENVIRON, max_retries=0) as server:
            yield server


def _client(gateway: Gateway, key: str = "app") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=KEYS[key], max_retries=0)


def _root(gateway: Gateway) -> str:
    return gateway.base_url.removesuffix("/v1")


def test_a_request_above_the_keys_max_tokens_is_refused_naming_the_field(
    gateway: Gateway,
) -> None:
    client = _client(gateway)
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="chat", messages=MESSAGES, **{field: 21})  # type: ignore[call-overload]
        assert refused.value.body["param"] == field  # type: ignore[index]
        assert refused.value.body["code"] == "invalid_value"  # type: ignore[index]
        assert "limit of 20" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="chat", input="hi", max_output_tokens=50)
    assert refused.value.body["param"] == "max_output_tokens"  # type: ignore[index]
    answer = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=20)
    assert answer.usage is not None and answer.usage.completion_tokens == 20


def test_a_request_naming_no_limit_gets_the_keys_default(gateway: Gateway) -> None:
    answer = _client(gateway).chat.completions.create(model="chat", messages=MESSAGES)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 7


def test_a_stream_is_counted_from_usage_the_client_never_sees(gateway: Gateway) -> None:
    def tokens() -> dict[str, int]:
        usage = httpx.get(
            _root(gateway) + "/admin/usage", headers={"authorization": f"Bearer {KEYS['ops']}"}
        ).json()
        app = usage["keys"]["app"]
        return {k: app[k] for k in ("prompt_tokens", "completion_tokens", "requests")}

    before = tokens()
    reply = _client(gateway).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, stream=True, max_tokens=12
    )
    assert reply.headers["x-ratelimit-limit-tokens"] == "100000"
    chunks = list(reply.parse())
    assert all(chunk.usage is None for chunk in chunks)  # not asked for: never shown
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 12
    after = tokens()
    assert after["requests"] == before["requests"] + 1
    assert after["completion_tokens"] == before["completion_tokens"] + 12
    assert after["prompt_tokens"] > before["prompt_tokens"]  # the simulator's own count


def test_a_stream_without_usage_counts_the_tokens_it_delivered(gateway: Gateway) -> None:
    """A completions stream whose client asked no usage (none is asked upstream for it): the
    key's completion tokens are the chunks that carried text, not every chunk (the last one
    carries only the finish reason; counting it made 8 tokens 9)."""

    def completion_tokens() -> int:
        usage = httpx.get(
            _root(gateway) + "/admin/usage", headers={"authorization": f"Bearer {KEYS['ops']}"}
        ).json()
        return usage["keys"]["app"]["completion_tokens"]

    before = completion_tokens()
    chunks = list(
        _client(gateway).completions.create(model="chat", prompt="hi", stream=True, max_tokens=5)
    )
    texts = sum(1 for c in chunks if c.choices and c.choices[0].text)
    assert texts == 5 and len(chunks) > texts  # the finish reason comes in a chunk of its own
    for _ in range(100):  # a hang guard only: counted once the stream's request ended
        if completion_tokens() != before:
            break
    assert completion_tokens() == before + texts


def test_only_an_admin_key_reads_usage(gateway: Gateway) -> None:
    refused = httpx.get(
        _root(gateway) + "/admin/usage", headers={"authorization": f"Bearer {KEYS['app']}"}
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert httpx.get(_root(gateway) + "/admin/usage").status_code == 401
    usage = httpx.get(
        _root(gateway) + "/admin/usage", headers={"authorization": f"Bearer {KEYS['ops']}"}
    ).json()
    assert set(usage["keys"]) == {"app", "ops"}
    assert usage["keys"]["app"]["limits"]["tpm"] == 100_000
    text = json.dumps(usage)
    assert all(key not in text for key in KEYS.values())


def _samples(gateway: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(
        _root(gateway) + "/metrics", headers={"authorization": f"Bearer {KEYS['ops']}"}
    ).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("llmroute_gateway_slo_"):
                out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_objectives_count_per_key_and_route(gateway: Gateway) -> None:
    def count(name: str, key: str, route: str) -> float:
        labels = (("key", key), ("route", route))
        return _samples(gateway).get((name, labels), 0.0)

    client = _client(gateway)
    mine = count("llmroute_gateway_slo_met_total", "app", "*")
    slow = count("llmroute_gateway_slo_requests_total", "app", "slow")
    client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=3)
    client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=3)
    # The key's own objective (60 s) met twice; the route's (1 µs) seen once, missed.
    assert count("llmroute_gateway_slo_met_total", "app", "*") == mine + 2
    assert count("llmroute_gateway_slo_requests_total", "app", "slow") == slow + 1
    assert count("llmroute_gateway_slo_met_total", "app", "slow") == 0
    labels = (("key", "app"), ("route", "slow"), ("window", "5m"))
    assert _samples(gateway)["llmroute_gateway_slo_burn_rate", labels] == pytest.approx(100.0)
    assert count("llmroute_gateway_slo_requests_total", "ops", "*") == 0  # no objective


def test_a_keys_latency_goal_is_the_requests_unless_it_gives_one() -> None:
    body: dict[str, Any] = {"model": "chat"}
    _default_goal(body, {}, 400.0)
    assert body["llmroute"] == {"ttft_target_ms": 400.0}
    own: dict[str, Any] = {"llmroute": {"ttft_target_ms": 90, "tier": "small"}}
    _default_goal(own, {}, 400.0)
    assert own["llmroute"] == {"ttft_target_ms": 90, "tier": "small"}
    other: dict[str, Any] = {"llmroute": {"tier": "small"}}
    _default_goal(other, {}, 400.0)
    assert other["llmroute"] == {"tier": "small", "ttft_target_ms": 400.0}
    header: dict[str, Any] = {}
    _default_goal(header, {"x-llmroute-ttft-target-ms": "90"}, 400.0)
    assert "llmroute" not in header


def test_with_an_admin_key_a_tenants_key_reads_no_metrics(gateway: Gateway) -> None:
    """/metrics carries every key's figures: once an admin key exists, only it reads them."""
    url = _root(gateway) + "/metrics"
    refused = httpx.get(url, headers={"authorization": f"Bearer {KEYS['app']}"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert "llmroute_gateway" not in refused.text
    shown = httpx.get(url, headers={"authorization": f"Bearer {KEYS['ops']}"})
    assert shown.status_code == 200 and 'key="app"' in shown.text
