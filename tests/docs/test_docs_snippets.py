"""Every Python and TOML block in README.md and docs/*.md runs as written, or says it is a fragment.

A block whose fence reads ```` ```python fragment ```` or ```` ```toml fragment ```` is a piece
of something larger (a walk through the code, a printed output, a file that needs a GPU): it is
only parsed. Every other block is checked as a reader would use it (tests/README.md):

- TOML: parses; an llmroute config loads through the config loader and resolves (every
  environment variable it or the catalog names set to a dummy value, its simulated providers
  started); a keys file
  (``# /etc/llmroute/keys.toml``) loads as ``keys_file``.
- Python: runs, in a process of its own (tests/snippet_runner.py), in a directory whose
  ``llmroute.toml`` routes ``chat`` over the simulator, with ``OPENAI_BASE_URL`` and
  ``OPENAI_API_KEY`` naming the simulator, its CA trusted through ``SSL_CERT_FILE`` and
  ``LLMROUTE_GATEWAY_KEY`` set (docs/gateway.md tells the reader to set it); sockets
  reach loopback only. A README block is a program (``asyncio.run(main())``); a docs/ block may
  use a top-level ``await``, run as ``python -m asyncio`` runs it. A block that begins with
  ``# examples/NAME.py`` is that file's text (tests/docs/test_examples.py runs the file). A
  ```` ```text output ```` block after a Python block (prose between them, no other block) is
  what that block prints: its output must be exactly that.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmroute.testing import Simulator

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", flags=re.MULTILINE | re.DOTALL)
KEY = "sk-docs-0123456789"
# Labelled examples for docs/tiers.md's blocks (its format, as that page describes it).
LABELLED = [
    *({"text": text, "label": "simple"} for text in ("hi", "thanks!", "what's 2+2", "hello")),
    *(
        {"text": text, "label": "hard"}
        for text in (
            "prove Fermat's little theorem",
            "design a sharded key-value store",
            "derive the gradient of softmax",
            "write a lock-free queue in C",
        )
    ),
]


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    fragment: bool
    text: str
    output: str | None = None
    """What the block prints, from the ```` ```text output ```` block after it."""

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _is_output(match: re.Match[str]) -> bool:
    return match.group(1) == "text" and match.group(2).split() == ["output"]


def _blocks() -> Iterator[Block]:
    for doc in DOCS:
        text = doc.read_text()
        matches = list(FENCE.finditer(text))
        for index, match in enumerate(matches):
            after = matches[index + 1] if index + 1 < len(matches) else None
            lang, info, body = match.groups()
            if lang in ("python", "toml"):
                line = text.count("\n", 0, match.start()) + 1
                output = after.group(3) if after is not None and _is_output(after) else None
                yield Block(doc, line, lang, "fragment" in info.split(), body, output)


def test_every_output_block_follows_a_block_that_runs() -> None:
    """An output block after anything but a runnable Python block would be checked by nothing."""
    seen = 0
    for doc in DOCS:
        text = doc.read_text()
        matches = list(FENCE.finditer(text))
        for index, match in enumerate(matches):
            before = matches[index - 1] if index else None
            if _is_output(match):
                seen += 1
                assert before is not None and before.group(1) == "python", (doc, match.start())
                assert "fragment" not in before.group(2).split(), (doc, match.start())
    assert seen >= 1


BLOCKS = list(_blocks())
TOML = [b for b in BLOCKS if b.lang == "toml"]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
RUNNABLE = [b for b in PYTHON if not b.fragment and not re.match(r"# examples/\w+\.py\n", b.text)]


def _ids(blocks: list[Block]) -> list[str]:
    return [b.name for b in blocks]


def test_the_docs_have_blocks_of_each_kind() -> None:
    """The extraction itself works: a regex that matched nothing would pass every test below."""
    assert len(TOML) >= 20 and len(PYTHON) >= 15 and len(RUNNABLE) >= 10
    for block in BLOCKS:  # a fence's info string says fragment or nothing
        info = FENCE.search(block.doc.read_text().split("\n", block.line - 1)[-1])
        assert info is not None and info.group(2).strip() in ("", "fragment"), block.name


def _dummy_environ(text: str) -> dict[str, str]:
    """A value for every key variable of the catalog and every variable the block names."""
    from llmroute._catalog import load_catalog

    names = {
        name
        for spec in load_catalog().values()
        for name in (spec.api_key_env, *spec.api_key_env_fallbacks)
        if name
    }
    names.update(re.findall(r'"([A-Z][A-Z0-9_]*_[A-Z0-9_]+)"', text))
    return {name: f"dummy-{name.lower()}" for name in names}


def _strings(data: object) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict | list):
        for value in data.values() if isinstance(data, dict) else data:
            yield from _strings(value)


@pytest.mark.parametrize("block", TOML, ids=_ids(TOML))
def test_toml_block_loads(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmroute._simulated import SimulatedProviders
    from llmroute.config import ConfigError, load_config, load_keys_file, resolve
    from llmroute.testing._server import ca_pem_path

    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        if block.fragment:
            return
        raise AssertionError(
            f"{block.name}: not TOML ({exc}); fix it or mark it fragment"
        ) from None
    if block.fragment:
        return
    monkeypatch.setenv("HOME", str(tmp_path))  # a CA file the block names (~/x.pem) is there
    for value in _strings(data):
        if value.startswith("~/") and value.endswith(".pem"):
            (tmp_path / value[2:]).write_text(Path(ca_pem_path()).read_text())
    path = tmp_path / "block.toml"
    path.write_text(block.text)
    (tmp_path / "tiers.jsonl").write_text("".join(json.dumps(e) + "\n" for e in LABELLED))
    try:
        if block.text.startswith("# /etc/llmroute/keys.toml"):
            config = load_config({"models": {"chat": {"targets": ["openai:gpt-6-luna"]}}})
            assert config is not None
            assert load_keys_file(str(path), config)
            return
        cwd = Path.cwd()
        os.chdir(tmp_path)  # a file the block names (tiers.jsonl) is beside it
        try:
            config = load_config(path)
            assert config is not None
            simulated = SimulatedProviders(config)  # its kind = "simulator" providers, if any
            try:
                environ = _dummy_environ(block.text)
                resolved = resolve(config, environ=environ, simulated=simulated.addresses)
            finally:
                simulated.stop()
        finally:
            os.chdir(cwd)
    except ConfigError as exc:
        raise AssertionError(f"{block.name}: {exc}") from None
    assert set(resolved.routes) >= {k for k in data.get("models", {}) if k not in config.tiered}


@pytest.mark.parametrize("block", PYTHON, ids=_ids(PYTHON))
def test_python_block_parses(block: Block) -> None:
    """Fragments too: a typo in a fragment is still a typo. README blocks are whole programs."""
    flags = 0 if block.doc.name == "README.md" else ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        compile(block.text, block.name, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as exc:
        raise AssertionError(f"{block.name}: {exc}") from None


def test_readme_blocks_of_example_files_are_their_text() -> None:
    seen = 0
    for block in PYTHON:
        match = re.match(r"# (examples/\w+\.py)\n", block.text)
        if match:
            seen += 1
            code = block.text.removeprefix(match.group(0))
            assert code in (ROOT / match.group(1)).read_text(), f"{block.name}: not the file's text"
    assert seen >= 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every runnable block run once, against one simulator (tests/snippet_runner.py)."""
    from llmroute.testing import Profile

    base = tmp_path_factory.mktemp("snippets")
    with Simulator(profile=Profile(reply_tokens=12), tls=True) as sim:
        config = (
            f'[providers.sim-a]\nbase_url = "{sim.base_url}"\napi_key_env = "OPENAI_API_KEY"\n'
            f'verify = "{sim.ca_pem_path}"\n\n'
            f'[providers.sim-b]\nbase_url = "{sim.base_url}"\napi_key_env = "OPENAI_API_KEY"\n'
            f'verify = "{sim.ca_pem_path}"\n\n'
            '[models.chat]\ntargets = ["sim-a:sim-small", "sim-b:sim-small"]\n'
            'policy = "hedge"\n\n'
        )
        manifest = []
        for index, block in enumerate(RUNNABLE):
            cwd = base / f"block{index}"
            cwd.mkdir()
            # The README's cache: on disk, stored on its second ask (in the block's directory).
            cache = f'[cache]\nbackend = "disk"\nmin_hits = 2\nttl = "1h"\npath = "{cwd}/cache"\n'
            (cwd / "llmroute.toml").write_text(config + cache)
            (cwd / "labelled.jsonl").write_text("".join(json.dumps(e) + "\n" for e in LABELLED))
            manifest.append(
                {"name": block.name, "code": block.text, "cwd": str(cwd), "timeout": 60}
            )
        path = base / "manifest.json"
        path.write_text(json.dumps(manifest))
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        env.pop("LLMROUTE_CONFIG", None)
        env.update(
            OPENAI_API_KEY=KEY,
            OPENAI_BASE_URL=sim.base_url,
            LLMROUTE_GATEWAY_KEY="gw-docs-0123456789",
            SSL_CERT_FILE=sim.ca_pem_path,
            PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        )
        subprocess.run(
            [sys.executable, str(ROOT / "tests" / "snippet_runner.py"), str(path)],
            env=env,
            check=True,
            timeout=600,  # a hang guard only: each block has its own 60 s
        )
        yield json.loads((base / "manifest.json.out").read_text())


@pytest.mark.parametrize("block", RUNNABLE, ids=_ids(RUNNABLE))
def test_python_block_runs_as_written(block: Block, results: dict[str, Any]) -> None:
    result = results[block.name]
    assert result["status"] == 0, (
        f"{block.name} (mark it fragment if it is not meant to run)"
        f"{' timed out' if result['timed_out'] else ''}:\n{result['output'][-3000:]}"
    )
    if block.output is not None:
        assert result["output"].strip() == block.output.strip(), (
            f"{block.name} printed:\n{result['output'][-3000:]}\nwhere its doc says:\n"
            f"{block.output}"
        )
