"""The catalog's ``[[sources]]``: every entry says where its claims come from and when they were
checked, and docs/providers.md's table of what was verified says the same (it cannot drift)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from llmroute._catalog import CatalogError, ProviderSpec, load_catalog, parse_provider

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "providers.md"
BEGIN, END = "<!-- sources table: begin -->", "<!-- sources table: end -->"
CORE = ("base_url", "api_key_env", "continuation", "prompt_caching", "stream_usage", "responses")
"""The claims every entry makes; the table names those no source covers."""
FIRST = datetime.date(2026, 11, 30)
"""The day the catalog was first written: no claim was checked before it."""

CATALOG = load_catalog()


def sources_table(catalog: dict[str, ProviderSpec]) -> list[str]:
    """docs/providers.md's table of what was verified and when, built from the catalog."""
    rows = [
        "| vendor | oldest check | verified on the vendor's pages | not verified | not cited |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, spec in sorted(catalog.items()):
        by_day: dict[datetime.date, list[str]] = {}
        unverified: list[str] = []
        cited: set[str] = set()
        for source in spec.sources:
            cited.update(source.claims)
            if source.verified:
                day = by_day.setdefault(source.checked, [])
                day.extend(claim for claim in source.claims if claim not in day)
            elif (entry := f"{', '.join(source.claims)} ({source.checked})") not in unverified:
                unverified.append(entry)
        days = sorted(by_day.items())
        verified = "; ".join(f"{day}: {', '.join(claims)}" for day, claims in days)
        missing = ", ".join(claim for claim in CORE if claim not in cited)
        rows.append(
            f"| `{name}` | {spec.checked} | {verified or '-'} | {'; '.join(unverified) or '-'} "
            f"| {missing or '-'} |"
        )
    return rows


def test_the_docs_table_of_what_was_verified_matches_the_catalog() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOC} lost its sources table markers"
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip().splitlines()
    expected = sources_table(dict(CATALOG))
    assert table == expected, "docs/providers.md's sources table is stale; it should read:\n" + (
        "\n".join(expected)
    )


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_entry_cites_dated_sources(name: str) -> None:
    spec = CATALOG[name]
    assert spec.sources, f"{name}: no [[sources]]"
    assert spec.checked == min(source.checked for source in spec.sources)
    for source in spec.sources:
        assert FIRST <= source.checked <= datetime.date.today(), source
        assert source.verified or source.note, f"{name}: say why a claim is not verified"
    # The sources come last in the file, after every claim they date.
    text = (ROOT / "providers" / f"{name}.toml").read_text(encoding="utf-8")
    tail = text[text.index("[[sources]]") :]
    assert all(
        line.startswith(
            ("[[sources]]", "about", "models", "url", "checked", "verified", "note", "#")
        )
        for line in tail.splitlines()
        if line.strip()
    ), f"{name}: only [[sources]] tables after the first one"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"about": "pricing", "url": "https://x.test/", "checked": "2026-12-01"}, "unknown claim"),
        ({"about": "base_url", "checked": "2026-12-01"}, "a verified source needs its url"),
        ({"about": "base_url", "url": "http://x.test/", "checked": "2026-12-01"}, "https://"),
        ({"about": "base_url", "url": "https://x.test/", "checked": "monday"}, "checked"),
    ],
)
def test_a_bad_source_is_named(source: dict[str, str], message: str) -> None:
    data = {"base_url": "https://api.x.test/v1", "sources": [source]}
    with pytest.raises(CatalogError, match=message) as raised:
        parse_provider("x", data, source="providers/x.toml")
    assert "providers/x.toml: sources.0" in str(raised.value)


def _is_endpoint(url: str) -> bool:
    """An API address or a template in a comment (not a page to cite)."""
    host, _, path = url.removeprefix("https://").partition("/")
    return (
        host.startswith("api.")
        or any(mark in url for mark in ("{", "<"))
        or any(part in ("v1", "v1beta", "v4", "beta", "openai") for part in path.split("/"))
    )


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_page_a_comment_cites_is_a_source(name: str) -> None:
    """A page named in a comment is dated in the file's [[sources]] too."""
    text = (ROOT / "providers" / f"{name}.toml").read_text(encoding="utf-8")
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    pages = {url.rstrip(").,;:") for url in re.findall(r"https://[^\s\"]+", comments)}
    cited = {source.url for source in CATALOG[name].sources}
    assert sorted(page for page in pages - cited if not _is_endpoint(page)) == []


COST_DOC = ROOT / "docs" / "cost.md"
PRICES_BEGIN, PRICES_END = "<!-- prices table: begin -->", "<!-- prices table: end -->"


def _money(value: object) -> str:
    return "-" if value is None else f"{value}"


def prices_table(catalog: dict[str, ProviderSpec]) -> list[str]:
    """docs/cost.md's table of the catalog's prices, with the day each was read and whether on
    the vendor's own page."""
    rows = [
        "| vendor | model | input | cached input | cache write (5m / 1h) | output | long prompts "
        "| read | on the vendor's page |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, spec in sorted(catalog.items()):
        for model, price in spec.prices.items():
            source = next(s for s in spec.sources if "prices" in s.claims and model in s.models)
            writes = f"{_money(price.cache_write)} / {_money(price.cache_write_1h)}"
            if price.cache_write is None and price.cache_write_1h is None:
                writes = "-"
            tiers = "; ".join(
                f"over {tier.above_prompt_tokens:,}: "
                + (f"{tier.input} / {tier.output}" if tier.priced else "unknown")
                for tier in price.tiers
            )
            until = f", until {price.valid_until}" if price.valid_until else ""
            rows.append(
                f"| `{name}` | `{model}` | {price.input} {price.currency}{until} "
                f"| {_money(price.cached_input)} | {writes} | {price.output} | {tiers or '-'} "
                f"| {source.checked} | {'yes' if source.verified else 'no'} |"
            )
    return rows


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_price_has_a_dated_source(name: str) -> None:
    spec = CATALOG[name]
    dated = {m for s in spec.sources if "prices" in s.claims for m in s.models}
    assert sorted(set(spec.prices) - dated) == [], f"{name}: prices no [[sources]] entry dates"
    assert sorted(dated - set(spec.prices)) == [], f"{name}: a prices source names no price"
    for source in spec.sources:
        assert not source.models or "prices" in source.claims, source


def test_the_docs_table_of_prices_matches_the_catalog() -> None:
    text = COST_DOC.read_text(encoding="utf-8")
    assert PRICES_BEGIN in text and PRICES_END in text, f"{COST_DOC} lost its prices markers"
    table = text[text.index(PRICES_BEGIN) + len(PRICES_BEGIN) : text.index(PRICES_END)]
    expected = prices_table(dict(CATALOG))
    assert table.strip().splitlines() == expected, (
        "docs/cost.md's prices table is stale; it should read:\n" + "\n".join(expected)
    )
