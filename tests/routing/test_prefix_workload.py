"""benchmarks/prefix.py's conversation workload (the Mooncake trace's shape: one system prompt
for every user, conversations of several turns, bursty arrivals) at an eighth of its size,
through the prefix policy's own decisions against in-process SGLang stand-in caches: counted,
not timed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from llmroute.routing.policies import PrefixPolicy, RoundRobinPolicy
from llmroute.testing._sglang import prompt_token_list

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SEED = 8
"""One of ten seeds on which the policy before common prefixes and the recent-work tie-break
put 1.53x an even share of the requests on its busiest replica (1.22x now)."""


def load_conversations() -> ModuleType:
    path = BENCHMARKS / "_conversations.py"
    spec = importlib.util.spec_from_file_location("_conversations", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_conversations"] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["_conversations"]
    return module


def test_prefix_routing_keeps_conversations_and_spreads_them_over_eight_replicas() -> None:
    bench = load_conversations()
    work = bench.workload(SEED, 300, scale=1 / 8)  # 64-token blocks, every length an eighth
    tokens = prompt_token_list([*work.first_messages(), {"role": "user", "content": "x"}])
    assert tokens[1] == "system" and tokens[work.block - 1] == "<|im_end|>"  # the first block
    result = bench.simulate(work, PrefixPolicy(), replicas=8, cache_tokens=150_000 // 8)
    assert sum(result.served.values()) == work.requests > 400
    assert 0.25 < result.reuse < 0.5  # the trace: 36.6% of blocks seen before
    assert result.hit_rate >= 0.9 * result.ceiling, (result.hit_rate, result.ceiling)
    assert result.busiest <= 1.3, result.served
    spread = bench.simulate(work, RoundRobinPolicy(), replicas=8, cache_tokens=150_000 // 8)
    assert spread.busiest <= 1.01 and spread.hit_rate < 0.5 * spread.ceiling  # what it avoids
