"""What a routed request cost (``route.cost``), every attempt included, over the simulator:
a cancelled hedge, a broken answer and its continuation, cached and reasoning tokens as each
vendor family reports them, a model without a price."""

from __future__ import annotations

import threading
import uuid
import zlib
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmroute import AsyncOpenAI, AttemptReport, RouteReport
from llmroute._catalog import load_catalog
from llmroute.pricing import TokenUsage, attempt_cost, find_price, read_usage
from llmroute.protocols import adapter_for
from llmroute.protocols.openai import build_chunk, responses_usage
from llmroute.routing.costs import CANCELLED, CUT, CUT_BLIND, NO_USAGE, RoutePricer
from llmroute.routing.policies import FastestPolicy
from llmroute.routing.route import Route, RouteTarget
from llmroute.routing.stats import estimate_prompt_tokens
from llmroute.testing import Profile, Simulator

from ..conftest import KEY
from ..metrics.test_tracing import only
from ..metrics.test_tracing import spans as spans  # the fixture
from ..settle import settled

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me what this request cost, to the cent."}]
PRICE = {"input": 2, "cached_input": 0.5, "output": 8}  # per million tokens
MILLION = Decimal(1_000_000)


@pytest.fixture(scope="module")
def cached_sim() -> Iterator[Simulator]:
    """30-word replies after 4 words of reasoning; OpenAI's automatic prompt cache."""
    profile = Profile(reply_tokens=30, reasoning_tokens=4, prompt_cache="openai")
    with Simulator(profile=profile, tls=True) as server:
        yield server


def provider(sim: Simulator, **more: Any) -> dict[str, Any]:
    return {"base_url": sim.base_url, "api_key": KEY, "continuation": {}, **more}


def config(providers: dict[str, dict[str, Any]], targets: list[str], **route: Any) -> Any:
    return {
        "providers": providers,
        "models": {"chat": {"targets": targets, **route}},
        "routing": {"explore": 0},
    }


def usd(tokens: int, per_million: float) -> Decimal:
    return tokens * Decimal(repr(per_million)) / MILLION


async def test_a_cancelled_hedge_a_broken_answer_and_its_continuation_are_all_priced(
    cached_sim: Simulator, sim_stall: Simulator
) -> None:
    cfg = config(
        {
            "slow": {"base_url": sim_stall.base_url, "api_key": KEY, "prices": {"*": PRICE}},
            "a": provider(cached_sim, prices={"*": PRICE}),
            "b": provider(cached_sim, prices={"*": PRICE}),
        },
        ["slow:sim-small", "a:sim-small", "b:sim-small"],
        policy="hedge",
        hedge_after="100ms",
    )
    await settled(sim_stall)
    key = uuid.uuid4().hex  # the first stream of cached_sim breaks after 3 deltas, once
    fault = {"x-sim-fault": "drop:8", "x-sim-fault-times": "1", "x-sim-fault-key": key}
    async with AsyncOpenAI(config=cfg, verify=cached_sim.ssl_context()) as client:
        with anyio.fail_after(20):
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, extra_headers=fault
            )
            chunks = [chunk async for chunk in stream]
        summed = client.metrics.costs()
        exposition = client.metrics.exposition().decode()
    route = stream.route
    assert route is not None and route.hedges == 1
    slow, hedge, continuation = route.attempts
    assert (slow.target, slow.outcome) == ("slow:sim-small", "cancelled")
    assert (hedge.reason, hedge.outcome) == ("hedge", "interrupted")
    assert (continuation.reason, continuation.outcome) == ("continuation", "won")
    assert continuation.target == "b:sim-small"  # slow cannot continue (no continuation)
    cost = route.cost
    assert cost is not None and cost.currency == "USD"
    prompt = estimate_prompt_tokens(MESSAGES)
    # The hedged-against attempt: cancelled before its first token, its prompt assumed billed.
    assert slow.cost is not None and slow.cost.amount == usd(prompt, 2)
    assert CANCELLED in slow.cost.estimated
    # The broken attempt: no usage came before the break; llmroute's count of what it sent.
    assert hedge.cost is not None and NO_USAGE in hedge.cost.estimated
    delivered = hedge.tokens_estimate or hedge.tokens or 0
    assert delivered > 0 and hedge.cost.amount == usd(prompt, 2) + usd(delivered, 8)
    # The continuation: the vendor's own usage, its repeated prompt (the answer so far
    # included; the part the vendor cached at the cached price), exact.
    usage = continuation.usage
    assert usage is not None and chunks
    assert continuation.cost is not None and not continuation.cost.estimated
    cached = usage.prompt_tokens_details.cached_tokens  # the user's message, read again
    assert cached > 0
    assert continuation.cost.amount == (
        usd(usage.prompt_tokens - cached, 2) + usd(cached, 0.5) + usd(usage.completion_tokens, 8)
    )
    assert usage.prompt_tokens > prompt  # the continuation's prompt repeats the answer so far
    assert dict(cost.kinds) == {
        "hedge": slow.cost.amount,
        "answer": hedge.cost.amount,
        "continuation": continuation.cost.amount,
    }
    assert cost.amount == slow.cost.amount + hedge.cost.amount + continuation.cost.amount
    # Summed on the client's metrics, exact, and as Prometheus counters by target and kind.
    assert summed == {
        ("slow:sim-small", "hedge", "USD"): slow.cost.amount,
        ("a:sim-small", "answer", "USD"): hedge.cost.amount,
        ("b:sim-small", "continuation", "USD"): continuation.cost.amount,
    }
    line = 'llmroute_cost_total{kind="continuation",target="b:sim-small"} '
    assert f"{line}{float(continuation.cost.amount)!r}" in exposition
    assert cost.estimated  # the cancelled and broken attempts are llmroute's estimates
    assert str(cost).startswith(f"cost {cost.amount.normalize():f} USD (")


async def test_a_cached_prompt_costs_the_cached_price_and_says_so(cached_sim: Simulator) -> None:
    cfg = config({"a": provider(cached_sim, prices={"*": PRICE})}, ["a:sim-small"])
    conversation = [
        {"role": "system", "content": f"You are a careful accountant {uuid.uuid4().hex}."},
        {"role": "user", "content": "What does a cache hit cost?"},
    ]
    async with AsyncOpenAI(config=cfg, verify=cached_sim.ssl_context()) as client:
        first = await client.chat.completions.create(model="chat", messages=conversation)
        again = [*conversation[:1], {"role": "user", "content": "And a miss?"}]
        second = await client.chat.completions.create(model="chat", messages=again)
    assert first.route is not None and second.route is not None
    one, two = first.route.cost, second.route.cost
    assert one is not None and two is not None
    assert one.amount is not None and two.amount is not None
    cost = second.route.attempts[0].cost
    assert cost is not None
    lines = {line.token_class: line.tokens for line in cost.lines}
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and lines["cache_read"] == cached
    assert lines["input"] == second.usage.prompt_tokens - cached
    assert lines["reasoning"] == 4 and lines["output"] == second.usage.completion_tokens - 4
    assert not cost.estimated and cost.amount == two.amount


async def test_a_model_without_a_price_costs_unknown_never_zero(sim: Simulator) -> None:
    cfg = config({"a": provider(sim)}, ["a:sim-small"])
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert completion.route is not None
    cost = completion.route.cost
    assert cost is not None and cost.amount is None and cost.currency is None
    assert cost.unknown == ("a:sim-small: no price known for sim-small",)
    assert str(cost) == "cost unknown (a:sim-small: no price known for sim-small)"


async def test_anthropic_cache_writes_are_priced_by_lifetime(sim: Simulator) -> None:
    price = {**PRICE, "cache_write": 2.5, "cache_write_1h": 4}
    cfg = config({"a": provider(sim, kind="anthropic", prices={"*": price})}, ["a:sim-small"])
    system = [
        {
            "type": "text",
            "text": f"Rules of the house {uuid.uuid4().hex}, kept an hour.",
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        }
    ]
    messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        costs = []
        for _ in range(2):
            stream = await client.chat.completions.create(
                model="chat",
                messages=messages,
                stream=True,
                extra_body={"system": system},
            )
            [chunk async for chunk in stream]
            assert stream.route is not None
            assert stream.route.cost is not None  # prices the attempts
            cost = stream.route.attempts[0].cost
            assert cost is not None and cost.amount is not None
            costs.append({line.token_class: line.tokens for line in cost.lines})
    written, read = costs
    assert written.get("cache_write_1h", 0) > 0 and "cache_write" not in written
    assert read.get("cache_read") == written["cache_write_1h"] and "cache_write_1h" not in read


async def test_the_cost_is_on_the_request_span(
    cached_sim: Simulator, spans: InMemorySpanExporter
) -> None:
    cfg = config({"a": provider(cached_sim, prices={"*": PRICE})}, ["a:sim-small"])
    async with AsyncOpenAI(config=cfg, verify=cached_sim.ssl_context()) as client:
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        summed = client.metrics.costs()
    assert completion.route is not None and completion.route.cost is not None
    amount = completion.route.cost.amount
    assert amount is not None and amount > 0
    assert summed == {("a:sim-small", "answer", "USD"): amount}
    attributes = dict(only(spans).attributes or {})
    assert attributes["llmroute.cost"] == str(amount)
    assert attributes["llmroute.cost.currency"] == "USD"
    assert "llmroute.cost.estimated" not in attributes  # the vendor's usage, priced


USAGES = [  # (vendor, model, usage as the vendor sends it)
    (
        "openai",
        "gpt-6.1-sol",
        {
            "prompt_tokens": 1486,
            "completion_tokens": 651,
            "prompt_tokens_details": {"cached_tokens": 1408},
            "completion_tokens_details": {"reasoning_tokens": 512},
        },
    ),
    (
        "anthropic",
        "claude-opus-5",
        {
            "input_tokens": 40,
            "cache_creation_input_tokens": 3000,
            "cache_read_input_tokens": 12000,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 1000,
                "ephemeral_1h_input_tokens": 2000,
            },
            "output_tokens": 700,
        },
    ),
    (
        "deepseek",
        "deepseek-v4-pro",
        {
            "prompt_tokens": 5000,
            "prompt_cache_hit_tokens": 4800,
            "prompt_cache_miss_tokens": 200,
            "completion_tokens": 900,
            "completion_tokens_details": {"reasoning_tokens": 600},
        },
    ),
]


@pytest.mark.parametrize(("vendor", "model", "usage"), USAGES, ids=[u[0] for u in USAGES])
def test_the_metrics_fast_pricing_is_the_full_pricing(
    vendor: str, model: str, usage: dict[str, Any]
) -> None:
    spec = load_catalog()[vendor]
    target = RouteTarget(
        vendor, model, price=find_price(spec.prices, model), usage_fields=spec.usage_fields
    )
    full = attempt_cost(spec, model, usage)
    assert full.amount is not None and full.amount > 0
    fast = RoutePricer(Route("chat", (target,), FastestPolicy()))
    record = AttemptReport(target.name, 0.0, "first", "won", usage=usage)
    report = RouteReport("chat", "fastest", attempts=[record])
    ((same, units, exponent, currency),) = fast.amounts(report)
    assert same is record and currency == "USD" and type(units) is int
    assert Decimal(units).scaleb(exponent) == full.amount  # exact, in whole units
    assert record.cost is None  # the fast path builds no Cost
    as_object = build_chunk({"id": "x", "choices": [], "usage": usage}).usage
    if vendor != "anthropic":  # openai's object, unknown fields (DeepSeek's) included
        record.usage = as_object
        assert fast.amounts(report) == [(record, units, exponent, "USD")]


async def test_a_cache_hit_costs_zero_and_says_what_it_saved(cached_sim: Simulator) -> None:
    cfg = config({"a": provider(cached_sim, prices={"*": PRICE})}, ["a:sim-small"])
    cfg["cache"] = {"backend": "memory", "min_hits": 1}
    messages = [{"role": "user", "content": f"Cache me {uuid.uuid4().hex}"}]
    async with AsyncOpenAI(config=cfg, verify=cached_sim.ssl_context()) as client:
        reports = []
        for _ in range(3):
            stream = await client.chat.completions.create(
                model="chat",
                messages=messages,
                stream=True,
                temperature=0,
                stream_options={"include_usage": True},  # kept with the answer in the cache
            )
            [chunk async for chunk in stream]
            reports.append(stream.route)
        summed = client.metrics.costs()
    live, hit = reports[0], reports[-1]
    assert live is not None and hit is not None and hit.cache_hit and not live.cache_hit
    paid, replayed = live.cost, hit.cost
    assert paid is not None and replayed is not None and paid.amount
    assert replayed.amount == 0 and replayed.saved == paid.amount
    assert str(replayed) == f"cost 0, saved {paid.amount.normalize():f}"
    live_ones = [r for r in reports if r is not None and not r.cache_hit]
    assert summed == {("a:sim-small", "answer", "USD"): paid.amount * len(live_ones)}


def test_a_long_prompts_tier_and_an_unpriced_class_go_to_the_full_pricing() -> None:
    spec = load_catalog()["anthropic"]
    model = "claude-haiku-5-5"  # five times the price above 100,000 prompt tokens
    target = RouteTarget(
        "anthropic", model, price=find_price(spec.prices, model), usage_fields=spec.usage_fields
    )
    pricer = RoutePricer(Route("chat", (target,), FastestPolicy()))
    usage = {"input_tokens": 150_000, "output_tokens": 10}
    record = AttemptReport(target.name, 0.0, "first", "won", usage=usage)
    ((_, units, exponent, _),) = pricer.amounts(RouteReport("chat", "fastest", attempts=[record]))
    full = attempt_cost(spec, model, usage).amount
    assert record.cost is not None and record.cost.amount == full  # priced in full, once
    assert full is not None and Decimal(units).scaleb(exponent) == full
    assert full == usd(150_000, 0.5) + usd(10, 2.5)  # the tier's prices, every token


async def test_every_routed_api_is_priced_from_its_vendors_usage(cached_sim: Simulator) -> None:
    """Legacy completions, embeddings and the Responses API (whole and streamed) on a route
    are priced as chat is: from the usage their vendor sent (its cached and reasoning tokens
    included), exact, never llmroute's own count of the prompt; summed in the metrics."""
    cfg = config({"a": provider(cached_sim, prices={"*": PRICE}, responses=True)}, ["a:sim-small"])
    text = f"Price this prompt {uuid.uuid4().hex}, word by word, to the last cent."
    async with AsyncOpenAI(config=cfg, verify=cached_sim.ssl_context()) as client:
        completion = await client.completions.create(model="chat", prompt=text, max_tokens=20)
        embedding = await client.embeddings.create(model="chat", input=text)
        stream = await client.responses.create(model="chat", input=text, stream=True)
        events = [event async for event in stream]
        response = await client.responses.create(model="chat", input=text)
        summed = client.metrics.costs()
        exposition = client.metrics.exposition().decode()
    streamed = next(e.response for e in events if e.type == "response.completed")
    answers = [
        (completion.route, completion.usage.prompt_tokens, completion.usage.completion_tokens),
        (embedding.route, embedding.usage.prompt_tokens, 0),
        (response.route, response.usage.input_tokens, response.usage.output_tokens),
        (stream.route, streamed.usage.input_tokens, streamed.usage.output_tokens),
    ]
    for route, prompt, output in answers:
        assert route is not None and route.cost is not None
        (attempt,) = route.attempts
        assert attempt.cost is not None and not attempt.cost.estimated  # the vendor's count
        assert route.cost.amount == attempt.cost.amount
        lines = {line.token_class: line.tokens for line in attempt.cost.lines}
        assert lines.get("input", 0) + lines.get("cache_read", 0) == prompt
        assert lines.get("output", 0) + lines.get("reasoning", 0) == output
    # llmroute's own count of the prompt is not the vendor's here: the vendor's was priced.
    assert (
        estimate_prompt_tokens([{"role": "user", "content": text}]) != embedding.usage.prompt_tokens
    )
    total = sum((route.cost.amount for route, _, _ in answers), Decimal(0))
    assert summed == {("a:sim-small", "answer", "USD"): total}
    line = 'llmroute_cost_total{kind="answer",target="a:sim-small"} '
    counted = next(x for x in exposition.splitlines() if x.startswith(line))
    assert float(counted.removeprefix(line)) == pytest.approx(float(total))


async def test_a_streamed_legacy_completion_is_priced_and_counted(cached_sim: Simulator) -> None:
    """openai's machinery reads a streamed legacy completion on a route itself; its body is
    decoded on the way, so its cost is the vendor's last usage chunk where the caller asked for
    one (exact), else its prompt (llmroute's count) and the token chunks it streamed (an
    estimate, said so); a stream its caller closes early is priced on what arrived. Each is
    counted in the client's metrics."""
    cfg = config({"a": provider(cached_sim, prices={"*": PRICE})}, ["a:sim-small"])
    text = f"Price this streamed prompt {uuid.uuid4().hex}, word by word."
    asked = {"model": "chat", "prompt": text, "max_tokens": 20, "stream": True}
    async with AsyncOpenAI(config=cfg, verify=cached_sim.ssl_context()) as client:
        stream = await client.completions.create(**asked, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        bare = await client.completions.create(**asked)
        deltas = len([c async for c in bare if c.choices and c.choices[0].text])
        cut = await client.completions.create(**asked)
        async for chunk in cut:
            if chunk.choices and chunk.choices[0].text:
                break  # the caller leaves after its first token
        await cut.close()
        summed = client.metrics.costs()
        exposition = client.metrics.exposition().decode()
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens
    route = stream.route
    assert route is not None and route.cost is not None and route.cost.amount is not None
    (attempt,) = route.attempts
    assert attempt.usage is not None and not route.cost.estimated  # the vendor's count
    assert route.cost.amount == usd(usage.prompt_tokens, 2) + usd(usage.completion_tokens, 8)
    prompt = estimate_prompt_tokens([]) + len(text) // 4  # llmroute's count of a bare prompt
    assert bare.route.cost.amount == usd(prompt, 2) + usd(deltas, 8)
    assert any(NO_USAGE in why for why in bare.route.cost.estimated)
    # What reached the client before it closed, at least the token it read.
    tokens = cut.route.attempts[0].tokens
    assert 1 <= tokens <= 20 and cut.route.attempts[0].outcome == "won"
    assert cut.route.cost.amount == usd(prompt, 2) + usd(tokens, 8)
    total = route.cost.amount + bare.route.cost.amount + cut.route.cost.amount
    assert summed == {("a:sim-small", "answer", "USD"): total}
    requests = [x for x in exposition.splitlines() if x.startswith("llmroute_requests_total{")]
    # The cut one's whole answer had arrived (the simulator is fast): counted as answered.
    assert requests == ['llmroute_requests_total{outcome="ok",route="chat",source="live"} 3.0']


def test_a_responses_usage_is_read_with_its_cached_and_reasoning_tokens() -> None:
    """A Responses API usage, in chat completions' shape for the OpenAI adapter's fields: its
    cached input and reasoning output are classes of their own (the simulator sends none)."""
    usage = {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 12},
        "total_tokens": 150,
    }
    chat = responses_usage(usage)
    assert chat is not None
    tokens = read_usage(chat, adapter_for("openai").usage_fields)
    assert tokens == TokenUsage(input=20, cache_read=100, output=30, reasoning=12)
    assert responses_usage(None) is None


async def test_a_stream_its_caller_closes_is_priced_from_what_its_vendor_had_counted(
    sim: Simulator, cached_sim: Simulator
) -> None:
    """A stream closed by its caller before its end: Anthropic's ``message_start`` had counted
    the prompt (its cache reads at the cached price), so that count is used with the tokens
    streamed, marked as an estimate; an OpenAI-style stream sends usage only at its end, so
    its prompt is llmroute's count as uncached input, with the tokens streamed (both said)."""
    price = {**PRICE, "cache_write": 2.5, "cache_write_1h": 4}
    system = [
        {
            "type": "text",
            "text": f"House rules {uuid.uuid4().hex}: answer briefly, and kindly. " * 8,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    anthropic = config({"a": provider(sim, kind="anthropic", prices={"*": price})}, ["a:sim-small"])
    openai = config({"o": provider(cached_sim, prices={"*": PRICE})}, ["o:sim-small"])
    routes: list[RouteReport] = []
    for cfg, server in ((anthropic, sim), (openai, cached_sim)):
        async with AsyncOpenAI(config=cfg, verify=server.ssl_context()) as client:
            for cut in (False, True):  # the first writes the cache, the second reads it
                stream = await client.chat.completions.create(
                    model="chat", messages=messages, stream=True, extra_body={"system": system}
                )
                seen = 0
                async for chunk in stream:
                    seen += bool(chunk.choices and chunk.choices[0].delta.content)
                    if cut and seen == 3:
                        break
                await stream.close()
                assert stream.route is not None
            routes.append(stream.route)
    for route in routes:
        (attempt,) = route.attempts
        assert attempt.outcome == "won" and attempt.cut
        assert attempt.tokens is not None and attempt.tokens >= 3
        assert route.cost is not None and attempt.cost is not None
    told, blind = (route.attempts[0] for route in routes)
    assert told.cost is not None and blind.cost is not None
    lines = {line.token_class: line.tokens for line in told.cost.lines}
    usage = told.usage  # message_start's: the prompt, and output_tokens 1
    assert lines["cache_read"] == usage["cache_read_input_tokens"] > 0
    assert lines["input"] == usage["input_tokens"]
    delivered = told.tokens_estimate or told.tokens
    assert lines["output"] == delivered
    assert told.cost.amount == (
        usd(usage["input_tokens"], 2) + usd(usage["cache_read_input_tokens"], 0.5)
    ) + usd(delivered, 8)
    assert told.cost.estimated == (CUT,)
    # No usage before the end: the prompt as llmroute counts it, uncached, and the tokens sent.
    assert blind.usage is None and blind.cost.estimated == (CUT_BLIND,)
    delivered = blind.tokens_estimate or blind.tokens
    assert blind.cost.amount == usd(routes[1].prompt_tokens, 2) + usd(delivered, 8)


class _Gzipping(BaseHTTPRequestHandler):
    """Passes a request on to the simulator at ``upstream`` and its answer back gzip'd, each
    piece flushed as it comes (a vendor or proxy that compresses its event streams)."""

    protocol_version = "HTTP/1.1"
    upstream = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        headers = {
            k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")
        }
        with (
            httpx.Client(timeout=10) as client,
            client.stream(
                "POST", self.upstream + self.path, content=body, headers=headers
            ) as reply,
        ):
            self.send_response(reply.status_code)
            self.send_header("content-type", reply.headers["content-type"])
            self.send_header("content-encoding", "gzip")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            pack = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
            for data in reply.iter_raw():
                self._chunk(pack.compress(data) + pack.flush(zlib.Z_SYNC_FLUSH))
            self._chunk(pack.flush())
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def gzipped(sim_h1: Simulator) -> Iterator[str]:
    """The base URL of a gzip'ing proxy in front of the plain-HTTP simulator."""
    handler = type("Handler", (_Gzipping,), {"upstream": sim_h1.base_url.removesuffix("/v1")})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_a_gzipped_streamed_legacy_completion_is_priced_on_its_answer_too(
    gzipped: str,
) -> None:
    """A streamed legacy completion whose body comes gzip'd is decoded on its way to openai
    like a plain one: its cost counts the answer's token chunks (without usage) or is the
    vendor's usage chunk (with it), not its prompt alone."""
    cfg = config(
        {"a": {"base_url": gzipped, "api_key": KEY, "prices": {"*": PRICE}}}, ["a:sim-small"]
    )
    text = f"Price this compressed prompt {uuid.uuid4().hex}, word by word."
    asked = {"model": "chat", "prompt": text, "max_tokens": 20, "stream": True}
    async with AsyncOpenAI(config=cfg) as client:
        bare = await client.completions.create(**asked)
        deltas = len([c async for c in bare if c.choices and c.choices[0].text])
        told = await client.completions.create(**asked, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in told]
    assert deltas > 0
    prompt = estimate_prompt_tokens([]) + len(text) // 4  # llmroute's count of a bare prompt
    assert bare.route is not None and bare.route.cost is not None
    assert bare.route.attempts[0].tokens == deltas
    assert bare.route.cost.amount == usd(prompt, 2) + usd(deltas, 8)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens
    assert told.route is not None and told.route.cost is not None
    assert told.route.attempts[0].usage is not None and not told.route.cost.estimated
    assert told.route.cost.amount == usd(usage.prompt_tokens, 2) + usd(usage.completion_tokens, 8)
