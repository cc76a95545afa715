"""Tiered model names: a classifier sends each request to the route (tier) it needs, through
the clients and the gateway, with overrides, shadow mode and a default tier on any error."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("wordllama")

import llmroute
from llmroute._dispatch import Posted
from llmroute.config import ConfigError, load_config, resolve
from llmroute.server import Gateway
from llmroute.testing import Simulator
from llmroute.tiers import fit, read_examples

from ..conftest import KEY

DATA = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"
SIMPLE = [{"role": "user", "content": "hi there, how are you?"}]
HARD = [
    {
        "role": "user",
        "content": "Prove that there are infinitely many primes of the form 4k+3, then write "
        "a Python function that lists them with tests:\n```python\ndef primes(n): ...\n```",
    }
]
SMALL, LARGE = "sim:small-model", "sim:large-model"


@pytest.fixture(scope="module")
def artefact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classifier fitted once on the 48 test examples (fitting is the slow part)."""
    path = tmp_path_factory.mktemp("tiers") / "tiers.npz"
    fit(read_examples(DATA)).save(path)
    return path


def config_for(sim: Simulator, **auto: Any) -> dict[str, Any]:
    auto.setdefault("tiers", {"simple": "chat-small", "hard": "chat-large"})
    auto.setdefault("default", "chat-large")
    return {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {
            "chat-small": {"targets": [SMALL]},
            "chat-large": {"targets": [LARGE]},
            "auto": auto,
        },
        "routing": {"explore": 0},
    }


def client_for(sim: Simulator, config: dict[str, Any], **kw: Any) -> llmroute.AsyncOpenAI:
    return llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config, **kw
    )


async def ask(client: llmroute.AsyncOpenAI, messages: Any, stream: bool, **kw: Any) -> Any:
    """The route report of one call, the answer read whole."""
    if stream:
        answer = await client.chat.completions.create(
            model="auto", messages=messages, stream=True, **kw
        )
        async for _ in answer:
            pass
        return answer.route
    done = await client.chat.completions.create(model="auto", messages=messages, **kw)
    assert done.choices[0].message.content
    return done.route


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_simple_prompts_reach_the_small_tier_and_hard_ones_the_large(
    sim: Simulator, artefact: Path, stream: bool
) -> None:
    async with client_for(sim, config_for(sim, classifier=str(artefact))) as client:
        simple = await ask(client, SIMPLE, stream)
        hard = await ask(client, HARD, stream)
        assert simple.winner == SMALL and simple.route == "chat-small"
        assert hard.winner == LARGE and hard.route == "chat-large"
        for report, label in ((simple, "simple"), (hard, "hard")):
            tier = report.tier
            assert tier.model == "auto" and tier.label == label and tier.reason == "classifier"
            assert tier.probability >= 0.6 and tier.micros > 0 and tier.chosen == tier.tier
        text = client.metrics.exposition().decode()
        assert (
            'llmroute_tier_decisions_total{class="simple",model="auto",reason="classifier",'
            'tier="chat-small"} 1.0' in text
        )
        assert 'llmroute_tier_decision_seconds_count{model="auto"} 2.0' in text
        assert 'llmroute_requests_total{outcome="ok",route="auto",source="live"} 2.0' in text


@pytest.mark.anyio
async def test_a_second_client_of_the_same_examples_reads_the_fitted_classifier(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every client (every process: ``llmroute chat --model auto``) fitted its classifier anew;
    the first keeps it in the cache directory and the next reads it."""
    from llmroute.tiers import _cache

    fits: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        fits.append(1)
        return fit(*args, **kwargs)

    monkeypatch.setattr(_cache, "fit", counted)
    monkeypatch.setenv("LLMROUTE_CACHE_DIR", str(tmp_path))
    labels = []
    for _ in range(2):
        async with client_for(sim, config_for(sim, examples=str(DATA))) as client:
            await client.warmup()
            tiered = client._llmroute.tiered["auto"]
            assert tiered.error is None
            labels.append((await ask(client, HARD, False)).tier.label)
    assert fits == [1] and labels == ["hard", "hard"]


@pytest.mark.anyio
async def test_inline_examples_and_a_file_build_the_classifier_at_warmup(sim: Simulator) -> None:
    classes = {"simple": {"examples": ["hello!", "thanks"], "description": "small talk"}}
    config = config_for(sim, examples=str(DATA), classes=classes)
    async with client_for(sim, config) as client:
        tiered = client._llmroute.tiered["auto"]
        assert tiered.classifier is None  # nothing is built before warmup or a request
        await client.warmup()
        assert tiered.classifier is not None and tiered.error is None
        assert tiered.classifier.counts["simple"] == 24 + 3
        assert (await ask(client, SIMPLE, False)).winner == SMALL


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_forces_its_tier_by_class_or_route(
    sim: Simulator, artefact: Path, stream: bool
) -> None:
    async with client_for(sim, config_for(sim, classifier=str(artefact))) as client:
        forced = await ask(client, SIMPLE, stream, extra_body={"llmroute": {"tier": "hard"}})
        assert forced.winner == LARGE
        assert (forced.tier.reason, forced.tier.label, forced.tier.tier) == (
            "override",
            "hard",
            "chat-large",
        )
        by_route = {"llmroute": {"tier": "chat-small", "ttft_target_ms": 5000}}
        assert (await ask(client, HARD, stream, extra_body=by_route)).winner == SMALL
        with pytest.raises(llmroute.BadRequestError, match=r"llmroute\.tier: 'medium'") as info:
            await ask(client, SIMPLE, stream, extra_body={"llmroute": {"tier": "medium"}})
        assert "'simple'" in str(info.value)
        with pytest.raises(llmroute.BadRequestError, match="not a tiered model name"):
            await client.chat.completions.create(
                model="chat-small", messages=SIMPLE, extra_body={"llmroute": {"tier": "hard"}}
            )


def test_the_tier_option_never_goes_upstream(sim: Simulator, artefact: Path) -> None:
    client = client_for(sim, config_for(sim, classifier=str(artefact)))
    body = {"model": "auto", "messages": SIMPLE, "llmroute": {"tier": "hard"}}
    call = client._llmroute.classify(Posted("/chat/completions", body), timeout=httpx.Timeout(5))
    assert call is not None and "llmroute" not in call.body
    assert call.goal_options is None and call.tiered is not None
    assert call.tiered.forced == "chat-large"


@pytest.mark.anyio
async def test_shadow_mode_classifies_and_sends_to_the_default(
    sim: Simulator, artefact: Path
) -> None:
    config = config_for(sim, classifier=str(artefact), default="chat-small", shadow=True)
    async with client_for(sim, config) as client:
        report = await ask(client, HARD, True)
        assert report.winner == SMALL
        tier = report.tier
        assert (tier.reason, tier.label, tier.tier, tier.chosen) == (
            "shadow",
            "hard",
            "chat-small",
            "chat-large",
        )


@pytest.mark.anyio
async def test_an_uncertain_decision_goes_to_the_default(sim: Simulator, artefact: Path) -> None:
    config = config_for(sim, classifier=str(artefact), uncertain_below=1.0)
    async with client_for(sim, config) as client:
        report = await ask(client, SIMPLE, False)
        assert report.winner == LARGE
        assert report.tier.reason == "default" and report.tier.chosen == "chat-small"


@pytest.mark.anyio
async def test_a_classifier_that_fails_never_fails_a_request(
    sim: Simulator, tmp_path: Path, artefact: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"text": "hi", "label": "simple"}\n{"text": "x", "label": "medium"}\n')
    async with client_for(sim, config_for(sim, examples=str(wrong))) as client:
        report = await ask(client, SIMPLE, True)
        assert report.winner == LARGE
        assert report.tier.reason == "error" and report.tier.label is None
        assert "medium" in (report.tier.error or "")
        assert "the classifier cannot be built" in caplog.text
        text = client.metrics.exposition().decode()
        assert 'class="none",model="auto",reason="error",tier="chat-large"} 1.0' in text
    # An artefact without a class of tiers: that tier could never be chosen; refused so.
    three = {"simple": "chat-small", "hard": "chat-large", "medium": "chat-large"}
    config = config_for(sim, classifier=str(artefact), tiers=three)
    async with client_for(sim, config) as client:
        report = await ask(client, SIMPLE, False)
        assert report.winner == LARGE and report.tier.reason == "error"
        assert "has no classes ['medium'] of models.auto.tiers" in (report.tier.error or "")
    # A classifier that raises mid-decision: the default tier again.
    async with client_for(sim, config_for(sim, classifier=str(artefact))) as client:
        await client.warmup()
        tiered = client._llmroute.tiered["auto"]

        class Broken:
            def decide(self, body: Any, band: Any) -> Any:
                raise RuntimeError("boom")

        tiered.classifier = Broken()
        report = await ask(client, SIMPLE, False)
        assert report.winner == LARGE and report.tier.reason == "error"
        assert report.tier.error == "RuntimeError: boom"


@pytest.mark.anyio
async def test_a_cached_answer_carries_its_decision(sim: Simulator, artefact: Path) -> None:
    config = {**config_for(sim, classifier=str(artefact)), "cache": {"backend": "memory"}}
    config["cache"]["min_hits"] = 1
    async with client_for(sim, config) as client:
        first = await ask(client, HARD, False, temperature=0)
        again = await ask(client, HARD, False, temperature=0)
        assert first.winner == LARGE and not first.cache_hit
        assert again.cache_hit and again.tier.tier == "chat-large"
        text = client.metrics.exposition().decode()
        assert 'reason="classifier",tier="chat-large"} 2.0' in text  # once per request


@pytest.mark.anyio
async def test_a_cached_answer_is_found_whatever_tier_served_it(
    sim: Simulator, artefact: Path
) -> None:
    config = {**config_for(sim, classifier=str(artefact)), "cache": {"backend": "memory"}}
    config["cache"]["min_hits"] = 1
    async with client_for(sim, config) as client:
        await client.warmup()
        first = await ask(client, HARD, False, temperature=0)
        assert first.winner == LARGE and not first.cache_hit
        tiered = client._llmroute.tiered["auto"]
        real = tiered.classifier

        class Simple:  # the same request, decided otherwise now (a refitted classifier, say)
            labels = real.labels

            def decide(self, body: Any, band: Any) -> Any:
                decision = real.decide(body, band)
                return dataclasses.replace(decision, label="simple", uncertain=False)

        tiered.classifier = Simple()
        again = await ask(client, HARD, False, temperature=0)
        assert again.cache_hit and again.tier.tier == "chat-small"
        # A call that forces its tier asks that tier: its own key, not the name's answers.
        forced = await ask(
            client, HARD, False, temperature=0, extra_body={"llmroute": {"tier": "chat-small"}}
        )
        assert not forced.cache_hit and forced.winner == SMALL


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_responses_calls_route_by_tier(sim: Simulator, artefact: Path, stream: bool) -> None:
    config = config_for(sim, classifier=str(artefact))
    config["providers"]["sim"] |= {"responses": True}
    async with client_for(sim, config) as client:
        text = HARD[0]["content"]
        if stream:
            answer = await client.responses.create(model="auto", input=text, stream=True)
            async for _ in answer:
                pass
            report = answer.route
        else:
            report = (await client.responses.create(model="auto", input=text)).route
        assert report.winner == LARGE and report.tier.reason == "classifier"


@pytest.mark.anyio
async def test_a_tier_that_cannot_serve_the_api_gives_way_to_the_default(
    sim: Simulator, artefact: Path
) -> None:
    config = config_for(sim, classifier=str(artefact))
    config["providers"]["sim"] |= {"responses": True}
    config["providers"]["chatonly"] = {"base_url": sim.base_url, "api_key": KEY}
    config["models"]["chat-small"] = {"targets": ["chatonly:small-model"]}
    async with client_for(sim, config) as client:
        done = await client.responses.create(model="auto", input=SIMPLE[0]["content"])
        tier = done.route.tier
        assert done.route.winner == LARGE and (tier.reason, tier.label) == ("default", "simple")
        assert tier.error == "route 'chat-small' cannot serve the responses API"
        assert (await ask(client, SIMPLE, False)).winner == "chatonly:small-model"  # chat: it can


@pytest.mark.anyio
async def test_a_responses_follow_up_stays_with_its_conversation(
    sim: Simulator, artefact: Path
) -> None:
    """A follow-up ("thanks") of a hard turn is simple, but only the large tier's target holds
    the response it continues: it goes there, never refused for its classifier's sake."""
    config = config_for(sim, classifier=str(artefact))
    config["providers"]["sim"] |= {"responses": True, "responses_stored": True}
    async with client_for(sim, config) as client:
        first = await client.responses.create(model="auto", input=HARD[0]["content"])
        assert first.route.winner == LARGE
        then = await client.responses.create(
            model="auto", input=SIMPLE[0]["content"], previous_response_id=first.id
        )
        assert then.route.winner == LARGE
        assert (then.route.tier.tier, then.route.tier.reason) == ("chat-large", "conversation")
        fresh = await client.responses.create(model="auto", input=SIMPLE[0]["content"])
        assert fresh.route.tier.reason == "classifier" and fresh.route.winner == SMALL


@pytest.mark.anyio
async def test_a_tier_that_cannot_continue_a_response_gives_way_to_the_default(
    sim: Simulator, artefact: Path
) -> None:
    """A response id another client made: only targets that keep responses may continue it;
    the simple tier's do not, so the default tier (whose do) serves the call."""
    config = config_for(sim, classifier=str(artefact))
    config["providers"]["sim"] |= {"responses": True, "responses_stored": True}
    config["providers"]["volatile"] = {
        "base_url": sim.base_url,
        "api_key": KEY,
        "responses": True,
        "responses_stored": False,
    }
    config["models"]["chat-small"] = {"targets": ["volatile:small-model"]}
    async with client_for(sim, config) as elsewhere:  # another client: no pin here
        first = await elsewhere.responses.create(model="chat-large", input=HARD[0]["content"])
    async with client_for(sim, config) as client:
        done = await client.responses.create(
            model="auto", input=SIMPLE[0]["content"], previous_response_id=first.id
        )
        tier = done.route.tier
        assert done.route.winner == LARGE and (tier.reason, tier.label) == ("default", "simple")
        assert tier.error is not None and "no target keeps responses" in tier.error


@pytest.mark.anyio
async def test_a_failed_request_keeps_and_counts_its_decision(
    sim: Simulator, artefact: Path
) -> None:
    config = config_for(sim, classifier=str(artefact))
    config["providers"]["sim"]["headers"] = {"x-sim-fault": "500"}
    config["models"]["chat-large"]["policy"] = "failover"
    config["models"]["chat-large"]["server_error_retries"] = 0
    async with client_for(sim, config, max_retries=0) as client:
        with pytest.raises(llmroute.AllTargetsFailed) as info:
            await ask(client, HARD, False, extra_body={"llmroute": {"tier": "hard"}})
        tier = info.value.report.tier
        assert tier is not None and (tier.reason, tier.tier) == ("override", "chat-large")
        text = client.metrics.exposition().decode()
        assert 'class="hard",model="auto",reason="override",tier="chat-large"} 1.0' in text


@pytest.mark.anyio
async def test_legacy_completions_on_a_tiered_name_go_to_the_default(
    sim: Simulator, artefact: Path
) -> None:
    async with client_for(sim, config_for(sim, classifier=str(artefact))) as client:
        done = await client.completions.create(model="auto", prompt="hi")
        assert done.choices[0].text
        assert client._llmroute.tiered["auto"].classifier is None  # no decision was made
        assert done.model == "large-model"  # the default tier's target
        forced = await client.completions.create(
            model="auto", prompt="hi", extra_body={"llmroute": {"tier": "simple"}}
        )
        assert forced.model == "small-model"


def test_the_sync_client_routes_by_tier(sim: Simulator, artefact: Path) -> None:
    config = config_for(sim, classifier=str(artefact))
    with llmroute.OpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config
    ) as client:
        done = client.chat.completions.create(model="auto", messages=HARD)
        assert done.route.winner == LARGE and done.route.tier.reason == "classifier"
        stream = client.chat.completions.create(model="auto", messages=SIMPLE, stream=True)
        assert sum(1 for _ in stream) > 0 and stream.route.winner == SMALL


@pytest.fixture
def gateway(sim: Simulator, artefact: Path) -> Iterator[Gateway]:
    config = {
        **config_for(sim, classifier=str(artefact)),
        "gateway": {"keys": {"ci": "GW_KEY_CI"}},
    }
    env = {"GW_KEY_CI": "gw-ci-key-0123456789abcdef"}
    with Gateway(config, environ=env, verify=sim.ssl_context(), max_retries=0) as server:
        yield server


def test_the_gateway_names_the_tier(gateway: Gateway) -> None:
    headers = {"authorization": "Bearer gw-ci-key-0123456789abcdef"}
    url = gateway.base_url + "/chat/completions"
    with httpx.Client(timeout=60) as http:
        whole = http.post(url, headers=headers, json={"model": "auto", "messages": HARD})
        assert whole.status_code == 200 and whole.headers["x-llmroute-tier"] == "chat-large"
        body = {"model": "auto", "messages": HARD, "stream": True, "llmroute": {"tier": "simple"}}
        streamed = http.post(url, headers=headers, json=body)
        assert streamed.status_code == 200 and streamed.headers["x-llmroute-tier"] == "chat-small"
        assert streamed.text.rstrip().endswith("data: [DONE]")
        models = http.get(gateway.base_url + "/models", headers=headers).json()
        assert "auto" in {m["id"] for m in models["data"]}


# -- the config ------------------------------------------------------------------------------


def _load(auto: dict[str, Any]) -> None:
    config = {
        "providers": {"sim": {"base_url": "https://127.0.0.1:9/v1", "api_key": KEY}},
        "models": {"chat-small": {"targets": [SMALL]}, "chat-large": {"targets": [LARGE]}},
    }
    config["models"]["auto"] = {
        "tiers": {"simple": "chat-small", "hard": "chat-large"},
        "default": "chat-large",
        **auto,
    }
    loaded = load_config(config)
    assert loaded is not None
    resolve(loaded)


@pytest.mark.parametrize(
    ("auto", "message"),
    [
        (
            {"tiers": {"simple": "chat-smal", "hard": "chat-large"}, "examples": str(DATA)},
            "models.auto.tiers.simple: 'chat-smal' is not a route (a [models] table with "
            "targets) (did you mean 'chat-small'?)",
        ),
        (
            {"default": "auto", "examples": str(DATA)},
            "models.auto.default: 'auto' is a tiered model name; a tier must be a route",
        ),
        (
            {"tiers": {"simple": "auto", "hard": "chat-large"}, "examples": str(DATA)},
            "models.auto.tiers.simple: 'auto' is a tiered model name; a tier must be a route",
        ),
        (
            {"tiers": {"chat-large": "chat-small", "hard": "chat-large"}, "examples": str(DATA)},
            "models.auto.tiers.chat-large: class 'chat-large' is named like a route but goes to "
            "'chat-small'",
        ),
        (
            {"classes": {"simple": {"examples": ["hi", "   "]}, "hard": {"examples": ["x"]}}},
            "models.auto.classes.simple.examples[1]: an example must not be blank",
        ),
        (
            {"classes": {"simple": {"description": " \t"}, "hard": {"examples": ["x"]}}},
            "models.auto.classes.simple.description: a description must not be blank",
        ),
        ({"examples": "missing.jsonl"}, "models.auto.examples: 'missing.jsonl': no such file"),
        ({"classifier": "missing.npz"}, "models.auto.classifier: 'missing.npz': no such file"),
        ({"examples": "a\x00b"}, "models.auto.examples: 'a\\x00b': not a usable path"),
        ({"examples": "x" * 5000}, "not a usable path (File name too long)"),
        (
            {"classes": {"simple": {"examples": ["hi"]}}},
            "models.auto.tiers.hard: class 'hard' has no examples",
        ),
        (
            {"classes": {"simple": {}, "hard": {"examples": ["x"]}}},
            "models.auto.classes.simple: an empty class",
        ),
        (
            {"classes": {"simple": {"examples": []}, "hard": {"examples": ["x"]}}},
            "models.auto.classes.simple.examples: expected at least 1 item(s), got 0",
        ),
        (
            {"examples": str(DATA), "classes": {"hrad": {"examples": ["x"]}}},
            "models.auto.classes.hrad: 'hrad' is not a class of tiers (did you mean 'hard'?)",
        ),
        ({"examples": str(DATA), "shadw": True}, "models.auto.shadw: unknown key"),
        (
            {"examples": str(DATA), "classifier": str(DATA)},
            "models.auto.classifier: give either a fitted classifier or examples",
        ),
        (
            {"tiers": {"simple": "chat-small"}, "examples": str(DATA)},
            "models.auto.tiers: expected at least 2 item(s), got 1",
        ),
        (
            {"examples": str(DATA), "uncertain_below": 2},
            "models.auto.uncertain_below: expected a number at most 1, got 2",
        ),
    ],
)
def test_config_mistakes_are_sentences_naming_the_field(auto: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(auto)
    assert message in str(info.value)


_odd = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["chat-small", "chat-large", "auto", "simple", "hard", str(DATA), "\x00"]),
    st.lists(st.text(max_size=4), max_size=3),
    st.dictionaries(st.sampled_from(["simple", "hard", "x", ""]), st.text(max_size=6), max_size=3),
)
_tiered_tables = st.dictionaries(
    st.sampled_from(
        ["tiers", "default", "examples", "classifier", "classes", "uncertain_below", "shadow", "x"]
    ),
    _odd
    | st.dictionaries(
        st.sampled_from(["simple", "hard", "other"]),
        st.dictionaries(st.sampled_from(["examples", "description", "y"]), _odd, max_size=2) | _odd,
        max_size=3,
    ),
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(_tiered_tables)
def test_hostile_tiered_tables_raise_only_config_errors(table: dict[str, Any]) -> None:
    try:
        _load(table)
    except ConfigError as exc:
        assert str(exc).startswith("config: models.auto"), str(exc)
        assert "validation error" not in str(exc).lower()


def test_a_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wordllama" else real(name)
    )
    with pytest.raises(
        ConfigError, match=r"models\.auto: .*wordllama.*pip install -e '.*\[tiers\]'"
    ):
        _load({"examples": str(DATA)})


def test_a_toml_file_reads_paths_beside_it_and_imports_no_classifier(tmp_path: Path) -> None:
    (tmp_path / "tiers.jsonl").write_text(DATA.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "llmroute.toml").write_text(
        """
[providers.sim]
base_url = "https://127.0.0.1:9/v1"
api_key = "sk-x"

[models.chat-small]
targets = ["sim:small-model"]

[models.chat-large]
targets = ["sim:large-model"]

[models.auto]
tiers = { simple = "chat-small", hard = "chat-large" }
default = "chat-large"
examples = "tiers.jsonl"

[models.auto.classes.simple]
examples = ["hi", "what's 2+2"]
""",
        encoding="utf-8",
    )
    toml = str(tmp_path / "llmroute.toml")
    script = (
        "import sys, llmroute\n"
        f"client = llmroute.AsyncOpenAI(api_key='sk-x', config={toml!r})\n"
        "tiered = client._llmroute.tiered['auto']\n"
        "print(json.dumps([str(tiered.settings.examples), 'llmroute.tiers' in sys.modules,"
        " 'numpy' in sys.modules, sorted(client._llmroute.router.routes)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + script],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard only
        check=True,
    )
    examples, tiers_imported, numpy_imported, routes = json.loads(out.stdout)
    assert examples == str(tmp_path / "tiers.jsonl")
    assert not tiers_imported and not numpy_imported
    assert routes == ["chat-large", "chat-small"]
