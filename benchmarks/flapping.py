"""failoverbench's flapping primary (issue 26 item 3), at real scale: when is the primary back?

An ordered route ``primary -> fallback`` (policy ``failover``, every other setting the default:
5 failures open a circuit; while it is open, a background trial every 5 s, ``breaker_cooldown``
and ``breaker_max_cooldown``). Two simulated providers, each its own process over TLS + HTTP/2
(``SimulatorProcess``; 16-token replies, TTFT 50 ms). The primary answers 503 to everything for
``--outage`` seconds (60), then is healthy (``POST /_sim/profile``); one streamed request every
``--every`` seconds (4) for ``--duration`` seconds (80). A side task reads the primary's circuit
and the trials sent every 50 ms, so each event's time is known to ~50 ms.

Prints when the circuit opened, each trial and its verdict, when the circuit closed and when the
primary answered a request again after its recovery, and what the callers saw (errors, requests
the primary received outside trials while its circuit was open). failoverbench wants the
primary back in use within 30 s of its recovery; issue 26, within 10 s.

    .venv/bin/python benchmarks/flapping.py [--duration 80 --outage 60 --every 4 --json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
import openai

import llmroute
from llmroute.testing import Profile, SimulatorProcess

MODEL = "sim-small"
PRIMARY, FALLBACK = f"primary:{MODEL}", f"fallback:{MODEL}"
PROFILE: dict[str, Any] = {"reply_tokens": 16, "inter_token": 0.005, "ttft_median": 0.05}


@dataclass
class Request:
    at: float
    """Seconds after the run began."""
    winner: str | None = None
    attempts: list[tuple[str, str]] = field(default_factory=list)
    ttft: float | None = None
    error: str | None = None


@dataclass
class Event:
    at: float
    what: str


async def ask(client: llmroute.AsyncOpenAI, i: int, began: float) -> Request:
    request = Request(at=time.perf_counter() - began)
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(60):
            stream = await client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": f"flapping question {i}"}],
                stream=True,
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content and request.ttft is None:
                    request.ttft = time.perf_counter() - t0
        report = getattr(stream, "route", None)
        if report is not None:
            request.winner = report.winner
            request.attempts = [(a.target, a.outcome or "") for a in report.attempts]
    except (openai.APIError, TimeoutError) as exc:
        request.error = f"{type(exc).__name__}: {exc}"[:200]
    return request


async def watch(client: llmroute.AsyncOpenAI, began: float, events: list[Event]) -> None:
    """Every 50 ms: the primary's circuit state, and the trials sent and their verdicts."""
    router = client._router  # pyright: ignore[reportPrivateUsage]
    trials = getattr(client._llmroute, "trials", None)  # pyright: ignore[reportPrivateUsage]
    state, sent, verdicts = "closed", 0, {}
    while True:
        now = time.perf_counter() - began
        new_state = router.health(PRIMARY).breaker.shared_state
        if new_state != state:
            events.append(Event(now, f"circuit {state} -> {new_state}"))
            state = new_state
        if trials is not None:
            if trials.sent[PRIMARY] != sent:
                sent = trials.sent[PRIMARY]
                events.append(Event(now, f"trial {sent} sent"))
            for (target, verdict), n in trials.verdicts.items():
                if target == PRIMARY and verdicts.get(verdict) != n:
                    verdicts[verdict] = n
                    events.append(Event(now, f"trial verdict: {verdict} (#{n})"))
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    primary = SimulatorProcess(profile=Profile(rate_503=1.0, seed=21, **PROFILE), tls=True)
    fallback = SimulatorProcess(profile=Profile(seed=22, **PROFILE), tls=True)
    primary.start()
    fallback.start()
    try:
        ctx = ssl.create_default_context()
        for proc in (primary, fallback):
            ctx.load_verify_locations(cafile=proc.ca_pem_path)
        config = {
            "providers": {
                "primary": {"base_url": primary.base_url, "api_key": "unused"},
                "fallback": {"base_url": fallback.base_url, "api_key": "unused"},
            },
            "models": {"chat": {"targets": [PRIMARY, FALLBACK], "policy": "failover"}},
        }
        requests: list[Request] = []
        events: list[Event] = []
        recovered: list[float] = []
        async with llmroute.AsyncOpenAI(api_key="unused", config=config, verify=ctx) as client:
            began = time.perf_counter()

            async def recover() -> None:
                await asyncio.sleep(args.outage)
                await asyncio.to_thread(primary.change_profile, rate_503=0.0)
                recovered.append(time.perf_counter() - began)
                events.append(Event(recovered[0], "primary recovered (profile changed)"))

            watcher = asyncio.create_task(watch(client, began, events))
            recovery = asyncio.create_task(recover())
            i = 0
            while (due := i * args.every) < args.duration:
                now = time.perf_counter() - began
                if due > now:
                    await asyncio.sleep(due - now)
                requests.append(await ask(client, i, began))
                i += 1
            await recovery
            watcher.cancel()
            settings = client._llmroute.resolved.routing  # pyright: ignore[reportPrivateUsage]
            cooldowns = (settings.breaker_cooldown, settings.breaker_max_cooldown)
        received = primary.stats()["chat_requests"]
    finally:
        primary.stop()
        fallback.stop()
    recovered_at = recovered[0] if recovered else None
    return summarize(args, requests, events, recovered_at, received, cooldowns)


def summarize(
    args: argparse.Namespace,
    requests: list[Request],
    events: list[Event],
    recovered_at: float | None,
    received: int,
    cooldowns: tuple[float, float],
) -> dict[str, Any]:
    opened = next((e.at for e in events if e.what.endswith("-> open")), None)
    closed = next(
        (e.at for e in events if e.what.endswith("-> closed") and opened and e.at > opened), None
    )
    back = next(
        (
            r.at
            for r in requests
            if recovered_at is not None and r.at >= recovered_at and r.winner == PRIMARY
        ),
        None,
    )
    caller_attempts_on_primary = sum(t == PRIMARY for r in requests for t, _ in r.attempts)
    trials = sum(1 for e in events if e.what.startswith("trial") and e.what.endswith("sent"))
    return {
        "settings": {
            "duration": args.duration,
            "outage": args.outage,
            "every": args.every,
            "breaker_cooldown": cooldowns[0],
            "breaker_max_cooldown": cooldowns[1],
        },
        "circuit_opened_s": opened,
        "recovered_s": recovered_at,
        "circuit_closed_s": closed,
        "closed_after_recovery_s": None
        if closed is None or recovered_at is None
        else closed - recovered_at,
        "primary_answered_again_s": back,
        "answered_after_recovery_s": None
        if back is None or recovered_at is None
        else back - recovered_at,
        "requests": len(requests),
        "caller_errors": sum(r.error is not None for r in requests),
        "served_by_primary": sum(r.winner == PRIMARY for r in requests),
        "served_by_fallback": sum(r.winner == FALLBACK for r in requests),
        "trials_sent": trials,
        "primary_received": received,
        "caller_attempts_on_primary": caller_attempts_on_primary,
        "events": [asdict(e) for e in events],
        "timeline": [asdict(r) for r in requests],
        "machine": _machine.machine(["llmroute", "openai", "httpx", "h2", "anyio"]),
    }


def show(out: dict[str, Any]) -> None:
    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.1f} s"

    print("events:")
    for e in out["events"]:
        print(f"  {e['at']:6.2f} s  {e['what']}")
    print("requests:")
    for r in out["timeline"]:
        who = r["winner"] or r["error"]
        tried = ", ".join(f"{t.split(':')[0]} {o}" for t, o in r["attempts"])
        print(f"  {r['at']:6.2f} s  {who}  ({tried})")
    print(
        f"circuit opened at {s(out['circuit_opened_s'])}; primary recovered at "
        f"{s(out['recovered_s'])}; circuit closed at {s(out['circuit_closed_s'])} "
        f"({s(out['closed_after_recovery_s'])} after the recovery); the primary answered a "
        f"request again at {s(out['primary_answered_again_s'])} "
        f"({s(out['answered_after_recovery_s'])} after the recovery)"
    )
    print(
        f"{out['requests']} requests: {out['served_by_primary']} by the primary, "
        f"{out['served_by_fallback']} by the fallback, {out['caller_errors']} errors; "
        f"{out['trials_sent']} trials; the primary received {out['primary_received']} requests, "
        f"{out['caller_attempts_on_primary']} of them callers' attempts"
    )
    after = out["answered_after_recovery_s"]
    verdict = "PASS" if after is not None and after <= 10 else "FAIL"
    print(f"{verdict}: the primary answered a request within 10 s of its recovery: {s(after)}")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--duration", type=float, default=80.0, help="seconds of requests (80)")
    p.add_argument("--outage", type=float, default=60.0, help="seconds of 503s (60)")
    p.add_argument("--every", type=float, default=4.0, help="seconds between requests (4)")
    p.add_argument("--json", help="write every request and event to this file")
    args = p.parse_args()
    out = asyncio.run(run(args))
    show(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if out["answered_after_recovery_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
