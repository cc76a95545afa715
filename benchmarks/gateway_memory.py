r"""Memory of the gateway per open stream, for sizing its pods (docs/deploy.md, "Sizing").

Runs ``llmroute serve`` (the image's command, on 127.0.0.1) in front of a simulator process
(TLS + HTTP/2 upstream, as a vendor), warms it with 50 whole requests, reads its RSS, then
opens N streamed requests that each get their first token and then wait (the simulator pauses
10 minutes before the next token: every stream is open mid-answer at once), and reads its RSS
again. Reported per N: (RSS with N open - RSS before) / N, from /proc/<pid>/status (VmRSS), after
every stream has its first chunk and a 2 s settle; then the RSS once they are closed. Each N
runs on a fresh gateway. ``--http 2`` opens the client side as h2c streams (at most
``h2_max_concurrent_streams``, 256, per connection), ``--http 1.1`` one connection per stream
(openai's default client).

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
from pathlib import Path

import _machine  # benchmarks/_machine.py, beside this script
import httpx

from llmroute.testing import Profile, SimulatorProcess

KEY = "gw-memory-bench"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "Hello"}], "stream": True}


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def start_gateway(sim: SimulatorProcess, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = folder / "llmroute.toml"
    config.write_text(
        f'[providers.sim]\nbase_url = "{sim.base_url}"\napi_key = "sk-sim"\n\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n\n'
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
        raise RuntimeError(f"the gateway did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].split()[0]


async def hold_streams(base_url: str, n: int, http: str, pid: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    h2 = http == "2"
    # httpx queues streams past a connection's SETTINGS_MAX_CONCURRENT_STREAMS (256 here)
    # rather than open another connection: over h2c, one client per 200 streams.
    clients = [
        httpx.AsyncClient(
            base_url=base_url, http1=not h2, http2=h2, limits=limits, timeout=120, headers=headers
        )
        for _ in range(-(-n // 200) if h2 else 1)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for each in clients:
            await stack.enter_async_context(each)
        client = clients[0]
        whole = {**BODY, "stream": False, "max_tokens": 1}
        for _ in range(50):  # warm: connections, stats, the code paths
            (await client.post("/chat/completions", json=whole)).raise_for_status()
        await asyncio.sleep(2)
        before = rss(pid)
        first = asyncio.Event()
        opened = 0
        release = asyncio.Event()

        async def one(client: httpx.AsyncClient) -> None:
            nonlocal opened
            async with client.stream("POST", "/chat/completions", json=BODY) as answer:
                answer.raise_for_status()
                async for line in answer.aiter_lines():
                    if '"content"' in line:
                        break
                opened += 1
                if opened == n:
                    first.set()
                await release.wait()

        tasks = [asyncio.create_task(one(clients[i % len(clients)])) for i in range(n)]
        await asyncio.wait_for(first.wait(), 600)
        await asyncio.sleep(2)
        held = rss(pid)
        release.set()
        await asyncio.gather(*tasks)
        await asyncio.sleep(2)
        after = rss(pid)
    return {
        "streams": n,
        "rss_before_mb": before / 2**20,
        "rss_open_mb": held / 2**20,
        "kb_per_stream": (held - before) / n / 1024,
        "rss_after_close_mb": after / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--http", choices=["1.1", "2"], default="1.1")
    args = parser.parse_args()
    started = time.time()
    profile = Profile(reply_tokens=3, inter_token=600.0, max_streams=5000)
    rows = []
    with SimulatorProcess(profile) as sim:
        for n in args.streams:
            with tempfile.TemporaryDirectory() as folder:
                gateway, base_url = start_gateway(sim, Path(folder))
                try:
                    rows.append(asyncio.run(hold_streams(base_url, n, args.http, gateway.pid)))
                finally:
                    gateway.terminate()
                    gateway.wait(30)
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
