"""What the gateway's live page (``[gateway] live_page``) costs, and its picture for the docs.

A gateway with 20 simulated targets (4 routes of 5, one simulator behind them all) serves
real streamed traffic, so every target has live statistics and counters. Then, with no traffic:

- **a sample**: ``LiveView.sample()`` (``client.stats()`` of 20 targets, the counters of
  ``client.metrics``), CPU per call;
- **a data request**: ``GET /admin/live/data`` as a viewer polls it (one new sample and the
  answer's JSON), the gateway process's CPU per request, beside ``GET /health`` as a floor;
- **nobody watching**: the samples taken while traffic is served and no viewer asks (a count:
  it must be 0), and the CPU per streamed request with the page on and off, interleaved.

``--screenshot PATH`` instead runs a scene for docs/img/live-page.png: two routes of three
targets, one made slow and one failing part of its requests mid-run, the page open in Debian's
Chromium (playwright, ``executable_path``; no browser download) for ``--seconds``.

    .venv/bin/python benchmarks/live_page.py
    .venv/bin/python benchmarks/live_page.py --screenshot docs/img/live-page.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
import httpx
import openai

from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

KEYS = {"app": "gw-bench-app-0123456789", "ops": "gw-bench-ops-0123456789"}
ENVIRON = {"GW_APP": KEYS["app"], "GW_OPS": KEYS["ops"]}
MESSAGES = [{"role": "user", "content": "Watch the routing."}]


def config(sims: dict[str, Simulator], routes: dict[str, list[str]], **gateway: Any) -> Any:
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": "sk-bench-upstream-0123"}
            for name, sim in sims.items()
        },
        "models": {
            route: {
                "targets": [f"{p}:sim-small" for p in providers],
                "policy": "hedge",
                "hedge_after": "150ms",
                "hedge_budget": 0.5,
            }
            for route, providers in routes.items()
        },
        "routing": {"explore": 0.05},
        "gateway": {
            "keys": {"app": "GW_APP", "ops": "GW_OPS"},
            "tenants": {"ops": {"admin": True}, "app": {"slo_ttft_ms": 300}},
            "slos": {route: {"ttft_ms": 250} for route in routes},
            **gateway,
        },
    }


def send(gw: Gateway, routes: list[str], n: int, stop: threading.Event | None = None) -> int:
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEYS["app"], max_retries=0)
    done = 0
    for i in range(n):
        if stop is not None and stop.is_set():
            break
        try:
            stream = client.chat.completions.create(
                model=routes[i % len(routes)], messages=MESSAGES, stream=True
            )
            for _chunk in stream:
                pass
        except openai.APIError:
            pass
        done += 1
    client.close()
    return done


def cpu_per_call(fn: Any, n: int) -> float:
    """Process CPU seconds per call of ``fn`` (the median of 5 rounds of ``n``)."""
    rounds = []
    for _ in range(5):
        began = time.process_time()
        for _ in range(n):
            fn()
        rounds.append((time.process_time() - began) / n)
    return statistics.median(rounds)


def cost(targets: int, requests: int) -> dict[str, Any]:
    per_route = 5
    routes = {
        f"r{r}": [f"p{r * per_route + i}" for i in range(per_route)]
        for r in range(targets // per_route)
    }
    with Simulator(profile=Profile(ttft_median=0.005, reply_tokens=20)) as sim:
        sims = {p: sim for providers in routes.values() for p in providers}
        ctx = sim.ssl_context()
        results: dict[str, Any] = {"targets": targets}
        with Gateway(
            config(sims, routes, live_page=True), environ=ENVIRON, verify=ctx, max_retries=0
        ) as gw:
            send(gw, list(routes), requests)
            live = gw.app.live
            assert live is not None
            results["samples_while_nobody_watched"] = live.sampled
            root = gw.base_url.removesuffix("/v1")
            results["sample_cpu_us"] = round(cpu_per_call(live.sample, 200) * 1e6, 1)
            results["sample_json_bytes"] = len(json.dumps(live.samples[-1]))
            live.interval = 0.0  # every data request takes a sample, as a 1 s poll does
            with httpx.Client() as http:
                headers = {"authorization": f"Bearer {KEYS['ops']}"}

                def data() -> None:
                    answer = http.get(
                        root + "/admin/live/data",
                        headers={**headers, "x-llmroute-live-since": str(live.seq)},
                    )
                    assert answer.status_code == 200

                def health() -> None:
                    assert http.get(root + "/health").status_code == 200

                results["data_request_cpu_us"] = round(cpu_per_call(data, 100) * 1e6, 1)
                results["health_request_cpu_us"] = round(cpu_per_call(health, 100) * 1e6, 1)
                first = http.get(root + "/admin/live/data", headers=headers)
                results["first_answer_bytes"] = len(first.content)
                results["poll_answer_bytes"] = len(
                    http.get(
                        root + "/admin/live/data",
                        headers={**headers, "x-llmroute-live-since": str(live.seq - 1)},
                    ).content
                )
        # Nobody watching: the page on or off, the same traffic, interleaved rounds.
        per_request: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(3):
            for mode in ("off", "on"):
                with Gateway(
                    config(sims, routes, live_page=mode == "on"),
                    environ=ENVIRON,
                    verify=ctx,
                    max_retries=0,
                ) as gw:
                    send(gw, list(routes), 20)  # warm
                    began = time.process_time()
                    send(gw, list(routes), requests)
                    per_request[mode].append((time.process_time() - began) / requests)
                    if mode == "on":
                        assert gw.app.live is not None and gw.app.live.sampled == 0
        for mode, values in per_request.items():
            results[f"stream_cpu_us_page_{mode}"] = round(statistics.median(values) * 1e6, 1)
            results[f"stream_cpu_us_page_{mode}_rounds"] = [round(v * 1e6) for v in values]
    return results


def screenshot(path: str, seconds: float) -> None:
    from playwright.sync_api import sync_playwright

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("no chromium on the PATH (apt-get install chromium)")
    profiles = {
        "deepseek": 0.09, "openai": 0.05, "gpu1": 0.03,  # route chat
        "anthropic": 0.12, "groq": 0.04, "gpu2": 0.07,  # route code
    }  # fmt: skip
    sims = {name: Simulator(profile=Profile(ttft_median=t, ttft_sigma=0.3, reply_tokens=12,
                                            inter_token=0.002, seed=i))
            for i, (name, t) in enumerate(profiles.items())}  # fmt: skip
    for sim in sims.values():
        sim.__enter__()
    routes = {"chat": ["deepseek", "openai", "gpu1"], "code": ["anthropic", "groq", "gpu2"]}
    try:
        ctx = next(iter(sims.values())).ssl_context()
        with Gateway(
            config(sims, routes, live_page=True), environ=ENVIRON, verify=ctx, max_retries=0
        ) as gw:
            stop = threading.Event()
            threads = [
                threading.Thread(target=send, args=(gw, list(routes), 100_000, stop))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            try:
                with sync_playwright() as pw:
                    browser = pw.chromium.launch(executable_path=binary, args=["--no-sandbox"])
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    page.goto(gw.base_url.removesuffix("/v1") + "/admin/live")
                    page.fill("#key", KEYS["ops"])
                    page.click("#login button")
                    began = time.monotonic()
                    changed = [False, False]
                    while time.monotonic() - began < seconds:
                        page.wait_for_timeout(1000)
                        elapsed = time.monotonic() - began
                        if elapsed > seconds * 0.4 and not changed[0]:
                            changed[0] = True  # gpu1 slows down: hedges, then traffic moves
                            _change(sims["gpu1"], ttft_median=0.6)
                        if elapsed > seconds * 0.6 and not changed[1]:
                            changed[1] = True  # groq fails a quarter of its requests
                            _change(sims["groq"], rate_500=0.25)
                    page.screenshot(path=path, full_page=True)
                    browser.close()
            finally:
                stop.set()
                for thread in threads:
                    thread.join(60)
    finally:
        for sim in sims.values():
            sim.__exit__(None, None, None)
    print(f"{path}: {os.path.getsize(path)} bytes")


def _change(sim: Simulator, **fields: Any) -> None:
    url = sim.base_url.removesuffix("/v1") + "/_sim/profile"
    assert httpx.post(url, json=fields, verify=sim.ssl_context()).status_code == 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--screenshot", metavar="PATH")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    if args.screenshot:
        screenshot(args.screenshot, args.seconds)
        return
    results = cost(args.targets, args.requests)
    results["machine"] = _machine.machine(["llmroute", "openai", "prometheus_client", "hypercorn"])
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
