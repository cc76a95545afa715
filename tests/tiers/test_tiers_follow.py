"""The routing stage of tiered names beyond one decision: a chat follow-up keeps its
conversation's tier, an unsure request is hedged across two tiers, and a request's
``ttft_target_ms`` moves it to a faster tier its class allows (docs/tiers.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("wordllama")

import llmroute
from llmroute._dispatch import Posted
from llmroute._tiers import ConversationMemory, TieredModel, conversation_of
from llmroute.config import ConfigError, load_config, resolve
from llmroute.routing.stats import LiveStats
from llmroute.server import Gateway
from llmroute.testing import Simulator
from llmroute.tiers._model import Decision

from ..clock import FakeClock
from ..conftest import KEY
from . import test_tiers_routing
from .test_tiers_routing import (
    HARD,
    LARGE,
    SIMPLE,
    SMALL,
    _load,
    ask,
    client_for,
    config_for,
)

artefact = test_tiers_routing.artefact  # fixtures (a fitted classifier, a gateway), shared
gateway = test_tiers_routing.gateway


REPLY = [{"role": "assistant", "content": "Here is the plan: first the proof, then the code."}]
YES = [{"role": "user", "content": "yes, do it"}]


def record(stats: LiveStats, target: str, seconds: float, n: int = 40) -> None:
    """Recorded samples: ``n`` first tokens (and whole answers) of ``seconds`` each."""
    window = stats.target(target)
    for _ in range(n):
        window.record_ttft(seconds, 0)
        window.record_latency(seconds)


class Labels:
    """A classifier stand-in: the class (and its probability) by the last user turn's text."""

    def __init__(self, by_text: dict[str, tuple[str, float]], default: str = "simple") -> None:
        self.by_text, self.default = by_text, default
        self.calls = 0

    def decide(self, body: Any, band: float | None) -> Decision:
        self.calls += 1
        last = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        label, p = self.by_text.get(last, (self.default, 0.9))
        other = "hard" if label == "simple" else "simple"
        return Decision(label, p, p < (band or 0.6), "classifier", 1.0, {label: p, other: 1 - p})


def tiered(**auto: Any) -> TieredModel:
    """A tiered name with a third tier (chat-medium) its classes may allow; not built."""
    table = {
        "providers": {"sim": {"base_url": "https://127.0.0.1:9/v1", "api_key": KEY}},
        "models": {
            "chat-small": {"targets": [SMALL]},
            "chat-medium": {"targets": ["sim:medium-model"]},
            "chat-large": {"targets": [LARGE]},
            "auto": {
                "tiers": {"simple": "chat-small", "hard": "chat-large"},
                "default": "chat-large",
                "classes": {"simple": {"examples": ["hi"]}, "hard": {"examples": ["prove"]}},
                **auto,
            },
        },
    }
    loaded = load_config(table)
    assert loaded is not None
    return TieredModel(resolve(loaded).tiered["auto"])


# -- conversations: pure parts ---------------------------------------------------------------


def test_a_follow_up_names_its_earlier_turn_by_hashes_only() -> None:
    first = conversation_of({"messages": HARD})
    assert first is not None and first.earlier is None and len(first.own) == 16
    # The application sends the answer back with fields of its own: they do not count.
    answer = {**REPLY[0], "refusal": None, "annotations": []}
    then = conversation_of({"messages": [*HARD, answer, *YES]})
    assert then is not None and then.earlier == first.own and then.cut == 1
    other = conversation_of({"messages": [*SIMPLE, *REPLY, *YES]})
    assert other is not None and other.earlier != first.own
    # Parts and a long text are hashed bounded, and still tell contents apart.
    long_a = {"messages": [{"role": "user", "content": "a" * 50_000}]}
    long_b = {"messages": [{"role": "user", "content": "a" * 50_001}]}
    assert conversation_of(long_a) != conversation_of(long_b)
    assert conversation_of({"messages": "nope"}) is None


def test_hashing_a_crafted_body_reads_a_bounded_part_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import llmroute._tiers as tiers

    calls = [0]
    real = tiers._feed

    def counted(*args: Any) -> None:
        calls[0] += 1
        real(*args)

    monkeypatch.setattr(tiers, "_feed", counted)
    for n in (1_000, 100_000):
        calls[0] = 0
        parts = [{"type": "text", "text": "a"}] * n
        assert conversation_of({"messages": [{"role": "user", "content": parts}, *YES]})
        assert calls[0] <= 2 * (tiers._NODES + 2)  # two digests, whatever the body's size
    nested: Any = "deep"
    for _ in range(5_000):  # deeper than the interpreter's recursion limit
        nested = {"text": nested}
    assert conversation_of({"messages": [{"role": "user", "content": [nested]}]})


def test_the_memory_is_bounded_in_size_and_time() -> None:
    clock = FakeClock()
    memory = ConversationMemory(size=3, ttl=60, clock=clock)
    for i in range(5):
        memory.put(bytes([i]) * 16, f"tier{i}")
    assert len(memory) == 3 and memory.get(bytes([0]) * 16) is None
    assert memory.get(bytes([4]) * 16) == "tier4"
    clock.advance(61)
    assert memory.get(bytes([4]) * 16) is None
    memory.put(b"x" * 16, "tier")  # writes drop expired entries too
    assert len(memory) <= 2


def test_a_short_reply_never_drops_below_its_conversations_tier() -> None:
    model = tiered()
    model.classifier = Labels({HARD[0]["content"]: ("hard", 0.95)})
    first = {"messages": HARD}
    served = model.decide(first, conversation=conversation_of(first))
    assert (served.tier, served.reason) == ("chat-large", "classifier")
    model.remember(conversation_of(first), served)
    then = {"messages": [*HARD, *REPLY, *YES]}
    kept = model.decide(then, conversation=conversation_of(then))
    assert (kept.tier, kept.reason, kept.label, kept.chosen) == (
        "chat-large",
        "conversation",
        "simple",
        "chat-small",
    )
    assert model.classifier.calls == 2  # remembered: the earlier turns are not classified again
    # Without memory (a fresh process, another replica): the classifier's tier of the turns
    # before the last answer is the floor.
    fresh = tiered()
    fresh.classifier = Labels({HARD[0]["content"]: ("hard", 0.95)})
    again = fresh.decide(then, conversation=conversation_of(then))
    assert (again.tier, again.reason) == ("chat-large", "conversation")
    assert fresh.classifier.calls == 2
    # A conversation that stayed simple stays simple; an override is never held down or up.
    small = {"messages": [*SIMPLE, *REPLY, *YES]}
    assert fresh.decide(small, conversation=conversation_of(small)).tier == "chat-small"
    forced = fresh.decide(then, "chat-small", conversation=conversation_of(then))
    assert (forced.tier, forced.reason) == ("chat-small", "override")


# -- conversations through the client and the gateway -----------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_follow_up_stays_on_the_tier_its_conversation_reached(
    sim: Simulator, artefact: Path, stream: bool
) -> None:
    async with client_for(sim, config_for(sim, classifier=str(artefact))) as client:
        escalated = await ask(client, SIMPLE, stream, extra_body={"llmroute": {"tier": "hard"}})
        assert escalated.winner == LARGE
        then = await ask(client, [*SIMPLE, *REPLY, *YES], stream)
        assert then.winner == LARGE
        assert (then.tier.reason, then.tier.chosen) == ("conversation", "chat-small")
        # The next turn builds on that one: still the large tier.
        later = await ask(client, [*SIMPLE, *REPLY, *YES, *REPLY, *YES], stream)
        assert later.winner == LARGE and later.tier.reason == "conversation"
        # Another conversation, simple from its start, is not held up.
        other = [{"role": "user", "content": "good morning!"}, *REPLY, *YES]
        assert (await ask(client, other, stream)).winner == SMALL
        memory = client._llmroute.tiered["auto"].memory
        assert all(len(key) == 16 for key in memory._entries)  # hashes, never text
        text = client.metrics.exposition().decode()
        assert 'reason="conversation",tier="chat-large"} 2.0' in text


def test_the_gateway_keeps_a_conversation_on_its_tier(gateway: Gateway) -> None:
    headers = {"authorization": "Bearer gw-ci-key-0123456789abcdef"}
    url = gateway.base_url + "/chat/completions"
    with httpx.Client(timeout=60) as http:
        first = {"model": "auto", "messages": SIMPLE, "llmroute": {"tier": "hard"}}
        assert http.post(url, headers=headers, json=first).headers["x-llmroute-tier"] == (
            "chat-large"
        )
        body = {"model": "auto", "messages": [*SIMPLE, *REPLY, *YES], "stream": True}
        then = http.post(url, headers=headers, json=body)
        assert then.status_code == 200 and then.headers["x-llmroute-tier"] == "chat-large"
        other = [{"role": "user", "content": "good morning!"}, *REPLY, *YES]
        fresh = http.post(url, headers=headers, json={"model": "auto", "messages": other})
        assert fresh.headers["x-llmroute-tier"] == "chat-small"


# -- hedging across tiers when unsure --------------------------------------------------------


def hedging(sim: Simulator, artefact: Path, small: str = SMALL) -> dict[str, Any]:
    config = config_for(sim, classifier=str(artefact), uncertain_below=1.0, uncertain="hedge")
    config["providers"]["stall"] = {
        "base_url": sim.base_url,
        "api_key": KEY,
        "headers": {"x-sim-fault": "hang"},
    }
    config["models"]["chat-small"] = {"targets": [small]}
    # A cold target's p95 is the prior's (~0.11 s here): the hedge delay of a stalled small
    # tier without samples, whose first-token deadline stays the route's 30 s.
    config["routing"]["ttft_prior"] = 0.05
    return config


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_an_unsure_request_on_a_stalled_small_tier_is_answered_by_the_large(
    sim: Simulator, artefact: Path, stream: bool
) -> None:
    stalled = "stall:small-model"
    async with client_for(sim, hedging(sim, artefact, stalled)) as client:
        report = await ask(client, SIMPLE, stream)
        assert report.winner == LARGE and report.hedges == 1
        assert [(a.target, a.reason, a.outcome) for a in report.attempts] == [
            (stalled, "first", "cancelled"),
            (LARGE, "hedge", "won"),
        ]
        tier = report.tier
        assert (tier.reason, tier.tier, tier.hedged) == (
            "hedged",
            "chat-large",
            ("chat-small", "chat-large"),
        )
        assert report.route == "chat-large"
        text = client.metrics.exposition().decode()
        assert 'llmroute_tier_hedged_answers_total{model="auto",tier="chat-large"} 1.0' in text
        assert 'reason="hedged",tier="chat-small"} 1.0' in text


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_an_unsure_request_answered_by_the_small_tier_never_starts_the_large(
    sim: Simulator, artefact: Path, stream: bool
) -> None:
    async with client_for(sim, hedging(sim, artefact)) as client:
        record(client._llmroute.router.stats, SMALL, 600.0)  # a hedge delay never reached
        report = await ask(client, SIMPLE, stream)
        assert report.winner == SMALL and report.hedges == 0
        assert [a.target for a in report.attempts] == [SMALL]
        assert (report.tier.reason, report.tier.tier) == ("hedged", "chat-small")
        text = client.metrics.exposition().decode()
        assert 'llmroute_tier_hedged_answers_total{model="auto",tier="chat-small"} 1.0' in text


def test_the_sync_client_hedges_across_tiers(sim: Simulator, artefact: Path) -> None:
    stalled = "stall:small-model"
    with llmroute.OpenAI(
        api_key=KEY,
        base_url=sim.base_url,
        verify=sim.ssl_context(),
        config=hedging(sim, artefact, stalled),
    ) as client:
        messages: Any = SIMPLE
        done: Any = client.chat.completions.create(model="auto", messages=messages)
        assert done.route.winner == LARGE and done.route.tier.tier == "chat-large"
        stream: Any = client.chat.completions.create(model="auto", messages=messages, stream=True)
        assert sum(1 for _ in stream) > 0 and stream.route.winner == LARGE
        assert stream.route.tier.reason == "hedged"


@pytest.mark.anyio
async def test_a_responses_call_hedges_across_tiers_too(sim: Simulator, artefact: Path) -> None:
    stalled = "stall:small-model"
    config = hedging(sim, artefact, stalled)
    for provider in ("sim", "stall"):
        config["providers"][provider] |= {"responses": True}
    async with client_for(sim, config) as client:
        answer: Any = await client.responses.create(
            model="auto", input=SIMPLE[0]["content"], stream=True
        )
        async for _ in answer:
            pass
        report = answer.route
        assert report.winner == LARGE and report.hedges == 1
        assert (report.tier.reason, report.tier.tier) == ("hedged", "chat-large")


@pytest.mark.anyio
async def test_no_hedge_onto_a_tier_that_cannot_serve_the_api(
    sim: Simulator, artefact: Path
) -> None:
    config = hedging(sim, artefact)
    config["models"]["auto"]["default"] = "chat-small"
    config["providers"]["sim"] |= {"responses": True}
    config["providers"]["chatonly"] = {"base_url": sim.base_url, "api_key": KEY}
    config["models"]["chat-large"] = {"targets": ["chatonly:large-model"]}
    async with client_for(sim, config) as client:
        done: Any = await client.responses.create(model="auto", input=SIMPLE[0]["content"])
        tier = done.route.tier
        assert done.route.winner == SMALL
        assert (tier.reason, tier.tier, tier.hedged) == ("default", "chat-small", None)
        assert tier.error == "route 'chat-large' cannot serve the responses API"


def test_the_gateway_names_the_tier_a_hedge_was_answered_by(sim: Simulator, artefact: Path) -> None:
    config = {
        **hedging(sim, artefact, "stall:small-model"),
        "gateway": {"keys": {"ci": "GW_KEY_CI"}},
    }
    env = {"GW_KEY_CI": "gw-ci-key-0123456789abcdef"}
    headers = {"authorization": "Bearer gw-ci-key-0123456789abcdef"}
    with (
        Gateway(config, environ=env, verify=sim.ssl_context(), max_retries=0) as gateway,
        httpx.Client(timeout=60) as http,
    ):
        url = gateway.base_url + "/chat/completions"
        for stream in (False, True):
            body = {"model": "auto", "messages": SIMPLE, "stream": stream}
            answer = http.post(url, headers=headers, json=body)
            assert answer.status_code == 200
            assert answer.headers["x-llmroute-tier"] == "chat-large"


def test_a_hedge_pair_is_the_two_most_probable_tiers_smaller_first() -> None:
    model = tiered(uncertain="hedge", uncertain_below=0.8)
    model.classifier = Labels({"x": ("hard", 0.7)})
    decision = model.decide({"messages": [{"role": "user", "content": "x"}]})
    assert (decision.reason, decision.tier, decision.hedged) == (
        "hedged",
        "chat-small",
        ("chat-small", "chat-large"),
    )
    assert decision.chosen == "chat-large"
    one = tiered(uncertain="hedge", tiers={"simple": "chat-small", "hard": "chat-small"})
    one.classifier = Labels({"x": ("hard", 0.55)})
    alike = one.decide({"messages": [{"role": "user", "content": "x"}]})
    assert (alike.reason, alike.tier, alike.hedged) == ("default", "chat-large", None)
    plain = tiered(uncertain_below=0.8)  # the default: unsure goes to the default tier
    plain.classifier = Labels({"x": ("simple", 0.7)})
    assert plain.decide({"messages": [{"role": "user", "content": "x"}]}).reason == "default"


# -- latency in the choice -------------------------------------------------------------------


def test_a_ttft_target_moves_a_request_to_a_faster_allowed_tier() -> None:
    three = {"simple": "chat-small", "medium": "chat-medium", "hard": "chat-large"}
    classes = {
        "simple": {"examples": ["hi"]},
        "medium": {"examples": ["m"]},
        "hard": {"examples": ["x"], "allow": ["chat-medium", "chat-small"]},
    }
    model = tiered(tiers=three, classes=classes)
    model.classifier = Labels({"x": ("hard", 0.9)})
    body = {"messages": [{"role": "user", "content": "x"}]}
    p95 = {"chat-small": 0.2, "chat-medium": 0.8, "chat-large": 3.0}  # recorded elsewhere
    moved = model.decide(body, ttft_target=1.0, p95=p95.__getitem__)
    assert (moved.tier, moved.reason, moved.chosen) == ("chat-medium", "latency", "chat-large")
    met = model.decide(body, ttft_target=5.0, p95=p95.__getitem__)
    assert (met.tier, met.reason) == ("chat-large", "classifier")
    none_meets = model.decide(body, ttft_target=0.1, p95=p95.__getitem__)
    assert none_meets.tier == "chat-large"
    # A class that allows nothing else (the default) keeps its tier whatever the goal.
    simple = model.decide(
        {"messages": [{"role": "user", "content": "hi"}]}, ttft_target=0.01, p95=p95.__getitem__
    )
    assert (simple.tier, simple.reason) == ("chat-small", "classifier")


@pytest.mark.anyio
async def test_a_ttft_target_reads_the_tiers_live_p95(sim: Simulator, artefact: Path) -> None:
    config = config_for(sim, classifier=str(artefact))
    config["models"]["auto"]["classes"] = {"hard": {"allow": ["chat-small"]}}
    async with client_for(sim, config) as client:
        stats = client._llmroute.router.stats
        record(stats, LARGE, 4.0)
        record(stats, SMALL, 0.1)
        goal = {"llmroute": {"ttft_target_ms": 1000}}
        report = await ask(client, HARD, True, extra_body=goal)
        assert report.winner == SMALL
        assert (report.tier.reason, report.tier.chosen) == ("latency", "chat-large")
        # Without a goal, or with one the large tier meets, the class's own tier.
        assert (await ask(client, HARD, True)).winner == LARGE
        lax = {"llmroute": {"ttft_target_ms": 60_000}}
        assert (await ask(client, HARD, False, extra_body=lax)).tier.reason == "classifier"
        body = {"model": "auto", "messages": HARD, "llmroute": {"ttft_target_ms": 1000}}
        call = client._llmroute.classify(
            Posted("/chat/completions", body), timeout=httpx.Timeout(5)
        )
        assert call is not None and call.tiered is not None
        decided = await client._llmroute.tier(call)
        assert decided is not None and decided.tier == "chat-small"


def test_a_wrong_allowed_tier_is_a_sentence_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        _load(
            {
                "classes": {
                    "simple": {"examples": ["hi"]},
                    "hard": {"examples": ["x"], "allow": ["chat-smal"]},
                }
            }
        )
    assert (
        "models.auto.classes.hard.allow[0]: 'chat-smal' is not a tier of models.auto "
        "(one of: 'chat-large', 'chat-small') (did you mean 'chat-small'?)"
    ) in str(info.value)
    with pytest.raises(ConfigError, match=r"models\.auto\.uncertain: "):
        _load(
            {
                "classes": {"simple": {"examples": ["hi"]}, "hard": {"examples": ["x"]}},
                "uncertain": "race",
            }
        )
    # allow alone (beside a fitted classifier or an examples file) is no empty class
    _load(
        {
            "examples": str(Path(__file__).parents[1] / "data" / "tiers_small.jsonl"),
            "classes": {"hard": {"allow": ["chat-small"]}},
        }
    )


_odd = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.text(max_size=8),
    st.sampled_from(["chat-small", "chat-large", "auto", "hedge", "default", "simple"]),
    st.lists(st.sampled_from(["chat-small", "chat-large", "auto", "", "x"]), max_size=3),
    st.dictionaries(st.sampled_from(["allow", "examples", "x"]), st.text(max_size=4), max_size=2),
)


@settings(max_examples=100, deadline=None)
@given(uncertain=_odd, allow=_odd)
def test_hostile_uncertain_and_allow_raise_only_config_errors(uncertain: Any, allow: Any) -> None:
    table = {
        "uncertain": uncertain,
        "classes": {"simple": {"examples": ["hi"]}, "hard": {"examples": ["x"], "allow": allow}},
    }
    try:
        _load(table)
    except ConfigError as exc:
        assert str(exc).startswith("config: models.auto"), str(exc)
        assert "validation error" not in str(exc).lower()
