"""The offline request classifier (llmroute.tiers): features, fitting, calibration, artefact,
labelled-examples files, the ``llmroute tiers`` command, and no socket ever opened."""

# ruff: noqa: RUF001  (Chinese and Japanese prompts use full-width punctuation)

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmroute.cli import main
from llmroute.tiers import (
    ArtefactError,
    Classifier,
    ExamplesError,
    FeatureSpec,
    TiersError,
    examples_from,
    fit,
    read_examples,
    request_text,
)
from llmroute.tiers._eval import cross_validate
from llmroute.tiers._features import capped, embed, ngram_vector
from llmroute.tiers._model import _temperature

DATA = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"
ROOT = Path(__file__).resolve().parents[2]


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **extra}


def ngrams(text: str, dim: int = 1024) -> np.ndarray:
    codes = np.frombuffer(text.casefold().encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    return ngram_vector(codes, dim)


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return fit(read_examples(DATA))


# -- features ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("same", "near", "far"),
    [
        ("What is the capital of France?", "What is the capital of Spain?", "用C语言实现红黑树"),
        ("法国的首都是哪里？", "德国的首都是哪里？", "Prove the planar graph theorem"),
        ("用Python写一个LRU缓存", "用Python写一个LRU cache", "今天天气很好"),
    ],
    ids=["english", "chinese", "mixed"],
)
def test_ngrams_put_paraphrases_near_in_any_script(same: str, near: str, far: str) -> None:
    a, b, c = ngrams(same), ngrams(near), ngrams(far)
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert float(a @ b) > 0.5 > float(a @ c)


def test_the_embedding_is_wordllamas_unit_vector() -> None:
    vector = embed("What is the capital of France?")
    assert vector.shape == (256,)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    assert not embed("").any()
    spec = FeatureSpec()
    assert spec.vector(chat("你好，世界")).shape == (spec.dim,)


def test_the_embedding_matches_wordllamas_own_loader() -> None:
    from wordllama import WordLlama

    folder = Path(__import__("wordllama").__file__).parent
    theirs = WordLlama.load(cache_dir=folder, disable_download=True)
    for text in ("What is the capital of France?", "法国的首都是哪里？", "fix this `bug`"):
        expected = theirs.embed(text, norm=True)[0]
        assert np.allclose(embed(text), expected, atol=1e-5)


def test_a_long_prompt_is_embedded_and_hashed_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmroute.tiers import _features

    seen: list[int] = []
    real_embed, real_codes = _features.embed, _features._code_points
    monkeypatch.setattr(_features, "embed", lambda text: seen.append(len(text)) or real_embed(text))
    monkeypatch.setattr(
        _features, "_code_points", lambda text: seen.append(len(text)) or real_codes(text)
    )
    spec = FeatureSpec()
    spec.vector(chat("word " * 20_000))
    assert seen == [spec.embed_chars, spec.ngram_chars]
    seen.clear()
    spec.vector(chat("short"))
    assert seen == [5, 5]


def test_a_long_prompt_is_capped_head_and_tail() -> None:
    text = "head " + "x" * 100_000 + " the latest words"
    cut = capped(text, 1000)
    assert len(cut) == 1000
    assert cut.startswith("head ") and cut.endswith(" the latest words")
    assert capped("short", 1000) == "short"


def test_request_text_reads_chat_and_responses_bodies() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is in this picture?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                ],
            },
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_object"},
        "max_completion_tokens": 64,
    }
    text = request_text(body)
    assert text.user == "first question\nwhat is in this picture?"
    assert (text.user_turns, text.messages, text.images, text.tools) == (2, 4, 1, 1)
    assert (text.system_chars, text.assistant_chars, text.max_tokens) == (9, 9, 64)
    assert text.response_format
    responses = request_text(
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "instructions": "sys",
            "max_output_tokens": 5,
        }
    )
    assert (responses.user, responses.system_chars, responses.max_tokens) == ("hi", 3, 5)
    assert request_text({"input": "plain"}).user == "plain"
    assert request_text({"messages": "not a list"}).user == ""


class Counted(dict[str, Any]):
    """A message or content part that counts how often the features read it."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        Counted.reads += 1
        return super().get(key, default)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [Counted(role="user", content=[Counted(type="text", text="a")] * 322_000)]},
        {"messages": [Counted(role="user", content="a")] * 140_000},
        {"input": [Counted(role="user", content=[Counted(type="image")] * 1_000)] * 1_000},
    ],
    ids=["322k-parts", "140k-messages", "1k-messages-of-1k-parts"],
)
def test_a_crafted_body_is_read_in_bounded_work(body: dict[str, Any]) -> None:
    """Whatever the body, at most 256 messages and parts from each end are read (1,024 parts
    in all), and no more than 2 x 4,096 characters of its text are copied."""
    Counted.reads = 0
    text = request_text(body)
    assert Counted.reads <= 2 * (2 * 256) + 2 * (4 * 256)  # role+content / type+text each
    assert len(text.user) <= 2 * 4096
    assert text.messages == len(body.get("messages") or body["input"])


def test_a_long_text_keeps_its_head_and_tail_and_whole_length() -> None:
    turns = [f"turn {i}: " + "x" * (i % 7) for i in range(2_000)]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": t}]} for t in turns]}
    text = request_text(body, keep=1000)
    whole = "\n".join(turns[:256] + turns[-256:])  # the messages read: 256 from each end
    assert text.user_chars == len(whole) and text.user == whole[:1000] + whole[-1000:]
    assert capped(text.user, 600) == capped(whole, 600)  # what the embedding sees is unchanged
    huge = request_text(chat("y" * 5_000_000 + "the newest words"))
    assert huge.user_chars == 5_000_016 and huge.user.endswith("the newest words")
    assert len(huge.user) == 2 * 4096


# -- fitting, calibration, decisions ----------------------------------------------------------


def test_fit_and_decide_in_english_and_chinese(classifier: Classifier) -> None:
    assert classifier.labels == ("hard", "simple")
    assert classifier.calibrated and classifier.temperature > 0
    for text, label in [
        ("Hello, how are you?", "simple"),
        ("早上好！", "simple"),
        (
            "Prove that the square root of 3 is irrational, then generalise the proof to any "
            "integer that is not a perfect square, with every step justified.",
            "hard",
        ),
        ("证明存在无穷多个素数，并推广到形如4k+3的素数，给出完整的推导过程和严格的证明。", "hard"),
    ]:
        decision = classifier.decide(chat(text))
        assert decision.reason == "classifier"
        assert decision.label == label, (text, decision)
        assert decision.micros > 0


def test_probabilities_sum_to_one_and_the_uncertain_band(classifier: Classifier) -> None:
    decision = classifier.decide(chat("Summarise this paragraph for me."))
    probs = decision.probabilities
    assert all(0.0 <= p <= 1.0 for p in probs.values())
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
    assert decision.probability == max(probs.values())
    assert decision.uncertain == (decision.probability < classifier.uncertain_below)
    assert classifier.decide(chat("hi"), uncertain_below=1.01).uncertain
    assert not classifier.decide(chat("hi"), uncertain_below=0.0).uncertain


def test_temperature_undoes_overconfidence() -> None:
    rng = np.random.default_rng(1)
    true_scores = rng.normal(size=(2000, 3)) * 2
    probs = np.exp(true_scores) / np.exp(true_scores).sum(axis=1, keepdims=True)
    y = np.array([rng.choice(3, p=p) for p in probs])
    assert _temperature(true_scores * 4, y) == pytest.approx(4.0, rel=0.2)
    assert _temperature(true_scores, y) == pytest.approx(1.0, rel=0.2)


def test_a_classifier_error_is_a_decision_not_an_exception(classifier: Classifier) -> None:
    decision = classifier.decide(42)  # type: ignore[arg-type]
    assert (decision.label, decision.reason, decision.uncertain) == (None, "error", True)
    assert decision.error is not None and decision.error.startswith("AttributeError")


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens", "max_output_tokens"])
@pytest.mark.parametrize("value", [-1, -5, 10**400])
def test_an_absurd_max_tokens_is_clamped_not_nan(
    classifier: Classifier, key: str, value: int
) -> None:
    body = chat("hi there", **{key: value})
    assert request_text(body).max_tokens == (0 if value < 0 else 1 << 40)
    assert np.all(np.isfinite(classifier.spec.vector(body)))
    decision = classifier.decide(body)
    assert decision.reason == "classifier" and 0.0 < decision.probability <= 1.0


def test_non_finite_probabilities_are_an_error_not_a_confident_class(
    classifier: Classifier,
) -> None:
    weights = classifier.weights.copy()
    weights[0, 0] = np.nan
    broken = dataclasses.replace(classifier, weights=weights)
    with np.errstate(invalid="ignore"):
        decision = broken.decide(chat("hi there"))
    assert (decision.label, decision.reason, decision.uncertain) == (None, "error", True)
    assert decision.error is not None and "not finite" in decision.error


def test_without_wordllama_load_names_the_extra_and_decide_says_error(
    classifier: Classifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmroute.tiers import TiersUnavailable, _features, load_embedding

    monkeypatch.setitem(sys.modules, "wordllama", None)  # as if it were not installed
    monkeypatch.setattr(_features, "_embedding", None)
    with pytest.raises(TiersUnavailable, match=r"needs wordllama.*pip install -e '.*\[tiers\]'"):
        load_embedding()
    decision = classifier.decide(chat("hello"))
    assert (decision.reason, decision.label) == ("error", None)
    assert decision.error is not None and decision.error.startswith("TiersUnavailable")


def test_few_shot_without_calibration_and_one_class_refused() -> None:
    examples = examples_from([{"text": "hi", "label": "a"}, {"text": "prove it", "label": "b"}])
    small = fit(examples, spec=FeatureSpec(embedding=False))
    assert not small.calibrated and small.temperature == 1.0
    with pytest.raises(TiersError, match="at least two"):
        fit(examples_from([{"text": "hi", "label": "a"}]))


def test_three_classes_from_bodies_with_structure() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    rows = []
    for i in range(4):
        rows.append({"text": f"hello number {i}", "label": "chat"})
        rows.append({"body": {**chat(f"find order {i}"), "tools": [tool]}, "label": "tools"})
        rows.append({"text": f"```python\nprint({i})\n```\nwhy does this fail?", "label": "code"})
    model = fit(examples_from(rows), spec=FeatureSpec(embedding=False))
    assert model.labels == ("chat", "code", "tools") and model.calibrated
    decision = model.decide({**chat("find order 99"), "tools": [tool]})
    assert decision.label == "tools"
    assert sum(decision.probabilities.values()) == pytest.approx(1.0, abs=1e-5)


def test_cross_validation_beats_the_baselines() -> None:
    result = cross_validate(read_examples(DATA), folds=4)
    assert len(result.truth) == 48 and result.errors == 0
    assert result.accuracy() >= 0.9
    for name in ("random", "majority"):
        assert result.accuracy() > result.accuracy(result.baselines[name]) + 0.2
    assert result.confusion().sum() == 48
    assert sum(result.share().values()) == pytest.approx(1.0)


# -- the artefact -----------------------------------------------------------------------------


def test_artefact_round_trip(classifier: Classifier, tmp_path: Path) -> None:
    path = tmp_path / "tiers.npz"
    classifier.save(path)
    again = Classifier.open(path)
    assert again.labels == classifier.labels and again.spec == classifier.spec
    assert again.temperature == pytest.approx(classifier.temperature)
    body = chat("写一个快速排序的Python实现")
    assert again.decide(body).probabilities == pytest.approx(
        classifier.decide(body).probabilities, abs=1e-6
    )


def test_a_fitted_classifier_is_kept_and_the_next_process_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process refitted a tiered name's classifier (about a second of CPU before its
    first decision); the second load reads the artefact the first one kept, by the examples'
    hash, and other examples are fitted anew."""
    from llmroute.tiers import _cache

    fits: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Classifier:
        fits.append(1)
        return fit(*args, **kwargs)

    monkeypatch.setattr(_cache, "fit", counted)
    monkeypatch.setenv("LLMROUTE_CACHE_DIR", str(tmp_path / "cache"))
    examples = read_examples(DATA)
    first = _cache.cached_fit(examples)
    second = _cache.cached_fit(examples)
    assert fits == [1]
    assert second.labels == first.labels and np.allclose(second.weights, first.weights)
    body = chat("prove that there are infinitely many primes")
    assert second.decide(body).label == first.decide(body).label
    [kept] = (tmp_path / "cache" / "tiers").iterdir()
    assert kept.name == f"{_cache.examples_key(examples, FeatureSpec())}.npz"
    assert kept.stat().st_mode & 0o077 == 0  # the user's own, like the disk cache
    _cache.cached_fit(examples[1:])  # other examples: another key, fitted
    assert fits == [1, 1]


@pytest.mark.parametrize(
    "damage",
    [b"not a zip file at all", "pickle", "other examples"],
    ids=["garbage", "a-pickle", "foreign"],
)
def test_a_damaged_or_foreign_cached_classifier_is_fitted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: bytes | str
) -> None:
    """Never trusted: a file that is not an artefact, a pickle (never loaded: a pickle could
    run code), or an artefact of other examples under this key's name is replaced by a fit."""
    import pickle

    from llmroute.tiers import _cache

    fits: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Classifier:
        fits.append(1)
        return fit(*args, **kwargs)

    monkeypatch.setattr(_cache, "fit", counted)
    examples = read_examples(DATA)
    key = _cache.examples_key(examples, FeatureSpec())
    path = tmp_path / "tiers" / f"{key}.npz"
    path.parent.mkdir()
    if damage == "pickle":
        path.write_bytes(pickle.dumps({"weights": [1.0]}))
    elif damage == "other examples":
        fit(examples[1:]).save(path, key="0" * 64)
    else:
        assert isinstance(damage, bytes)
        path.write_bytes(damage)
    rebuilt = _cache.cached_fit(examples, tmp_path)
    assert fits == [1] and set(rebuilt.labels) == {e.label for e in examples}
    assert Classifier.open(path, key=key).labels == rebuilt.labels  # replaced, whole
    _cache.cached_fit(examples, tmp_path)
    assert fits == [1]


def test_a_cache_that_cannot_be_written_only_costs_the_fit(tmp_path: Path) -> None:
    from llmroute.tiers import _cache

    blocked = tmp_path / "file"
    blocked.write_text("a file where the directory would be")
    classifier = _cache.cached_fit(read_examples(DATA), blocked)
    assert classifier.labels and blocked.read_text().startswith("a file")


def test_a_damaged_artefact_is_a_sentence_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ArtefactError, match=r"bad\.npz: not a tiers classifier file"):
        Classifier.open(bad)
    other = tmp_path / "other.npz"
    np.savez(other, meta=np.frombuffer(b'{"format": "x"}', dtype=np.uint8))
    with pytest.raises(ArtefactError, match=r"other\.npz: format 'x'"):
        Classifier.open(other)


@pytest.mark.parametrize(
    ("array", "change", "message"),
    [
        (
            "weights",
            lambda a: np.where(a == a.flat[0], np.nan, a),
            "its weights are not all finite",
        ),
        ("bias", lambda a: a + np.inf, "its bias are not all finite"),
        (
            "structure_mean",
            lambda a: a[:5],
            "its structure_mean and structure_scale must each hold 19",
        ),
        ("structure_scale", lambda a: np.zeros_like(a), "its structure_scale must be positive"),
        ("structure_scale", lambda a: a * np.nan, "its structure_scale are not all finite"),
    ],
    ids=["nan-weights", "inf-bias", "short-mean", "zero-scale", "nan-scale"],
)
def test_a_non_finite_or_misshapen_artefact_is_refused(
    classifier: Classifier, tmp_path: Path, array: str, change: Any, message: str
) -> None:
    good = tmp_path / "good.npz"
    classifier.save(good)
    with np.load(good, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    arrays[array] = change(arrays[array])
    bad = tmp_path / "crafted.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ArtefactError, match=rf"crafted\.npz: {message}"):
        Classifier.open(bad)


# -- labelled-examples files ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"text": "hi"}', "'label' must be a non-empty string"),
        ('{"text": "hi", "messages": [], "label": "a"}', "give exactly one of"),
        ('{"messages": [{"content": "x"}], "label": "a"}', r"messages\[0\] must be an object"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_a_bad_line_names_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "labelled.jsonl"
    path.write_text('{"text": "hello", "label": "simple"}\n\n' + line + "\n")
    with pytest.raises(ExamplesError, match=rf"labelled\.jsonl line 3: {message}"):
        read_examples(path)


def test_examples_file_shapes(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(
        '{"text": "hi", "label": "a"}\n'
        '{"messages": [{"role": "user", "content": "yo"}], "label": "b"}\n'
        '{"input": "hey", "label": "a"}\n'
    )
    assert [e.label for e in read_examples(path)] == ["a", "b", "a"]
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ExamplesError, match="no examples"):
        read_examples(tmp_path / "empty.jsonl")
    with pytest.raises(ExamplesError, match="cannot read"):
        read_examples(tmp_path / "missing.jsonl")


# -- the command line -------------------------------------------------------------------------


def test_cli_fit_then_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiers.npz"
    assert main(["tiers", "fit", str(DATA), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "Fitted 48 examples (hard 24, simple 24)" in said and str(out) in said
    assert main(["tiers", "eval", str(DATA), "--model", str(out), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["accuracy"] >= 0.9
    assert set(figures["baselines"]) == {"random", "majority", "length"}
    assert figures["latency_us"]["p99"] >= figures["latency_us"]["p50"] > 0
    assert main(["tiers", "eval", str(DATA), "--folds", "3", "--no-embedding"]) == 0
    table = capsys.readouterr().out
    for word in ("3-fold cross-validation", "classifier", "majority", "length", "confusion"):
        assert word in table
    assert "decision latency: p50" in table


def test_cli_mistakes_are_sentences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hi", "label": "a"}\n{"text": 3, "label": "b"}\n')
    assert main(["tiers", "fit", str(bad), "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err == f"llmroute tiers: {bad} line 2: 'text' must be a string\n"
    assert main(["tiers", "eval", str(DATA), "--model", str(bad)]) == 2
    assert "not a tiers classifier file" in capsys.readouterr().err
    model = tmp_path / "three.npz"
    fit(
        examples_from([{"text": t, "label": t} for t in ("a", "b", "c")]),
        spec=FeatureSpec(embedding=False),
    ).save(model)
    assert main(["tiers", "eval", str(DATA), "--model", str(model)]) == 2
    assert "classes the classifier does not know: hard, simple" in capsys.readouterr().err
    assert main(["tiers", "eval", str(DATA), "--folds", "1"]) == 2
    assert "--folds must be at least 2" in capsys.readouterr().err
    assert main(["tiers", "fit", str(DATA), "--out", str(tmp_path / "no" / "x.npz")]) == 2
    assert "llmroute tiers: cannot write" in capsys.readouterr().err


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_without_wordllama_the_cli_names_the_extra() -> None:
    done = run_python(
        "import sys; sys.modules['wordllama'] = None\n"  # makes `import wordllama` fail
        "from llmroute.cli import main\n"
        f"raise SystemExit(main(['tiers', 'eval', {str(DATA)!r}]))\n"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "llmroute tiers: the request classifier (tiers) needs wordllama, which is not "
        f"installed: pip install -e '{ROOT}[tiers]'\n"
    )


_NO_SOCKETS = """
import json, socket, sys
tried = []
def refuse(*args, **kwargs):
    tried.append(repr(args)[:80])
    raise OSError("sockets are blocked in this test")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
import llmroute
light = sorted(sys.modules.keys() & {"numpy", "wordllama", "llmroute.tiers"})
from llmroute.tiers import examples_from, fit, load_embedding
load_embedding()
classifier = fit(examples_from([
    {"text": "hi", "label": "simple"}, {"text": "你好", "label": "simple"},
    {"text": "Prove Fermat's little theorem step by step.", "label": "hard"},
    {"text": "证明费马小定理，并给出完整推导。", "label": "hard"},
]))
decision = classifier.decide({"messages": [{"role": "user", "content": "hello"}]})
print(json.dumps({"tried": tried, "light": light, "reason": decision.reason}))
"""


def test_loads_and_classifies_with_sockets_blocked() -> None:
    done = run_python(_NO_SOCKETS)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tried"] == []
    assert report["reason"] == "classifier"
    # `import llmroute` alone imports neither the classifier nor its dependencies
    assert "wordllama" not in report["light"] and "llmroute.tiers" not in report["light"]
