"""The docs cite only files in the repository.

In README.md and docs/*.md, every relative link (``[text](../x)``) and every path whose first
part is one of the repository's top-level folders (``llmroute/server/_app.py``,
``benchmarks/x.py``, ``tests/routing/test_*.py``), in prose, backticks or code blocks, names a
file or folder that exists (a pattern: one that matches). Such a path is read from the repository's
root; one that starts with ``../`` from the doc's own folder, and it must stay in the repository.
A link to a heading (``[x](routing.md#mid-stream-breaks)``, ``[x](#options)``) names a heading
of that page, by GitHub's rule for a heading's anchor.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _top_folders() -> list[str]:
    """The repository's top-level folders (from git when it is a checkout, else the disk)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    folders = {name.split("/")[0] for name in listed if "/" in name}
    if not folders:
        folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    return sorted(folders - {".venv", ".venvs"})


def _cited(doc: Path, folders: list[str]) -> Iterator[tuple[int, str, Path]]:
    """(line, path as written, the path it names) for each path ``doc`` cites."""
    text = doc.read_text()
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match.group(1).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target):  # not https:, mailto:
            yield text.count("\n", 0, match.start()) + 1, match.group(1), doc.parent / target
    heads = "|".join(re.escape(name) for name in folders)
    path = re.compile(rf"(?<![\w./~$-])((?:\.\./)*(?:{heads})/[\w.*/<>-]*)")
    for match in path.finditer(text):
        written = match.group(1).rstrip(".")
        if written.startswith("../"):
            if text[match.start() - 2 : match.start()] == "](":
                continue  # a link, checked above
            base = doc.parent
        else:
            base = ROOT
        yield text.count("\n", 0, match.start()) + 1, written, base / written


def _exists(path: Path) -> bool:
    resolved = path.resolve()
    if not resolved.is_relative_to(ROOT):
        return False
    relative = str(resolved.relative_to(ROOT))
    pattern = re.sub(r"<[^>/]*>", "*", relative)
    if "*" in pattern:
        return any(ROOT.glob(pattern))
    return resolved.exists()


def test_every_path_the_docs_cite_exists() -> None:
    folders = _top_folders()
    assert {"llmroute", "tests", "docs", "examples"} <= set(folders)
    seen = 0
    missing = []
    for doc in DOCS:
        for line, written, path in _cited(doc, folders):
            seen += 1
            if not _exists(path):
                missing.append(f"{doc.relative_to(ROOT)}:{line}: {written}")
    assert seen > 100  # the scan itself works
    assert not missing, "the docs cite paths that are not in the repository:\n" + "\n".join(missing)


def test_a_missing_path_is_named_with_its_doc(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("See `llmroute/nowhere.py` and [x](../no/such.md) and `llmroute/_client.py`.\n")
    cited = [(written, _exists(path)) for _, written, path in _cited(doc, ["llmroute"])]
    assert cited == [
        ("../no/such.md", False),
        ("llmroute/nowhere.py", False),
        ("llmroute/_client.py", True),
    ]


def _anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings as GitHub makes them (lower case, punctuation but
    ``-`` and ``_`` dropped, spaces as ``-``, ``-1``, ``-2`` after a repeated one), headings in
    code blocks left out, and any ``<a id="...">``."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence = ""
    for line in page.read_text().splitlines():
        opening = re.match(r"\s*(```|~~~)", line)
        if opening:
            fence = "" if fence and line.strip().startswith(fence) else fence or opening[1]
            continue
        anchors.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
        heading = re.match(r"#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
        if fence or heading is None:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading[1])  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken_anchors(doc: Path) -> Iterator[str]:
    """``line: link`` for each link of ``doc`` to a heading its page does not have."""
    text = doc.read_text()
    for match in re.finditer(r"\]\(([^)\s#]*)#([^)\s]+)\)", text):
        target, anchor = match.group(1), match.group(2)
        page = doc.parent / target if target else doc
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or page.suffix != ".md" or not page.exists():
            continue  # another site's page, or a missing file (the test above names it)
        if anchor not in _anchors(page):
            yield f"{text.count(chr(10), 0, match.start()) + 1}: {match.group(1)}#{anchor}"


def test_every_link_to_a_heading_finds_it() -> None:
    pages = [*DOCS, ROOT / "tests" / "README.md"]  # which README.md links to by heading
    broken = [f"{doc.relative_to(ROOT)}:{where}" for doc in pages for where in _broken_anchors(doc)]
    linked = sum(len(re.findall(r"\]\([^)\s#]*\.md#", doc.read_text())) for doc in DOCS)
    assert linked > 30  # the scan itself works
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)


def test_an_anchor_follows_githubs_rule(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# The `llmroute chat` command\n## A routed run: `--routed`\n## Options\n## Options\n"
        "```sh\n# not a heading\n```\n"
        "[a](#the-llmroute-chat-command) [b](page.md#a-routed-run---routed) [c](#options-1)\n"
        "[d](#not-a-heading) [e](#options-2) [f](https://example.com/x#y)\n"
    )
    assert list(_broken_anchors(page)) == ["9: #not-a-heading", "9: #options-2"]
