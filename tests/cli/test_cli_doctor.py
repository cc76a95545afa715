"""``llmroute doctor`` and the catalog: the day a vendor's facts were checked, and what the
vendor's own ``/models`` (the simulator standing in for it, over TLS + HTTP/2) says of the
configured models. A made-up vendor stands in the catalog, so no real model name is involved."""

from __future__ import annotations

import datetime
import logging
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import llmroute.config._resolve
import llmroute.config._sdk
from llmroute._catalog import ProviderSpec, RetiredModel, Source, load_catalog
from llmroute.cli import main
from llmroute.cli._doctor import (
    STALE_AFTER_DAYS,
    _list_models,
    checked_line,
    models_lines,
    retired_lines,
)
from llmroute.config import resolve_provider
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

CHECKED = datetime.date(2026, 11, 30)
ACME = ProviderSpec.model_validate(
    {
        "name": "acme",
        "display_name": "Acme AI",
        "base_url": "https://api.acme.invalid/v1",
        "api_key_env": "ACME_API_KEY",
        "models": ["acme-2", "acme-mini"],
        "retired_models": {
            "acme-1": RetiredModel(shutdown=datetime.date(2026, 7, 24), use="acme-2")
        },
        "sources": [
            Source(about="base_url", url="https://docs.acme.invalid/api", checked=CHECKED),
            Source(about="continuation", url="https://docs.acme.invalid/prefix", checked=CHECKED),
        ],
    }
)


@pytest.fixture
def acme_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real catalog plus ``acme``, as the config module reads it."""
    catalog = types.MappingProxyType({**load_catalog(), "acme": ACME})
    for module in (llmroute.config._sdk, llmroute.config._resolve):
        monkeypatch.setattr(module, "load_catalog", lambda: catalog)


@pytest.fixture
def vendor() -> Iterator[Simulator]:
    """Acme's API: it serves any model asked for, but its /models no longer lists acme-1 and
    lists twelve newer models beside the catalog's."""
    newer = tuple(f"acme-next-{i:02}" for i in range(12))
    profile = Profile(reply_tokens=3, listed_models=("acme-2", "acme-mini", *newer))
    with Simulator(profile=profile, tls=True) as server:
        yield server


@pytest.mark.usefixtures("acme_catalog")
def test_doctor_names_a_model_the_vendor_no_longer_lists_and_newer_ones(
    vendor: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.acme]\nbase_url = "{vendor.base_url}"\napi_key = "{KEY}"\n'
        '[models.chat]\ntargets = ["acme:acme-1", "acme:acme-2"]\n'
    )
    code = main(["doctor", "--config", str(config), "--probes", "1", "--ca", vendor.ca_pem_path])
    out, err = capsys.readouterr()
    assert code == 0, err  # the simulator still answers acme-1: a warning, not a failure
    lines = out.splitlines()
    assert "acme: the catalog's facts on Acme AI were checked on 2026-11-30." in lines
    assert (
        "acme: retired: Acme AI shut down acme-1 on 2026-07-24: use acme-2 (the catalog's "
        "retired_models; requests still go to acme-1 while Acme AI answers it)"
    ) in lines
    assert (
        "acme: no longer listed by Acme AI: acme-1 "
        "(the catalog says it shut down on 2026-07-24, use acme-2)"
    ) in lines
    newer = ", ".join(f"acme-next-{i:02}" for i in range(10))
    assert (
        f"acme: newer models Acme AI lists that the catalog does not know yet: {newer} (and 2 more)"
    ) in lines
    asked = [r for r in vendor.last_requests if r["path"] == "/v1/models"]
    assert len(asked) == 1 and asked[0]["headers"]["authorization"] == f"Bearer {KEY}"
    assert KEY not in out + err


@pytest.mark.usefixtures("acme_catalog")
def test_a_failed_models_list_is_a_sentence_without_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(
        '[providers.acme]\nbase_url = "https://127.0.0.1:1/v1"\n'
        f'api_key = "{KEY}"\n[models.chat]\ntargets = ["acme:acme-2"]\n'
    )
    code = main(["doctor", "--config", str(config), "--probes", "1", "--timeout", "10"])
    out, err = capsys.readouterr()
    assert code == 1  # the probe failed too
    assert "acme: could not ask Acme AI for its models: ConnectError from " in out
    assert "Traceback" not in out + err and KEY not in out + err


def test_what_a_models_list_says_of_the_configured_models() -> None:
    lines = models_lines("acme", ACME, ["acme-2", "acme-typo"], ["acme-2"])
    assert lines == [
        "acme: no longer listed by Acme AI: acme-typo "
        "(the catalog does not say why: check the name)"
    ]
    assert models_lines("acme", ACME, ["acme-2"], ["acme-2", "acme-mini"]) == [
        "acme: Acme AI lists every configured model (1)."
    ]
    # Without the catalog's own list, nothing is called newer.
    bare = ACME.model_copy(update={"models": ()})
    assert models_lines("bare", bare, ["acme-2"], ["acme-2", "x", "y"]) == [
        "bare: Acme AI lists every configured model (1)."
    ]


@pytest.mark.usefixtures("acme_catalog")
def test_a_retired_model_is_named_even_while_the_vendor_still_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Doctor names a configured model the catalog calls retired whatever /models says (here
    the vendor still lists and serves it), and loading the config logs it once, as a warning:
    a vendor may serve a model past its announced date."""
    profile = Profile(reply_tokens=3, listed_models=("acme-1", "acme-2"))
    with Simulator(profile=profile, tls=True) as vendor:
        config = tmp_path / "llmroute.toml"
        config.write_text(
            f'[providers.acme]\nbase_url = "{vendor.base_url}"\napi_key = "{KEY}"\n'
            '[models.chat]\ntargets = ["acme:acme-1"]\n[models.other]\ntargets = ["acme:acme-1"]\n'
        )
        args = ["doctor", "--config", str(config), "--probes", "1", "--ca", vendor.ca_pem_path]
        with caplog.at_level(logging.WARNING, logger="llmroute"):
            assert main(args) == 0  # advice, not a failure
            assert main(args) == 0
    out, _ = capsys.readouterr()
    notice = "Acme AI shut down acme-1 on 2026-07-24: use acme-2"
    assert f"acme: retired: {notice} (the catalog's retired_models; " in out
    assert "acme: Acme AI lists every configured model (1)." in out
    warned = [r.getMessage() for r in caplog.records if notice in r.getMessage()]
    assert warned == [
        f"{config}: models.chat: target acme:acme-1: {notice} (the catalog's retired_models); "
        "llmroute still sends it, in case Acme AI answers it"
    ]  # once per config and target, however many routes and loads name it


def test_a_shutdown_still_ahead_is_said_in_the_future() -> None:
    before = datetime.date(2026, 7, 23)
    assert retired_lines("acme", ACME, ["acme-2", "acme-1", "acme-1"], before) == [
        "acme: retired: Acme AI shuts down acme-1 on 2026-07-24: use acme-2 (the catalog's "
        "retired_models; requests still go to acme-1 while Acme AI answers it)"
    ]
    assert retired_lines("acme", ACME, ["acme-2"], before) == []


def test_the_checked_date_is_called_old_past_the_limit() -> None:
    fresh = CHECKED + datetime.timedelta(days=STALE_AFTER_DAYS)
    assert checked_line("acme", ACME, fresh).endswith("were checked on 2026-11-30.")
    stale = checked_line("acme", ACME, fresh + datetime.timedelta(days=1))
    assert stale == (
        f"acme: the catalog's facts on Acme AI were last checked on 2026-11-30, "
        f"{STALE_AFTER_DAYS + 1} days ago: they may be out of date (docs/providers.md lists the "
        "pages to check)."
    )
    unsourced = ACME.model_copy(update={"sources": ()})
    unsourced_line = checked_line("acme", unsourced, fresh)
    assert unsourced_line == "acme: the catalog cites no sources for Acme AI."
    assert unsourced.checked is None and ACME.checked == CHECKED


@pytest.mark.anyio
async def test_anthropics_models_list_is_asked_its_way(vendor: Simulator) -> None:
    """Anthropic's GET /v1/models takes the key in x-api-key (with anthropic-version) and pages
    its list: doctor asks for the largest page, and never sends the key as a bearer token."""
    table = {"base_url": vendor.base_url, "api_key": KEY, "verify": vendor.ca_pem_path}
    provider = resolve_provider("anthropic", table)
    listed = await _list_models(provider, True, 30.0)
    assert isinstance(listed, list) and "acme-next-11" in listed
    asked = vendor.last_requests[-1]
    assert asked["path"] == "/v1/models" and asked["query"] == {"limit": "1000"}
    assert asked["headers"]["x-api-key"] == KEY and "authorization" not in asked["headers"]
    assert asked["headers"]["anthropic-version"] == "2023-06-01"


def test_a_certificate_that_does_not_verify_is_named(
    vendor: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --ca the simulator's certificate does not verify: the probe's error says so
    (openai's own "Connection error." alone would hide why), as llmroute chat's does."""
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.sim]\nbase_url = "{vendor.base_url}"\napi_key = "{KEY}"\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n'
    )
    code = main(["doctor", "--config", str(config), "--probes", "1"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "APIConnectionError: Connection error: TLS handshake with 127.0.0.1:" in out
    assert "CERTIFICATE_VERIFY_FAILED" in err
