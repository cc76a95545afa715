r"""Memory of the gateway per open stream, for sizing its pods (docs/deploy.md, "Sizing").

Runs ``llmroute serve`` (the image's command, on 127.0.0.1) in front of a simulator process
(TLS + HTTP/2 upstream, as a vendor), warms it with 50 whole requests, reads its RSS, then
opens N streamed requests that each get their first token and then wait (the simulator pauses
10 minutes before the next token: every stream is open mid-answer at once), and reads its RSS
again. Reported per N: (RSS with N open - RSS before) / N, from /proc/<pid>/status (VmRSS), after
every stream has its first chunk and a 2 s settle; then the RSS once they are closed. Each N
runs on a fresh gateway. ``--http 2`` opens the client side as h2c streams (90 per connection:
httpx takes at most 100 at once on one), ``--http 1.1`` one connection per stream (openai's
default client).

The route turns the stall timeout off and waits up to 10 minutes for a first token: with its
defaults the gateway ends a stream silent for 10 s after its first token (a stall, continued
elsewhere or ended with an error event), and on a loaded machine the first streams would be over
before the last had opened. Every wait is bounded: the N streams must all have their first token
within ``--open-timeout`` (a stream that fails first ends the run at once, saying why), the
gateway must still count all N in flight (its ``llmroute_gateway_in_flight``) when its RSS is
read, and it must exit within 30 s of SIGTERM; each bound that is hit ends the run with a
sentence (status 1). The streams are opened at most ``--opening`` at a time, so a loaded 2-core
machine opens them at a steady pace. (A burst of 1,000 first tokens takes longer than the live
first-token deadline, 5 s after the fast warm-up; on the route's only target an attempt now waits
up to ``first_token_timeout`` instead, and an open circuit no longer refuses a route's last
target: docs/routing.md, "When every circuit is open".)

    .venv/bin/python benchmarks/gateway_memory.py                       # N = 100, 500, 1000
    .venv/bin/python benchmarks/gateway_memory.py --streams 200 --http 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _machine  # benchmarks/_machine.py, beside this script
import httpx

from llmroute.testing import Profile, SimulatorProcess

KEY = "gw-memory-bench"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "Hello"}], "stream": True}
HOLD_SECONDS = 600  # the simulator's pause after the first token; the route's first-token bound
WARM_SECONDS = 120  # the 50 warm-up requests, together
EXIT_SECONDS = 30  # the gateway's exit after SIGTERM (it drains for 10 s)
METRICS_SECONDS = 30  # the gateway's /metrics, read while the N streams are open
SPARE_SECONDS = 120  # a run's whole bound: the warm-up, --open-timeout, then this


class Bound(Exception):
    """A bound of the run was hit: its message says which and what was seen."""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def start_gateway(sim: SimulatorProcess, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = folder / "llmroute.toml"
    config.write_text(
        f'[providers.sim]\nbase_url = "{sim.base_url}"\napi_key = "sk-sim"\n\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n'
        # Streams that wait mid-answer are what is measured, not stalls to be cut.
        f'stall_timeout = "off"\nfirst_token_timeout = {HOLD_SECONDS}\n\n'
        '[cache]\nbackend = "off"\n\n'
        "[gateway]\nmax_concurrency_per_key = 100000\n"
    )
    env = {**os.environ, "LLMROUTE_GATEWAY_KEY": KEY, "SSL_CERT_FILE": sim.ca_pem_path or ""}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    command = [sys.executable, "-m", "llmroute", "serve", "--config", str(config)]
    command += ["--host", "127.0.0.1", "--port", "0", "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline().decode() if readable else ""
    if "listening on " not in line:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        raise Bound(f"the gateway did not start within 60 s: {line!r}")
    return proc, line.split("listening on ", 1)[1].split()[0]


async def hold_streams(
    base_url: str, n: int, http: str, pid: int, open_timeout: float, opening: int
) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    h2 = http == "2"
    # httpx queues a connection's streams past 100 (httpcore's own SETTINGS_MAX_CONCURRENT_STREAMS,
    # whatever the server allows) rather than open another connection: over h2c, one client
    # per 90 streams, so the first also has room for the /metrics read.
    clients = [
        httpx.AsyncClient(
            base_url=base_url, http1=not h2, http2=h2, limits=limits, timeout=120, headers=headers
        )
        for _ in range(-(-n // 90) if h2 else 1)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for each in clients:
            await stack.enter_async_context(each)
        client = clients[0]
        whole = {**BODY, "stream": False, "max_tokens": 1}
        try:
            async with asyncio.timeout(WARM_SECONDS):
                for _ in range(50):  # warm: connections, stats, the code paths
                    (await client.post("/chat/completions", json=whole)).raise_for_status()
        except TimeoutError:
            raise Bound(f"the 50 warm-up requests took over {WARM_SECONDS} s") from None
        await asyncio.sleep(2)
        before = rss(pid)
        opened = 0
        all_open = asyncio.Event()

        starting = asyncio.Semaphore(opening)

        async def one(client: httpx.AsyncClient) -> None:
            nonlocal opened
            async with contextlib.AsyncExitStack() as stream:
                async with starting:
                    answer = await stream.enter_async_context(
                        client.stream("POST", "/chat/completions", json=BODY)
                    )
                    if answer.status_code != 200:
                        text = (await answer.aread())[:300].decode(errors="replace")
                        raise Bound(f"a stream was answered {answer.status_code}: {text}")
                    # Held until the stream ends: an iterator left behind is closed by
                    # asyncio's finaliser, and with it the response (HTTP/1.1: the connection).
                    lines = answer.aiter_lines()
                    async for line in lines:
                        if '"content"' in line:
                            break
                    else:
                        raise Bound("a stream ended before its first token")
                opened += 1
                if opened == n:
                    all_open.set()
                await asyncio.sleep(HOLD_SECONDS)  # open until cancelled once measured

        tasks = [asyncio.create_task(one(clients[i % len(clients)])) for i in range(n)]
        try:
            await _until_open(all_open, tasks, open_timeout, lambda: opened)
            await asyncio.sleep(2)
            held = rss(pid)
            try:
                async with asyncio.timeout(METRICS_SECONDS):
                    in_flight = await _in_flight(client)
            except TimeoutError:
                raise Bound(f"no /metrics from the gateway in {METRICS_SECONDS} s") from None
            if in_flight != n:
                raise Bound(
                    f"the gateway had {in_flight:g} of the {n} streams in flight when its RSS "
                    "was read (the others ended early)"
                )
        finally:  # each stream closes its response, whether it got its first token or not
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    # The clients are closed: over h2c a response closed early tells the gateway nothing (httpx
    # sends no RST_STREAM), the connection's end does.
    await asyncio.sleep(2)
    after = rss(pid)
    return {
        "streams": n,
        "rss_before_mb": before / 2**20,
        "rss_open_mb": held / 2**20,
        "kb_per_stream": (held - before) / n / 1024,
        "rss_after_close_mb": after / 2**20,
    }


async def _until_open(
    all_open: asyncio.Event,
    tasks: list[asyncio.Task[None]],
    seconds: float,
    opened: Callable[[], int],
) -> None:
    """Until every stream has its first token; a stream that ends first (it failed: the
    others wait for the release) or ``seconds`` passing ends the run."""
    waiter = asyncio.create_task(all_open.wait())
    try:
        done, _ = await asyncio.wait(
            [waiter, *tasks], timeout=seconds, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
    if waiter in done:
        return
    for task in done:
        error = task.exception()
        if error is not None:
            raise Bound(f"{opened()} of {len(tasks)} streams had opened when one failed: {error}")
    raise Bound(
        f"{opened()} of {len(tasks)} streams had their first token after {seconds:g} s "
        "(--open-timeout)"
    )


async def _in_flight(client: httpx.AsyncClient) -> float:
    """The gateway's own count of requests in flight (every key), from its /metrics."""
    page = await client.get(client.base_url.copy_with(path="/metrics"))
    page.raise_for_status()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.text.splitlines()
        if line.startswith("llmroute_gateway_in_flight{")
    )


def measure(
    sim: SimulatorProcess, n: int, http: str, open_timeout: float, opening: int = 50
) -> dict[str, float]:
    """One N on a fresh gateway, stopped after it (killed if it does not exit in time)."""
    with tempfile.TemporaryDirectory() as folder:
        gateway, base_url = start_gateway(sim, Path(folder))
        try:
            run = hold_streams(base_url, n, http, gateway.pid, open_timeout, opening)
            bound = WARM_SECONDS + open_timeout + SPARE_SECONDS
            try:
                row = asyncio.run(asyncio.wait_for(run, bound))
            except TimeoutError:
                raise Bound(f"the run took over {bound:g} s (warm-up, opening, the rest)") from None
        except BaseException:
            stop(gateway)
            raise
        if not stop(gateway):
            raise Bound(f"the gateway had not exited {EXIT_SECONDS} s after SIGTERM: killed")
        return row


def stop(gateway: subprocess.Popen[bytes]) -> bool:
    """SIGTERM, then SIGKILL after ``EXIT_SECONDS``; whether it exited of itself."""
    gateway.terminate()
    try:
        gateway.wait(EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        gateway.kill()
        gateway.wait(10)
        return False
    finally:
        if gateway.stdout is not None:
            gateway.stdout.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--http", choices=["1.1", "2"], default="1.1")
    parser.add_argument(
        "--open-timeout",
        type=float,
        default=300.0,
        help="seconds for all N streams to get their first token (default 300)",
    )
    parser.add_argument(
        "--opening",
        type=int,
        default=50,
        help="streams waiting for their first token at once (default 50)",
    )
    args = parser.parse_args()
    started = time.time()
    profile = Profile(reply_tokens=3, inter_token=float(HOLD_SECONDS), max_streams=5000)
    rows = []
    with SimulatorProcess(profile) as sim:
        for n in args.streams:
            try:
                rows.append(measure(sim, n, args.http, args.open_timeout, args.opening))
            except Bound as exc:
                sys.exit(f"gateway_memory.py: N = {n}, HTTP/{args.http}: {exc}")
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\nclient side HTTP/{args.http}; {time.time() - started:.0f} s; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(json.dumps(_machine.machine(["hypercorn", "h2", "httpx", "openai", "anyio"])))
    print("\n| streams open | RSS before | RSS with them open | KB per open stream | RSS after |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['streams']} | {r['rss_before_mb']:.1f} MB | {r['rss_open_mb']:.1f} MB | "
            f"{r['kb_per_stream']:.1f} | {r['rss_after_close_mb']:.1f} MB |"
        )


if __name__ == "__main__":
    main()
