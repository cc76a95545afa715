"""The floor under one streamed chunk: h2's work per DATA frame against llmroute's decoding.

An h2 client and server in memory (no sockets, no TLS): the server sends one chat chunk event per
DATA frame until its window runs low; the client's ``H2Connection.receive_data`` is timed on those
frames alone, then with ``acknowledge_received_data`` per frame, and ``ChatStreamDecoder.feed`` on
the same event. Best of ``--passes`` passes, microseconds per frame.

    .venv/bin/python benchmarks/h2_floor.py
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import h2.config
import h2.connection
import httpx

from llmroute.protocols.openai import ChatStreamDecoder

CHUNK = {
    "id": "chatcmpl-5dee36027c4a50e918202031",
    "object": "chat.completion.chunk",
    "created": 1796171160,
    "model": "sim-small",
    "system_fingerprint": "fp_llmroute_sim",
    "choices": [{"index": 0, "delta": {"content": " be"}, "logprobs": None, "finish_reason": None}],
}
EVENT = b"data: " + json.dumps(CHUNK, separators=(",", ":")).encode() + b"\n\n"


def pair() -> tuple[h2.connection.H2Connection, list[bytes]]:
    """A client with an open stream, and the DATA frames its server sent on it."""
    config = h2.config.H2Configuration
    client = h2.connection.H2Connection(config(client_side=True, header_encoding=None))
    server = h2.connection.H2Connection(config(client_side=False, header_encoding=None))
    client.initiate_connection()
    client.increment_flow_control_window(16 * 1024 * 1024)
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    request = [
        (b":method", b"POST"),
        (b":scheme", b"https"),
        (b":authority", b"x"),
        (b":path", b"/"),
    ]
    client.send_headers(1, request, end_stream=True)
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(b":status", b"200")])
    client.receive_data(server.data_to_send())
    frames: list[bytes] = []
    while server.local_flow_control_window(1) >= 10_000:
        server.send_data(1, EVENT)
        frames.append(server.data_to_send())
    return client, frames


def main(passes: int) -> None:
    client, frames = pair()
    request = httpx.Request("POST", "https://x/v1/chat/completions")
    best = {"h2 receive_data": 1e9, "h2 receive_data + ack": 1e9, "ChatStreamDecoder.feed": 1e9}
    for _ in range(passes):
        conn = copy.deepcopy(client)
        started = time.perf_counter()
        for frame in frames:
            conn.receive_data(frame)
        best["h2 receive_data"] = min(best["h2 receive_data"], time.perf_counter() - started)
        conn = copy.deepcopy(client)
        started = time.perf_counter()
        for frame in frames:
            for event in conn.receive_data(frame):
                conn.acknowledge_received_data(event.flow_controlled_length, 1)  # type: ignore[attr-defined]
        elapsed = time.perf_counter() - started
        best["h2 receive_data + ack"] = min(best["h2 receive_data + ack"], elapsed)
        decoder = ChatStreamDecoder(request=request, target="x")
        started = time.perf_counter()
        for _ in frames:
            decoder.feed(EVENT)
        elapsed = time.perf_counter() - started
        best["ChatStreamDecoder.feed"] = min(best["ChatStreamDecoder.feed"], elapsed)
    print(f"{len(frames)} frames of {len(EVENT)} bytes, best of {passes} passes:")
    for name, seconds in best.items():
        print(f"  {name:<24} {seconds / len(frames) * 1e6:6.2f} µs per frame")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=40)
    main(parser.parse_args().passes)
