"""The CPU cost of recording one request in client.metrics, beside decoding its chunks.

Both are timed in the same process, interleaved: ``begin()`` + ``observe()`` of a routed,
streamed request (one won attempt, its usage priced at its target's price: the cost counters),
and the decoding of that request's 22 SSE events (a
20-token answer) by ``ChatStreamDecoder``, the per-request work metrics sit beside.

    .venv/bin/python benchmarks/metrics.py
"""

from __future__ import annotations

import json
import statistics
import timeit
from collections.abc import Callable

import httpx

from llmroute._prices import ModelPrice
from llmroute._types import AttemptReport, RouteReport, Timings
from llmroute.metrics import ClientMetrics
from llmroute.metrics._request import RequestRecord
from llmroute.protocols.openai import ChatStreamDecoder, build_chunk
from llmroute.routing.costs import pricer_for
from llmroute.routing.policies import FastestPolicy
from llmroute.routing.route import Route, RouteTarget

ROUNDS, NUMBER = 7, 2000


def decoding() -> Callable[[], None]:
    """The yardstick: a call that decodes a 20-token answer's 22 SSE events."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [
        json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
        for i in range(20)
    ]
    body = "".join(f"data: {e}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
    request = httpx.Request("POST", "https://x/v1/chat/completions")

    def decode() -> None:
        ChatStreamDecoder(request=request, target="a:m").feed(body)

    return decode


def main() -> None:
    metrics = ClientMetrics()
    price = ModelPrice(input=1.25, cached_input=0.125, output=10)
    route = Route("chat", (RouteTarget("a", "m", price=price),), FastestPolicy())
    report = RouteReport(route="chat", policy="hedge", winner="a:m", ttft=0.1)
    report.pricer, report.prompt_tokens = pricer_for(route), 12
    usage = {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32}
    usage["prompt_tokens_details"] = {"cached_tokens": 0}  # type: ignore[assignment]
    won = AttemptReport("a:m", 0.0, "first", "won", ttft=0.1)
    won.usage = build_chunk({"id": "c", "choices": [], "usage": usage}).usage  # openai's object
    report.attempts = [won]
    timings = Timings(started_at=0.0, first_token=0.1, total=0.5, tokens=20)

    def record() -> None:
        metrics.begin("chat", {"max_tokens": 5}, stream=True)
        metrics.observe(RequestRecord("chat", "ok", True, report, timings))

    decode = decoding()

    costs: dict[str, list[float]] = {"metrics": [], "decode": []}
    for _ in range(ROUNDS):
        for name, fn in (("metrics", record), ("decode", decode)):
            costs[name].append(timeit.timeit(fn, number=NUMBER) / NUMBER * 1e6)
    m, d = statistics.median(costs["metrics"]), statistics.median(costs["decode"])
    print(f"metrics per request {m:.1f} us; decoding a 20-token answer {d:.1f} us; {m / d:.2f}x")


if __name__ == "__main__":
    main()
