"""What the gateway's reliability tests share: a TLS gateway (HTTP/2 by ALPN) in front of the
simulators, its keys, and a raw ``h2`` client for what httpx will not send."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import h2.config
import h2.connection
import h2.events
import trustme

from llmroute.server import Gateway
from llmroute.testing import Simulator

UPSTREAM_KEY = "sk-upstream-reliability-0123456789-NEVER-SHOWN"
KEYS = {
    "alpha": "gw-alpha-key-0123456789abcdef",
    "beta": "gw-beta-key-fedcba9876543210",
    "gamma": "gw-gamma-key-00112233445566",
}
ENVIRON = {f"GW_{name.upper()}": key for name, key in KEYS.items()}
MESSAGES = [{"role": "user", "content": "Tell me about gateways."}]
DEADLINE = 10.0  # seconds any bounded wait may take

_CA = trustme.CA()
_LEAF = _CA.issue_cert("127.0.0.1", "localhost")


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    _CA.configure_trust(ctx)
    return ctx


def config(upstreams: dict[str, Simulator], **gateway: Any) -> dict[str, Any]:
    """Routes ``<name>`` -> ``<name>:sim-small`` on each simulator; no cache unless given."""
    extra = {k: gateway.pop(k) for k in ("cache", "routing") if k in gateway}
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": UPSTREAM_KEY}
            for name, sim in upstreams.items()
        },
        "models": {name: {"targets": [f"{name}:sim-small"]} for name in upstreams},
        "routing": extra.get("routing", {"explore": 0}),
        **({"cache": extra["cache"]} if "cache" in extra else {}),
        "gateway": {"keys": {name: f"GW_{name.upper()}" for name in KEYS}, **gateway},
    }


@contextmanager
def tls_gateway(
    cfg: dict[str, Any], tmp: Any, *, verify: ssl.SSLContext, **options: Any
) -> Iterator[Gateway]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    _LEAF.private_key_and_cert_chain_pem.write_to_path(str(cert))
    _LEAF.private_key_pem.write_to_path(str(key))
    with Gateway(
        cfg,
        certfile=str(cert),
        keyfile=str(key),
        environ=ENVIRON,
        verify=verify,
        max_retries=0,
        **options,
    ) as gateway:
        yield gateway


class RawH2:
    """A blocking ``h2`` client on one TLS connection to the gateway."""

    def __init__(self, port: int, *, timeout: float = DEADLINE) -> None:
        ctx = client_context()
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def headers(self, stream_id: int, key: str, *, end: bool = False) -> None:
        self.conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":scheme", "https"),
                (":authority", "127.0.0.1"),
                ("authorization", f"Bearer {key}"),
                ("content-type", "application/json"),
            ],
            end_stream=end,
        )

    def request(self, stream_id: int, key: str, body: dict[str, Any]) -> None:
        self.headers(stream_id, key)
        self.conn.send_data(stream_id, json.dumps(body).encode(), end_stream=True)
        self.flush()

    def events(self) -> list[h2.events.Event]:
        """The events of one read; ``ConnectionError`` when the gateway closed."""
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the gateway closed the connection")
        events = self.conn.receive_data(data)
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        self.flush()
        return events

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
