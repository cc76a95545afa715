"""The gateway's live page (``[gateway] live_page``, llmroute/server/_live.py): its data only for
an admin key, nothing sampled while nobody watches, and the page itself driven in a real headless
Chromium (Debian's, through playwright; never a downloaded browser) while a simulated target is
made slow under real traffic.

``LLMROUTE_LIVE_SCREENSHOT=docs/img/live-page.png`` saves the page as the browser test leaves it.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmroute.config import load_config
from llmroute.server import Gateway
from llmroute.server._live import LiveView
from llmroute.testing import Profile, Simulator

from ..clock import FakeClock

KEYS = {"app": "gw-live-app-0123456789", "ops": "gw-live-ops-0123456789"}
ENVIRON = {"GW_APP": KEYS["app"], "GW_OPS": KEYS["ops"]}
UPSTREAM_KEY = "sk-live-upstream-0123456789"
MESSAGES = [{"role": "user", "content": "Watch the routing."}]
TTFT = {"fast": 0.02, "mid": 0.06, "far": 0.09}  # seconds: each target's median first token
SLOW = 0.8  # seconds: the fast target's first token once it is made slow
WAIT_MS = 20_000  # a hang guard on each wait for the page (the assertions follow it)
MAX_REQUESTS = 1500  # the traffic thread's bound


def config(sims: dict[str, Simulator], **gateway: Any) -> dict[str, Any]:
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": UPSTREAM_KEY} for name, sim in sims.items()
        },
        "models": {
            "chat": {
                "targets": [f"{name}:sim-small" for name in sims],
                "policy": "hedge",
                "hedge_after": "150ms",
                "hedge_budget": 1.0,
            }
        },
        "routing": {"explore": 0},
        "gateway": {
            "keys": {"app": "GW_APP", "ops": "GW_OPS"},
            "tenants": {"ops": {"admin": True}, "app": {"slo_ttft_ms": 300}},
            "slos": {"chat": {"ttft_ms": 200}},
            **gateway,
        },
    }


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Simulator]]:
    started: dict[str, Simulator] = {}
    try:
        for name, ttft in TTFT.items():
            sim = Simulator(profile=Profile(ttft_median=ttft, reply_tokens=8))
            started[name] = sim.__enter__()
        yield started
    finally:
        for sim in started.values():
            sim.__exit__(None, None, None)


def gateway(sims: dict[str, Simulator], **settings: Any) -> Gateway:
    ctx = next(iter(sims.values())).ssl_context()
    return Gateway(config(sims, **settings), environ=ENVIRON, verify=ctx, max_retries=0)


def root(gw: Gateway) -> str:
    return gw.base_url.removesuffix("/v1")


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def send(gw: Gateway, n: int) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEYS["app"], max_retries=0)
    for _ in range(n):
        stream = client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        for _chunk in stream:
            pass
    client.close()


# -- the data, without a browser -------------------------------------------------------------


def test_off_unless_configured(sims: dict[str, Simulator]) -> None:
    with gateway(sims) as gw:
        for path in ("/admin/live", "/admin/live/data", "/admin/live/live.js"):
            assert httpx.get(root(gw) + path, headers=bearer("ops")).status_code == 404
        assert gw.app.live is None


def test_only_an_admin_key_reads_the_data_and_the_page_holds_none(
    sims: dict[str, Simulator],
) -> None:
    with gateway(sims, live_page=True) as gw:
        url = root(gw) + "/admin/live/data"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"authorization": "Bearer nope"}).status_code == 401
        refused = httpx.get(url, headers=bearer("app"))
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert KEYS["app"] not in refused.text
        # A key in the URL is never looked at.
        assert httpx.get(url, params={"key": KEYS["ops"]}).status_code == 401
        assert gw.app.live is not None and gw.app.live.sampled == 0  # refused: nothing sampled
        answer = httpx.get(url, headers=bearer("ops"))
        assert answer.status_code == 200
        data = answer.json()
        assert data["routes"]["chat"]["targets"] == [f"{n}:sim-small" for n in TTFT]
        assert set(data["usage"]) == {"app", "ops"}
        assert answer.headers["cache-control"] == "no-store"
        assert "script-src 'self'" in answer.headers["content-security-policy"]
        page = httpx.get(root(gw) + "/admin/live")  # static: no key needed, no data in it
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        for asset in ("live.js", "live.css"):
            assert httpx.get(root(gw) + "/admin/live/" + asset).status_code == 200
        text = page.text + httpx.get(root(gw) + "/admin/live/live.js").text
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text  # nothing from another host
        assert UPSTREAM_KEY not in answer.text


def test_nothing_is_sampled_while_nobody_watches(sims: dict[str, Simulator]) -> None:
    with gateway(sims, live_page=True) as gw:
        send(gw, 20)
        httpx.get(root(gw) + "/health")
        httpx.get(root(gw) + "/metrics", headers=bearer("ops"))
        live = gw.app.live
        assert live is not None
        assert (live.sampled, len(live.samples)) == (0, 0)
        data = httpx.get(root(gw) + "/admin/live/data", headers=bearer("ops")).json()
        assert live.sampled == 1
        (sample,) = data["samples"]
        attempts = sum(
            n
            for target in sample["targets"].values()
            for outcomes in target["attempts"].values()
            for n in outcomes.values()
        )
        assert attempts >= 20
        assert data["usage"]["app"]["requests"] <= 20  # a stream's end is counted as it closes


def test_one_sample_per_interval_however_many_viewers_ask() -> None:
    clock = FakeClock(100.0)
    counts: dict[str, Any] = {
        "requests": {("chat", "ok", "live"): 3.0},
        "attempts": {("a:m", "first", "won"): 3.0, ("a:m", "hedge", "cancelled"): 1.0},
        "hedges_fired": {("chat",): 1.0},
        "hedges_won": {},
        "hedges_denied": {},
        "continuations": {},
        "cache_hits": {("chat", "cache"): 2.0},
        "tier_decisions": {("smart", "easy", "chat", "classifier"): 2.0},
        "request_ttft_buckets": {
            ("chat", "live", "0.1"): 2.0,
            ("chat", "live", "+Inf"): 3.0,
            ("chat", "cache", "0.1"): 2.0,
            ("chat", "cache", "+Inf"): 2.0,
        },
    }

    class Metrics:
        def counts(self) -> dict[str, Any]:
            return counts

    async def usage() -> dict[str, Any]:
        return {"keys": {}}

    loaded = load_config(
        {
            "providers": {"a": {"base_url": "https://a.invalid/v1", "api_key": "x"}},
            "models": {"chat": {"targets": ["a:m"]}},
        }
    )
    assert loaded is not None
    live = LiveView(
        loaded,
        dict,
        Metrics(),  # type: ignore[arg-type]
        usage,
        lambda: {"series": []},
        clock=clock,
        keep=3,
    )
    first = anyio.run(live.data, 0)
    assert [s["seq"] for s in first["samples"]] == [1]
    sample = first["samples"][0]
    assert sample["targets"]["a:m"]["attempts"] == {
        "first": {"won": 3.0},
        "hedge": {"cancelled": 1.0},
    }
    assert sample["routes"]["chat"]["requests"] == {"ok/live": 3.0}
    assert sample["routes"]["chat"]["cache"] == {"cache": 2.0}
    assert first["ttft_le"] == ["0.1", "+Inf"]
    assert sample["tiers"] == [
        {"model": "smart", "class": "easy", "tier": "chat", "reason": "classifier", "n": 2}
    ]
    assert sample["routes"]["chat"]["ttft_buckets"] == [4, 5]  # every source, cumulative
    for _ in range(5):  # five viewers within the same second
        assert anyio.run(live.data, 1)["samples"] == []
    assert live.sampled == 1
    for _ in range(4):
        clock.advance(1.0)
        anyio.run(live.data, 0)
    assert live.sampled == 5
    assert [s["seq"] for s in live.samples] == [3, 4, 5]  # the ring keeps its last 3
    assert [s["seq"] for s in anyio.run(live.data, 4)["samples"]] == [5]
    assert anyio.run(live.data, 5)["replica"] == first["replica"] == live.replica


# -- the page in a real browser ----------------------------------------------------------------


def chromium() -> str:
    """Debian's Chromium, or skip (fail under CI, which installs it: .ci/run)."""
    why = ""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "the playwright package is not installed (pip install -e '.[dev]')"
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        why = why or "no chromium on the PATH (apt-get install chromium)"
    if why:
        message = f"{why}: the live page's browser test is skipped"
        if os.environ.get("CI"):
            pytest.fail(message + " -- but under CI it must run")
        pytest.skip(message)
    assert binary is not None
    return binary


def change_profile(sim: Simulator, **fields: Any) -> None:
    url = sim.base_url.removesuffix("/v1") + "/_sim/profile"
    answer = httpx.post(url, json=fields, verify=sim.ssl_context())
    assert answer.status_code == 200


ROW = "tr[data-target='{}'] td[data-field='{}']"


def test_the_page_in_a_browser_follows_a_target_made_slow(sims: dict[str, Simulator]) -> None:
    binary = chromium()
    from playwright.sync_api import sync_playwright

    fast = "fast:sim-small"
    change_profile(sims["fast"], ttft_median=TTFT["fast"])
    with gateway(sims, live_page=True) as gw:
        stop = threading.Event()
        sent = [0]

        def traffic() -> None:
            client = openai.OpenAI(base_url=gw.base_url, api_key=KEYS["app"], max_retries=0)
            while not stop.is_set() and sent[0] < MAX_REQUESTS:
                stream = client.chat.completions.create(
                    model="chat", messages=MESSAGES, stream=True
                )
                for _chunk in stream:
                    pass
                sent[0] += 1
            client.close()

        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=binary, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 760})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" else None,
                )
                offsite: list[str] = []
                page.on(
                    "request",
                    lambda req: None if req.url.startswith(root(gw)) else offsite.append(req.url),
                )
                page.goto(root(gw) + "/admin/live")
                status = page.locator("#status")
                assert status.get_attribute("data-state") == "signed-out"
                # Refused with a tenant's key, and with a key that is none of the gateway's.
                for key, code in ((KEYS["app"], "403"), ("not-a-key", "401")):
                    page.fill("#key", key)
                    page.click("#login button")
                    page.wait_for_selector(
                        f"#status[data-state='refused'][data-status='{code}']", timeout=WAIT_MS
                    )
                    assert page.locator("tr[data-target]").count() == 0
                    assert page.evaluate("sessionStorage.length") == 0
                assert page.url == root(gw) + "/admin/live"  # no key in the URL, ever
                page.fill("#key", KEYS["ops"])
                page.click("#login button")
                page.wait_for_selector("#status[data-state='live']", timeout=WAIT_MS)
                assert KEYS["ops"] not in page.url
                shown = page.eval_on_selector_all(
                    "tr[data-target]", "rows => rows.map(r => r.dataset.target)"
                )
                assert shown == [f"{name}:sim-small" for name in TTFT]

                def value(target: str, field: str) -> float:
                    raw = page.get_attribute(ROW.format(target, field), "data-value")
                    return float(raw) if raw else 0.0

                def hedges() -> float:
                    raw = page.get_attribute(
                        "[data-route='chat'] [data-field='hedges_fired']", "data-value"
                    )
                    return float(raw or 0)

                # The fast target serves nearly everything first.
                page.wait_for_function(
                    """() => {
                        const row = document.querySelector("tr[data-target='fast:sim-small']");
                        const get = (f) => row.querySelector(`[data-field='${f}']`).dataset.value;
                        return row && get("share") !== "" && Number(get("share")) >= 0.6
                            && get("p95") !== "";
                    }""",
                    timeout=WAIT_MS,
                )
                share_before, p95_before = value(fast, "share"), value(fast, "p95")
                hedges_before = hedges()
                assert p95_before < SLOW / 2

                change_profile(sims["fast"], ttft_median=SLOW)
                page.wait_for_function(
                    """([before, hedges, slow]) => {
                        const row = document.querySelector("tr[data-target='fast:sim-small']");
                        const get = (f) => Number(
                            row.querySelector(`[data-field='${f}']`).dataset.value || 0);
                        const fired = Number(document.querySelector(
                            "[data-route='chat'] [data-field='hedges_fired']").dataset.value || 0);
                        return get("p95") >= slow && get("share") < before && fired > hedges;
                    }""",
                    arg=[share_before, hedges_before, 0.15],
                    timeout=WAIT_MS,
                )
                assert value(fast, "p95") >= 0.15 > p95_before  # its p95 line rose
                assert value(fast, "share") < share_before  # traffic moved away
                assert hedges() > hedges_before  # a hedge counter moved
                callers = page.get_attribute(
                    "[data-route='chat'] [data-field='caller_p95']", "data-value"
                )
                assert callers and float(callers) > 0  # the callers' TTFT, from the buckets
                path = page.locator(
                    "[data-route='chat'] svg path[data-series='fast:sim-small']"
                ).get_attribute("d")
                assert path is not None and path.count("L") >= 2  # a line, drawn
                assert offsite == []  # nothing asked of any other host
                shot = os.environ.get("LLMROUTE_LIVE_SCREENSHOT")
                if shot:
                    page.screenshot(path=shot, full_page=True)
                browser.close()
        finally:
            stop.set()
            thread.join(30)  # a hang guard only
        assert not thread.is_alive()
        assert gw.app.live is not None and gw.app.live.sampled >= 2
        # The refusals (401, 403) are logged by Chromium as failed loads; nothing else is.
        assert [e for e in errors if "401" not in e and "403" not in e] == []


def test_the_docs_example_turns_the_page_on_for_an_admin_key() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if "live_page" in b]
    example = tomllib.loads(block)
    example["providers"] = {"a": {"base_url": "https://a.invalid/v1", "api_key": "x"}}
    example["models"] = {"chat": {"targets": ["a:m"]}}
    loaded = load_config(example)
    assert loaded is not None and loaded.gateway is not None
    assert loaded.gateway.live_page is True
    assert loaded.gateway.tenants["ops"].admin is True
