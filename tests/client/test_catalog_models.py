"""Every vendor model name the product shows is one its vendor still serves (issue 30).

README.md, docs/*.md, examples/, the package, the tests and the benchmarks are read for vendor
model names (``gpt-…``, ``claude-…``, ``gemini-…``, ``deepseek-…``, Qwen, Mistral, Kimi, GLM, Grok,
Llama, ``gpt-oss``; with or without an ``org/`` prefix or a ``provider:`` target prefix), and each
must be a current model of some catalog provider (its ``models`` in providers/*.toml), or on one
of the two allowlists below with its reason; none may be a provider's ``retired_models`` entry
(retired, or with an announced shutdown date: users copy our examples). A failure names the file,
the line, the name, its shutdown date and the replacement the vendor names.

The catalog files and this file are not read: they name retired models on purpose.
"""

from __future__ import annotations

import bisect
import itertools
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmroute._catalog import (
    CatalogError,
    ProviderSpec,
    find_model,
    load_catalog,
    load_provider_file,
)
from llmroute.cli._chat import PLAIN_MODEL
from llmroute.cli._demo import REAL_MODELS

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (
    "README.md",
    "docs/*.md",
    "examples/*.py",
    "llmroute/**/*.py",
    "tests/**/*.py",
    "benchmarks/**/*.py",
)
NOT_SCANNED = frozenset({"tests/client/test_catalog_models.py"})

FICTIONAL: Mapping[str, str] = {
    # Names no vendor serves, used on purpose: the simulator answers any model, and these tests
    # are about names (unknown models, typos, per-model settings), not about a vendor.
    "gpt-x": "a per-model setting's key in config tests",
    "gpt-y": "a second model in cache-key tests",
    "gpt-9": "a model the gateway does not route (its 404)",
    "gpt-nope": "a model the gateway does not route (models.retrieve 404)",
    "claude-sim": "the simulator's Anthropic-protocol model",
    "claude-x": "a model of a config-defined provider in config tests",
    "claude-new": "a model the catalog has no context window for",
    "claude-unknown": "a model the catalog has no context window for",
}
"""Fictional model names, by name: why each is used."""

OPEN_WEIGHTS: Mapping[str, str] = {
    # Open-weight checkpoints a user serves on a self-hosted server (SGLang, vLLM, Ollama: no
    # fixed model list); no vendor retires them. Matched on the name without its org/ prefix,
    # case-folded.
    "qwen2.5-7b-instruct": "the SGLang/vLLM examples' checkpoint (Qwen/Qwen2.5-7B-Instruct)",
    "qwen2.5-0.5b-instruct": "the small checkpoint of the SGLang smoke test",
    "qwen2.5-72b-instruct": "the large self-hosted tier of the routing docs",
    "qwen2.5": "the Qwen2.5 family named in prose (self-hosted examples)",
    "llama-3-8b": "an open checkpoint in SGLang docs",
    "llama-3.1-8b-instruct": "the SGLang docs' second checkpoint",
    "qwen2.5-7b": "a self-hosted target in config fuzz tests",
    "llama-2": "the tokenizer of wordllama's embedding (not a served model)",
    "qwen2forcausallm": "an architecture name in a recorded SGLang log",
}
"""Self-hosted open-weight names (case-folded, without ``org/``): why each is used."""

_FAMILY = re.compile(
    r"""(?x)
    (?:chat)?gpt-[\w.-]+              # gpt-6-luna, gpt-oss-20b, chatgpt-4o-latest
    | o[1-9](?:-(?:mini|pro|nano|preview|deep-research)[\w-]*)?  # o3, o4-mini
    | claude-[\w.-]+
    | gemini-[0-9][\w.-]*             # not gemini-api (a docs path)
    | (?:deepseek|DeepSeek)-(?:chat|reasoner|coder|flash|pro|[vVrR][0-9])[\w.-]*
    | (?:qwen|Qwen|QwQ|qwq|qvq)(?:[0-9][\w.-]*|-[0-9][\w.-]*|-(?:turbo|plus|max|flash|long)[\w.-]*)
    | (?:mistral|open-mistral)-(?:tiny|small|medium|large|nemo|saba)[\w.-]*
    | (?:ministral|codestral|magistral|devstral|pixtral)(?:-[\w.-]+)?
    | kimi-(?:k[0-9]|latest)[\w.-]*
    | moonshot-v[0-9][\w.-]*
    | (?:glm|GLM)-[0-9][\w.-]*
    | grok-(?:[0-9]|code|build|beta|vision)[\w.-]*
    | (?:[Mm]eta-)?[Ll]lama-?(?:v?[0-9])[\w.-]*   # not llama-index
    """
)
_TOKEN = re.compile(r"[\w.:/@~-]+")
_HINT = re.compile(
    r"gpt-|\bo[1-9]|claude-|gemini-|deepseek-|DeepSeek-|[Qq]wen|qwq|QwQ|qvq|mistral-|stral|"
    r"kimi-|moonshot-|glm-|GLM-|grok-|[Ll]lama"
)
"""A cheap test of a line before it is split into words: most lines name no model."""


@dataclass(frozen=True)
class Finding:
    """One model name in a file that the check rejects, and why."""

    path: str
    line: int
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}: {self.why}"


def model_names(line: str) -> Iterable[str]:
    """The vendor model names in one line of text: each as written, with its ``org/`` prefix
    but without a ``provider:`` target prefix (``deepseek:deepseek-v4-flash``)."""
    if not _HINT.search(line):
        return
    for token in _TOKEN.findall(line):
        if "://" in token or token.startswith("@"):
            continue  # a URL or a decorator/handle, not a model
        name = token.rsplit(":", 1)[-1].rstrip(".,;:-/")
        if _FAMILY.fullmatch(name.rsplit("/", 1)[-1]):
            yield name


def _check(name: str, catalog: Mapping[str, ProviderSpec]) -> str | None:
    """Why ``name`` must not be shown, or ``None`` when it may."""
    short = name.rsplit("/", 1)[-1]
    for candidate in dict.fromkeys((name, short)):  # an aggregator's org/ name, then the vendor's
        listings = find_model(candidate, catalog)
        retired = [listing for listing in listings if listing.retired is not None]
        if retired and len(retired) == len(listings):
            first = retired[0]
            assert first.retired is not None
            return (
                f"retired by {first.provider} (shutdown {first.retired.shutdown.isoformat()}); "
                f"use {first.retired.use!r}"
            )
        if listings:
            return None
    if short in FICTIONAL or short.casefold() in OPEN_WEIGHTS:
        return None
    return (
        "no catalog provider lists it as current (add it to a provider's models in "
        "providers/*.toml with its source, or to FICTIONAL / OPEN_WEIGHTS here with a reason)"
    )


def check_text(
    text: str, path: str, catalog: Mapping[str, ProviderSpec] | None = None
) -> list[Finding]:
    """Every model name in ``text`` that is retired or not a current catalog model."""
    specs = load_catalog() if catalog is None else catalog
    found: list[Finding] = []
    lines = text.split("\n")
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
    hinted = sorted({bisect.bisect_right(starts, m.start()) for m in _HINT.finditer(text)})
    for number in hinted:  # 1-based: only the lines where a model name may start
        line = lines[number - 1]
        if 'retired_models."' in line:
            continue  # a catalog line declaring a retirement (quoted in docs) names it on purpose
        for name in model_names(line):
            why = _check(name, specs)
            if why is not None:
                found.append(Finding(path, number, name, why))
    return found


def scanned_files() -> list[Path]:
    files = {path for pattern in SCANNED for path in ROOT.glob(pattern) if path.is_file()}
    return sorted(p for p in files if p.relative_to(ROOT).as_posix() not in NOT_SCANNED)


def test_every_model_name_shown_is_a_current_catalog_model() -> None:
    files = scanned_files()
    assert len(files) > 50  # the globs found the repository, not an empty folder
    found = [
        finding
        for path in files
        for finding in check_text(
            path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
        )
    ]
    assert not found, "\n".join(map(str, found))


def test_a_retired_name_is_reported_with_its_date_and_replacement() -> None:
    text = textwrap.dedent(
        """\
        targets = ["deepseek:deepseek-v4-flash", "openai:gpt-6-luna"]
        client = AsyncOpenAI(model="deepseek-chat")  # the README's old headline example
        retired_models."deepseek-chat" = { shutdown = 2026-07-24, use = "deepseek-v4-flash" }
        """
    )
    found = check_text(text, "README.md")
    assert [(f.line, f.name) for f in found] == [(2, "deepseek-chat")]
    message = str(found[0])
    assert message.startswith("README.md:2: deepseek-chat: retired by deepseek")
    assert "2026-07-24" in message and "'deepseek-v4-flash'" in message


def test_an_unknown_name_and_an_aggregator_prefix_are_checked() -> None:
    text = 'models = ["openrouter:openai/gpt-4o-mini", "gpt-7-mega", "openai/gpt-6-luna"]\n'
    found = {f.name: f.why for f in check_text(text, "x.md")}
    assert set(found) == {"openai/gpt-4o-mini", "gpt-7-mega"}
    assert (
        "retired by openai (shutdown 2027-01-14); use 'gpt-6-luna'" in found["openai/gpt-4o-mini"]
    )
    assert found["gpt-7-mega"].startswith("no catalog provider lists it")


@pytest.mark.parametrize(
    "text",
    [
        "pip install llama-index-llms-openai llama-index-core",
        "request_id_headers = ['mistral-correlation-id', 'x-grok-conv-id']",
        "https://api-docs.deepseek.com/guides/kv_cache and .../model-studio/deepseek-api",
        "[providers.qwen-cn]\nkind = 'dashscope'",
        "spec = catalog['qwen'].spec.responses",
    ],
)
def test_words_that_only_look_like_models_are_skipped(text: str) -> None:
    assert [name for line in text.splitlines() for name in model_names(line)] == []


def test_every_named_replacement_is_a_current_model_of_the_same_provider() -> None:
    for name, spec in load_catalog().items():
        for model, retired in spec.retired_models.items():
            assert retired.use in spec.models, f"providers/{name}.toml: {model} -> {retired.use}"


def test_find_model_says_where_a_name_is_current_or_retired() -> None:
    (current,) = find_model("deepseek-v4-flash")
    assert (current.provider, current.retired) == ("deepseek", None)
    (retired,) = find_model("gpt-4o-mini")
    assert retired.provider == "openai" and retired.retired is not None
    assert (retired.retired.shutdown.isoformat(), retired.retired.use) == (
        "2027-01-14",
        "gpt-6-luna",
    )
    assert find_model("qwen2.5-7b-instruct") == ()  # self-hosted: no catalog list names it


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            'retired_models."old-1" = { shutdown = "soon", use = "new-1" }',
            "retired_models.old-1.shutdown: Input should be a valid date",
        ),
        (
            'retired_models."old-1" = { shutdown = 2026-07-24 }',
            "retired_models.old-1.use: required",
        ),
        ('models = "new-1"', "models: Input should be a valid tuple"),
        (
            'models = ["new-1"]\nretired_models."new-1" = { shutdown = 2026-07-24, use = "x" }',
            "retired_models.new-1: also in models",
        ),
    ],
)
def test_a_bad_model_list_names_the_file_and_the_key(
    tmp_path: Path, lines: str, message: str
) -> None:
    path = tmp_path / "vendor.toml"
    path.write_text(f'base_url = "https://api.example.com/v1"\n{lines}\n', encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        load_provider_file(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)


def test_the_demo_and_chat_defaults_are_current_models_of_their_vendor() -> None:
    catalog = load_catalog()
    vendors = {name for name, spec in catalog.items() if not spec.self_hosted}
    assert set(REAL_MODELS) == vendors  # demo --real tries every vendor of the catalog
    for provider, model in REAL_MODELS.items():
        assert model in catalog[provider].models, f"demo --real: {provider}:{model}"
    assert PLAIN_MODEL in catalog["openai"].models  # `llmroute chat` without a config
