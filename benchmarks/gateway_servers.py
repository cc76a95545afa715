"""The gateway on each HTTP server (hypercorn, granian) against issue 19's harms, side by side:

- ``early``: early answers (401 wrong key with a 30 KB body, 413, 400, 429 over a key's limit)
  beside good streams on one HTTP/2 connection (httpx), 3 rounds: how many good streams
  completed exactly (tests/reliability/test_gateway_early_answers.py's round);
- ``stalled``: a raw ``h2`` client that reads 64 KB of a ~10 MB answer and then stops reading
  (zero window) for 6 s: did the upstream stream run to its end meanwhile (the server buffered
  the whole answer) or was it held back? Then it resets the stream: was the upstream cancelled?

Each gateway runs in its own process (HTTPS, HTTP/2) in front of in-process simulators.

    .venv/bin/python benchmarks/gateway_servers.py                 # both servers
    .venv/bin/python benchmarks/gateway_servers.py --servers granian
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import h2.config
import h2.connection
import h2.events
import httpx
from _machine import machine
from gateway import GATEWAY_KEY, SimulatorProcess, gateway_process

from llmroute.testing import Profile

_STALL = 6.0


def _early_round(url: str, ctx: Any) -> tuple[int, int, list[str]]:
    """Good streams and early answers at once on one HTTP/2 connection: (good streams that
    completed with [DONE], good streams sent, the bad requests' statuses)."""
    good: list[str] = []
    bad: list[str] = []

    async def run() -> None:
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(http2=True, verify=ctx, timeout=30, limits=limits) as client:

            async def post(kind: str, key: str, body: dict[str, Any]) -> None:
                headers = {"authorization": f"Bearer {key}"}
                try:
                    reply = await client.post(
                        url + "/chat/completions",
                        content=json.dumps(body).encode(),
                        headers=headers,
                    )
                    out = (
                        "ok" if reply.text.endswith("data: [DONE]\n\n") else str(reply.status_code)
                    )
                except httpx.HTTPError as exc:  # a dropped connection: the harm itself
                    out = type(exc).__name__
                (good if kind == "good" else bad).append(out)

            def chat(content: str, **extra: Any) -> dict[str, Any]:
                return {
                    "model": "chat",
                    "messages": [{"role": "user", "content": content}],
                    **extra,
                }

            await asyncio.gather(
                *(post("good", GATEWAY_KEY, chat(f"good {i}", stream=True)) for i in range(8)),
                *(post("bad", "wrong-key", chat("x" * 30_000)) for _ in range(3)),
                *(post("bad", GATEWAY_KEY, chat("y" * 40_000)) for _ in range(3)),
                *(post("bad", GATEWAY_KEY, chat("z", stream="false")) for _ in range(3)),
            )

    asyncio.run(run())
    return good.count("ok"), len(good), sorted(bad)


def _stalled(port: int, ctx: Any, sim: SimulatorProcess) -> dict[str, Any]:
    """Read 64 KB of a long answer, stop reading for 6 s, then reset the stream."""
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    body = json.dumps(
        {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "long"}]}
    ).encode()
    conn.send_headers(
        1,
        [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":scheme", "https"),
            (":authority", "127.0.0.1"),
            ("authorization", f"Bearer {GATEWAY_KEY}"),
            ("content-type", "application/json"),
        ],
    )
    conn.send_data(1, body, end_stream=True)
    sock.sendall(conn.data_to_send())
    before = sim.stats()
    received = 0
    deadline = time.monotonic() + 20
    sock.settimeout(0.2)
    while received < 65_535 and time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                received += len(event.data)
        out = conn.data_to_send()
        if out:
            sock.sendall(out)  # SETTINGS/PING acks only: no WINDOW_UPDATE is sent
    time.sleep(_STALL)
    during = sim.stats()
    conn.reset_stream(1)
    sock.sendall(conn.data_to_send())
    cancelled = False
    for _ in range(50):
        time.sleep(0.1)
        if sim.stats()["streams_cancelled"] > before["streams_cancelled"]:
            cancelled = True
            break
    sock.close()
    return {
        "received": received,
        "upstream_completed_while_stalled": during["streams_completed"]
        > before["streams_completed"],
        "upstream_cancelled_after_reset": cancelled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="hypercorn,granian")
    args = parser.parse_args()
    print(machine(["h2", "hypercorn", "granian"]))
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    # Early answers: 30 tokens 10 ms apart, so the good streams are in flight as the bad arrive.
    with SimulatorProcess(Profile(reply_tokens=30, inter_token=0.01), tls=True) as sim:
        for server in servers:
            with (
                tempfile.TemporaryDirectory() as folder,
                gateway_process(sim, folder, server=server, gateway="max_body_bytes = 16384\n") as (
                    url,
                    ctx,
                    _pid,
                ),
            ):
                for round_ in range(3):
                    done, sent, bad = _early_round(url, ctx)
                    print(
                        f"{server:10} early answers, round {round_ + 1}: good streams "
                        f"{done}/{sent} complete; the others: {bad}"
                    )
    # A stalled reader: answers of about 10 MB, as fast as the gateway takes them (its upstream
    # window per stream is 4 MB: an upstream that completes was read by a gateway that buffers).
    with SimulatorProcess(Profile(reply_tokens=40_000), tls=True) as sim:
        for server in servers:
            with (
                tempfile.TemporaryDirectory() as folder,
                gateway_process(sim, folder, server=server) as (url, ctx, _pid),
            ):
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                print(f"{server:10} stalled reader: {_stalled(port, ctx, sim)}")


if __name__ == "__main__":
    main()
