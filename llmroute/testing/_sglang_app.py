"""The SGLang stand-in's HTTP server: the ASGI app of one rank (:class:`SGLangApp`: its scheduler
of ``--max-running-requests`` slots, prefix cache, endpoints and metrics), the ranks of
``--dp-size`` behind one port (:class:`DataParallelApp`), and one chat completion from queue to
last token (``_Generation``). :mod:`llmroute.testing._sglang` says what it answers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ._answer import _Reply
from ._sglang_metrics import _SCHEDULER_GAUGES, _Exposition, _Stats
from ._sglang_prefix import BLOCK_TOKENS, PrefixCache, prompt_token_list
from ._sglang_settings import _V036, _V040, _V050, _V054, StandInKnobs, parse_version
from ._wire import (
    STATUS_FAULTS,
    Fault,
    Receive,
    Scope,
    Send,
    pause,
    read_body,
    request_headers,
    serve_lifespan,
    status_fault,
    watching,
)

DEFAULT_MAX_RUNNING = 8
_EOS_TOKEN_ID = 151645  # Qwen2.5's <|im_end|>: SGLang reports the matched stop token's id
_HANG_MAX = 300.0
_LOG = logging.getLogger("sglang.srt")


@dataclass(eq=False)
class _Entry:
    """A chat request in the scheduler: queued, then running."""

    tokens: list[str]
    seq: int
    admitted: asyncio.Future[None]
    used_tokens: int = 0


def _error_body(message: str, status: int, type_: str = "BadRequestError") -> bytes:
    error = {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    return json.dumps(error).encode()


async def _send(
    send: Send, status: int, body: bytes = b"", content_type: bytes = b"application/json"
) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SGLangApp:
    """The ASGI app of one stand-in server (one "GPU worker" with its own prefix cache)."""

    def __init__(
        self,
        args: dict[str, Any],
        version: str,
        knobs: StandInKnobs,
        log: logging.Logger = _LOG,
        *,
        dp_rank: int | None = None,
    ) -> None:
        self.args = args
        self.dp_rank = dp_rank
        self.peers: list[SGLangApp] = [self]
        """Every data-parallel rank's app (itself alone without data parallelism): rank 0
        answers /metrics and /flush_cache for all of them."""
        self.version_text = version
        self.version = parse_version(version)
        self.knobs = knobs
        self.log = log
        self.model_name: str = args["served_model_name"]
        self.capacity: int = args.get("max_total_tokens") or knobs.cache_tokens
        page = args.get("page_size") or 1
        self.cache = PrefixCache(self.capacity, page if page > 1 else BLOCK_TOKENS)
        self.radix = not args.get("disable_radix_cache")
        self.max_running: int = args.get("max_running_requests") or DEFAULT_MAX_RUNNING
        self.warm = asyncio.Event()
        self.draining = False
        self.running: set[_Entry] = set()
        self.waiting: list[_Entry] = []
        self.stats = _Stats(throughput_mark=(time.monotonic(), 0))
        self._rng = random.Random(args.get("random_seed"))
        self._seq = itertools.count()
        self._gone: set[asyncio.Event] = set()
        self._fault_uses: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def set_warm(self) -> None:
        self.warm.set()
        self._dispatch()

    def close(self) -> None:
        """End queued, hanging and streaming handlers now (the server is shutting down)."""
        self.draining = True
        for event in list(self._gone):
            event.set()

    # -- scheduler ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        if not self.warm.is_set():
            return
        while self.waiting and len(self.running) < self.max_running:
            entry = self._pick()
            self.waiting.remove(entry)
            self.running.add(entry)
            entry.admitted.set_result(None)

    def _pick(self) -> _Entry:
        policy = self.args.get("schedule_policy")
        if policy == "lpm" and self.radix and len(self.waiting) > 1:
            return max(self.waiting, key=lambda e: (self.cache.match(e.tokens), -e.seq))
        if policy == "random":
            return self._rng.choice(self.waiting)
        return self.waiting[0]

    async def _admit(self, entry: _Entry, gone: asyncio.Event) -> bool:
        self.waiting.append(entry)
        self._dispatch()
        if not entry.admitted.done():
            leaving = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({entry.admitted, leaving}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # cancelled: give back the queue place or the slot
                if entry.admitted.done():
                    self._release(entry)
                else:
                    self.waiting.remove(entry)
                raise
            finally:
                leaving.cancel()
        if entry.admitted.done():
            return True
        self.waiting.remove(entry)
        return False

    def _release(self, entry: _Entry) -> None:
        self.running.discard(entry)
        self._dispatch()

    # -- ASGI entry -----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if body is None:
            return
        path, method = scope["path"], scope["method"]
        headers = request_headers(scope)
        key = self.args.get("api_key")
        if key and method != "OPTIONS" and not self._open_path(path):
            if headers.get("authorization") != f"Bearer {key}":
                await _send(send, 401, b'{"error":"Unauthorized"}')
                return
        await self._route(path, method, body, headers, receive, send)

    def _open_path(self, path: str) -> bool:
        """Paths that need no API key."""
        return path.startswith("/health") or (path.startswith("/metrics") and self.version >= _V050)

    async def _route(
        self,
        path: str,
        method: str,
        body: bytes,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
    ) -> None:
        gets: dict[str, Callable[[], Any]] = {
            "/health": self._health,
            "/health_generate": self._health_generate,
            "/get_model_info": self._model_info,
            "/v1/models": self._models,
            "/metrics": self._metrics,
        }
        gets["/get_server_info" if self.version >= _V040 else "/get_server_args"] = (
            self._server_info
        )
        if path == "/v1/chat/completions" and method == "POST":
            await self._chat(body, headers, receive, send)
        elif path == "/flush_cache" and (method == "POST" or self.version >= _V050):
            await self._flush_cache(send)
        elif path.startswith("/v1/models/") and method == "GET":
            await self._model_card(path.removeprefix("/v1/models/"), send)
        elif path in gets and method in ("GET", "HEAD"):
            status, payload, content_type = gets[path]()
            await _send(send, status, payload, content_type)
        elif path in gets or path == "/v1/chat/completions":
            await _send(send, 405, b'{"detail":"Method Not Allowed"}')
        else:
            await _send(send, 404, b'{"detail":"Not Found"}')

    # -- small endpoints ------------------------------------------------------------------------
    def _health(self) -> tuple[int, bytes, bytes]:
        if self.version >= _V050:
            return self._health_generate()
        return 200, b"", b""

    def _health_generate(self) -> tuple[int, bytes, bytes]:
        return (200 if self.warm.is_set() and not self.draining else 503), b"", b""

    def _json(self, obj: Any) -> tuple[int, bytes, bytes]:
        return 200, json.dumps(obj).encode(), b"application/json"

    def _model_info(self) -> tuple[int, bytes, bytes]:
        info: dict[str, Any] = {"model_path": self.args["model_path"]}
        if self.version >= _V036:
            info["tokenizer_path"] = self.args["tokenizer_path"]
        info["is_generation"] = True
        if self.version >= _V054:
            info["preferred_sampling_params"] = self.args.get("preferred_sampling_params")
            info["weight_version"] = self.args.get("weight_version", "default")
        return self._json(info)

    def _server_info(self) -> tuple[int, bytes, bytes]:
        info: dict[str, Any] = {**self.args, "api_key": None}
        if self.version < _V040:
            return self._json(info)
        info["max_total_num_tokens"] = self.capacity
        info["max_req_input_len"] = self.capacity - 1
        if self.version >= _V050:
            info["internal_states"] = [{"last_gen_throughput": self._throughput(peek=True)}]
        info["version"] = self.version_text
        return self._json(info)

    def _card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.args.get("context_length") or 32768,
        }

    def _models(self) -> tuple[int, bytes, bytes]:
        return self._json({"object": "list", "data": [self._card()]})

    async def _model_card(self, model: str, send: Send) -> None:
        if model == self.model_name:
            await _send(send, 200, json.dumps(self._card()).encode())
            return
        error = {
            "message": f"The model '{model}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        await _send(send, 404, json.dumps({"error": error}).encode())

    async def _flush_cache(self, send: Send) -> None:
        idle = all(not peer.running and not peer.waiting for peer in self.peers)
        if idle:
            for peer in self.peers:
                peer.cache.clear()
        text = (
            b"Cache flushed.\nPlease check backend logs for more details. (When there are "
            b"running or waiting requests, the operation will not be performed.)\n"
        )
        await _send(send, 200 if idle else 400, text, b"text/plain; charset=utf-8")

    # -- metrics --------------------------------------------------------------------------------
    def _throughput(self, *, peek: bool = False) -> float:
        now, total = time.monotonic(), self.stats.generation_tokens
        then, before = self.stats.throughput_mark
        if not peek:
            self.stats.throughput_mark = (now, total)
        return (total - before) / (now - then) if now > then else 0.0

    def _metrics(self) -> tuple[int, bytes, bytes]:
        if not self.args.get("enable_metrics"):
            return 404, b'{"detail":"Not Found"}', b"application/json"
        text = self.metrics_text().encode()
        return 200, text, b"text/plain; version=0.0.4; charset=utf-8"

    def metrics_text(self) -> str:
        """The /metrics page: SGLang's names, types and labels for this version."""
        new, s = self.version >= _V050, _Stats.merged([peer.stats for peer in self.peers])
        model = {"model_name": self.model_name}
        sched = model
        if new:
            sched = {"engine_type": "unified", **model, "pp_rank": "0", "tp_rank": "0"}
        # One scheduler per data-parallel rank, each with its gauges (labelled dp_rank).
        gauges: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
            (name, help, []) for name, help in _SCHEDULER_GAUGES
        ]
        for peer in self.peers:
            labels = sched if peer.dp_rank is None else {**sched, "dp_rank": str(peer.dp_rank)}
            used = sum(entry.used_tokens for entry in peer.running)
            values = (
                len(peer.running),
                used,
                used / peer.capacity,
                peer._throughput(),
                len(peer.waiting),
                peer.stats.cache_hit_rate,
            )
            for (_, _, samples), value in zip(gauges, values, strict=True):
                samples.append((labels, value))
        counters = [
            ("prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens),
            (
                "generation_tokens_total",
                "Number of generation tokens processed.",
                s.generation_tokens,
            ),
        ]
        if new:
            counters += [
                ("cached_tokens_total", "Number of cached prompt tokens.", s.cached_tokens),
                ("num_requests_total", "Number of requests processed.", s.requests),
                ("num_aborted_requests_total", "Number of requests aborted.", s.aborted),
            ]
        itl = ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")
        if not new:
            itl = (
                "time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
            )
        histograms = [
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
            (*itl, s.itl),
            (
                "e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                s.e2e,
            ),
        ]
        out = _Exposition()
        for name, help, samples in gauges:
            out.values(f"sglang:{name}", "gauge", help, samples)
        if new:
            help = "Histogram of queueing time in seconds."
            out.histogram("sglang:queue_time_seconds", help, sched, s.queue)
        for name, help, value in counters:
            out.value(f"sglang:{name}", "counter", help, model, value)
        for name, help, histogram in histograms:
            out.histogram(f"sglang:{name}", help, model, histogram)
        return out.text()

    # -- chat completions -----------------------------------------------------------------------
    def _fault(self, headers: dict[str, str]) -> Fault:
        spec = headers.get("x-sim-fault")
        if not spec:
            return Fault()
        fault = Fault.parse(spec)
        if "x-sim-fault-times" in headers:
            key = headers.get("x-sim-fault-key", spec)
            used = self._fault_uses.get(key, 0)
            self._fault_uses[key] = used + 1
            if used >= int(headers["x-sim-fault-times"]):
                return Fault()
        return fault

    async def _chat(
        self, body: bytes, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        req: dict[str, Any] = {}
        fault, retry_after = Fault(), 1.0
        try:
            parsed = json.loads(body)
            problem = _check_chat(parsed)
            if problem is None:
                req = cast("dict[str, Any]", parsed)
                fault = self._fault(headers)
                retry_after = float(headers.get("x-sim-retry-after", "1"))
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            await _send(send, 400, _error_body(problem, 400))
            return
        if fault.kind in STATUS_FAULTS:
            await status_fault(send, fault.kind, retry_after, "req_" + uuid.uuid4().hex[:24])
            return
        limit = self.args.get("max_queued_requests")
        if limit is not None and len(self.waiting) >= limit:
            msg = "The request queue is full."
            await _send(send, 503, _error_body(msg, 503, "Service Unavailable"))
            return
        loop = asyncio.get_running_loop()
        entry = _Entry(prompt_token_list(req["messages"]), next(self._seq), loop.create_future())
        async with watching(receive, self._gone) as gone:
            await _Generation(self, req, entry, fault, gone, send).run()


class DataParallelApp:
    """A server with ``--dp-size N``: N ranks, each its own scheduler and prefix cache; chat
    requests go to them in turn (SGLang's default ``--load-balance-method round_robin``), every
    other path to rank 0, whose /metrics shows each rank's gauges with a ``dp_rank`` label."""

    def __init__(
        self, args: dict[str, Any], version: str, knobs: StandInKnobs, log: logging.Logger
    ) -> None:
        size = int(args.get("dp_size") or 1)
        self.ranks = [SGLangApp(args, version, knobs, log, dp_rank=i) for i in range(size)]
        for rank in self.ranks:
            rank.peers = self.ranks
        self._turn = itertools.count()
        self.capacity = self.ranks[0].capacity
        self.max_running = self.ranks[0].max_running

    @property
    def draining(self) -> bool:
        return self.ranks[0].draining

    @draining.setter
    def draining(self, value: bool) -> None:
        for rank in self.ranks:
            rank.draining = value

    def set_warm(self) -> None:
        for rank in self.ranks:
            rank.set_warm()

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rank = self.ranks[0]
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            rank = self.ranks[next(self._turn) % len(self.ranks)]
        await rank(scope, receive, send)


def _check_chat(req: Any) -> str | None:
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    body = cast("dict[str, Any]", req)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: a non-empty list of messages is required"
    if body.get("n") not in (None, 1):
        return "the llmroute stand-in supports only n=1"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            return f"{key} must be a positive integer"
    return None


class _Generation:
    """One chat completion: queue, prefill (TTFT), decode, streamed or as one JSON body."""

    def __init__(
        self,
        app: SGLangApp,
        req: dict[str, Any],
        entry: _Entry,
        fault: Fault,
        gone: asyncio.Event,
        send: Send,
    ) -> None:
        self.app, self.req, self.entry, self.fault, self.gone = app, req, entry, fault, gone
        self.send = send
        self.model: str = req.get("model") or "default"
        self.plan = _Reply.build(
            {**req, "tools": None}, self.model, req["messages"], app.knobs.reply_tokens
        )
        self.rid = uuid.uuid4().hex
        self.stream = bool(req.get("stream"))
        self.include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.arrival = time.monotonic()
        self.cached = 0
        self.sent = 0

    async def run(self) -> None:
        app, stats = self.app, self.app.stats
        if self.stream:
            headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
            await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        if not await app._admit(self.entry, self.gone):
            stats.aborted += 1
            return
        try:
            finished = await self._generate()
        finally:
            app._release(self.entry)
            stats.requests += 1
        if not finished:
            stats.aborted += 1
        else:
            stats.e2e.observe(time.monotonic() - self.arrival)

    async def _prefill(self) -> bool:
        app, stats, tokens = self.app, self.app.stats, self.entry.tokens
        stats.queue.observe(time.monotonic() - self.arrival)
        self.cached = app.cache.match(tokens, touch=True) if app.radix else 0
        uncached = len(tokens) - self.cached
        stats.prompt_tokens += len(tokens)
        stats.cached_tokens += self.cached
        stats.cache_hit_rate = self.cached / len(tokens)
        self.entry.used_tokens = len(tokens)
        usage = sum(e.used_tokens for e in app.running) / app.capacity
        app.log.info(
            f"Prefill batch. #new-seq: 1, #new-token: {uncached}, #cached-token: {self.cached}, "
            f"token usage: {usage:.2f}, #running-req: {len(app.running) - 1}, "
            f"#queue-req: {len(app.waiting)}"
        )
        delay = self.fault.slow
        if delay is None:
            delay = app.knobs.ttft + app.knobs.prefill_ms_per_1k * uncached / 1e6
        if self.fault.kind == "hang":
            delay = _HANG_MAX
        if await pause(delay, self.gone) or self.fault.kind == "hang":
            return False
        if app.radix:
            app.cache.insert(tokens)
        stats.ttft.observe(time.monotonic() - self.arrival)
        return True

    def _token_sent(self, last: float) -> float:
        now = time.monotonic()
        if self.sent:
            self.app.stats.itl.observe(now - last)
        self.sent += 1
        self.entry.used_tokens += 1
        self.app.stats.generation_tokens += 1
        return now

    def _finished(self) -> None:
        """Cache the whole conversation, reply included (the next turn starts with it)."""
        if self.app.radix:
            reply = "".join(self.plan.pieces[: self.sent]).split()
            self.app.cache.insert([*self.entry.tokens, *reply, "<|im_end|>"])

    def _usage(self) -> dict[str, Any]:
        prompt = len(self.entry.tokens)
        report = self.app.args.get("enable_cache_report") and self.cached > 0
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + self.sent,
            "completion_tokens": self.sent,
            "prompt_tokens_details": {"cached_tokens": self.cached} if report else None,
            "reasoning_tokens": 0,
        }

    def _matched_stop(self) -> int | None:
        return _EOS_TOKEN_ID if self.plan.finish == "stop" else None

    async def _generate(self) -> bool:
        if not await self._prefill():
            return False
        if self.stream:
            return await self._stream()
        return await self._complete()

    async def _complete(self) -> bool:
        pieces, fault, itl = self.plan.pieces, self.fault, self.app.knobs.inter_token
        last = self._token_sent(0.0)
        for i in range(1, len(pieces)):
            gap = fault.stall_seconds if i == fault.stall_after else itl
            if await pause(gap, self.gone):
                return False
            last = self._token_sent(last)
        if fault.kind == "stream-error":
            message = "The server had an error while processing your request (simulated)."
            await _send(self.send, 500, _error_body(message, 500, "InternalServerError"))
            return True
        message = {
            "role": "assistant",
            "content": "".join(pieces),
            "reasoning_content": None,
            "tool_calls": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": self.plan.finish,
            "matched_stop": self._matched_stop(),
        }
        response: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(),
        }
        if self.app.version >= _V054:
            response["metadata"] = {"weight_version": self.app.args.get("weight_version")}
        body = json.dumps(response).encode()
        if fault.kind == "malformed":
            body = b"{not json"
        if fault.kind == "drop":
            start = {"type": "http.response.start", "status": 200, "headers": []}
            await self.send(start)
            half = {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            await self.send(half)
            return False
        self._finished()
        await _send(self.send, 200, body)
        return True

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
            | delta,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": self._matched_stop() if finish else None,
        }
        return self._event([choice], None)

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        chunk = {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def _send_tokens(self, start: int, end: int, last: float) -> float:
        """Send the answer's tokens ``start`` to ``end`` as one event."""
        await self._emit(self._chunk({"content": "".join(self.plan.pieces[start:end])}))
        for _ in range(start, end):
            last = self._token_sent(last)
        return last

    async def _emit(self, data: bytes, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def _stream(self) -> bool:
        """Stream the answer, ``--stream-interval`` tokens an event (SGLang's default, one)."""
        pieces, fault, itl = self.plan.pieces, self.fault, self.app.knobs.inter_token
        interval = max(1, int(self.app.args.get("stream_interval") or 1))
        last, held, waited = 0.0, 0, 0.0  # tokens decoded but not sent yet, and their time
        await self._emit(self._chunk({"role": "assistant", "content": ""}))
        for i in range(len(pieces) + 1):
            if fault.kind in ("drop", "malformed", "stream-error") and i == min(
                fault.after, len(pieces)
            ):
                if held:  # the tokens before the fault go out first
                    if await pause(waited, self.gone):
                        return False
                    last, held, waited = await self._send_tokens(i - held, i, last), 0, 0.0
                if fault.kind == "drop":
                    return False  # no end of body: the connection is closed
                if fault.kind == "stream-error":
                    message = "The request was aborted by the server (simulated stream-error)."
                    error = {"error": json.loads(_error_body(message, 400))}
                    await self._emit(b"data: " + json.dumps(error).encode() + b"\n\n")
                    await self._emit(b"data: [DONE]\n\n", more=False)
                    return True
                await self._emit(b"data: {not json\n\n")
            if i == len(pieces):
                break
            if i > 0:
                waited += fault.stall_seconds if i == fault.stall_after else itl
            held += 1
            if held == interval or i == len(pieces) - 1:
                if await pause(waited, self.gone):
                    return False
                last, held, waited = await self._send_tokens(i + 1 - held, i + 1, last), 0, 0.0
        tail = self._chunk({}, self.plan.finish)
        if self.include_usage:
            tail += self._event([], self._usage())
        self._finished()
        await self._emit(tail + b"data: [DONE]\n\n", more=False)
        return True
