"""The docs name no internal issue numbers.

README.md, docs/*.md, benchmarks/README.md and tests/README.md are read by people who cannot see
the project's tracker, so a sentence says what a thing is ("the per-key limits", "the gateway's
cost goals"), never which ticket asked for it. The rule, checked on every line, code blocks
included:

- no ``issue 27``, ``Issue 30 asks``, ``issues 16 and 18``, ``issue #5``, ``ticket 3``, ``PR 12``
  or ``pull request #12`` (any case);
- no bare ``#27`` (a ``#`` right before digits, not inside a word, a path or an HTML entity);
- allowed: an upstream project's issue, written as that project's name right before it
  (``hypercorn issue #329``; the names are in ``UPSTREAM``), and any link target
  (``[x](sglang.md#2-launch)``, a URL ending in ``/issues/329``), which is not prose.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "tests" / "README.md",
]
# Projects whose own trackers a doc may cite by number, as "<name> issue #N".
UPSTREAM = (
    "hypercorn",
    "h2",
    "hpack",
    "httpx",
    "httpcore",
    "anyio",
    "trio",
    "openai-python",
    "pydantic",
    "granian",
    "uvloop",
    "redis-py",
    "SGLang",
    "vLLM",
    "LiteLLM",
    "wordllama",
)
ALLOWED = re.compile(
    rf"\b(?:{'|'.join(re.escape(name) for name in UPSTREAM)})(?:'s)? (?:issue|PR) #?\d+",
    re.IGNORECASE,
)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
INTERNAL = re.compile(
    r"\b(?:issues?|tickets?|PRs?|pull requests?)\s*#?\d+|(?<![\w&/#])#\d+", re.IGNORECASE
)


def internal_issues(text: str) -> list[tuple[int, str]]:
    """(line, what was written) for each internal issue number in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        prose = ALLOWED.sub("", LINK_TARGET.sub("]()", line))
        found.extend((number, match.group(0)) for match in INTERNAL.finditer(prose))
    return found


def test_no_doc_names_an_internal_issue() -> None:
    named = [
        f"{doc.relative_to(ROOT)}:{line}: {written}"
        for doc in DOCS
        for line, written in internal_issues(doc.read_text())
    ]
    assert len(DOCS) > 10  # the docs were found
    assert not named, (
        "say what the thing is, not which issue asked for it (tests/docs/test_docs_words.py):\n"
        + "\n".join(named)
    )


def test_the_rule_finds_issue_numbers_and_spares_upstream_and_links() -> None:
    text = "\n".join(
        [
            "Issue 27 asks llmroute to decide what model a request needs.",
            "the gateway (issue 19's items 1-3) and issues 16 and 18",
            "as item 5 of issue #19 asked; see PR 12, pull request #4 and ticket 3",
            "fixed in (#27) and #28.",
            "without GOAWAY (hypercorn issue #329), as h2 issue 1234 says",
            "see [launch](sglang.md#2-launch), [x](#3-route) and "
            "[it](https://github.com/pgjones/hypercorn/issues/329)",
            "HTTP/2 on port 8000, a path like /v1/x#1, &#38; and 4,300 digits",
        ]
    )
    assert internal_issues(text) == [
        (1, "Issue 27"),
        (2, "issue 19"),
        (2, "issues 16"),
        (3, "issue #19"),
        (3, "PR 12"),
        (3, "pull request #4"),
        (3, "ticket 3"),
        (4, "#27"),
        (4, "#28"),
    ]
