"""The simulator's raw ASGI app: OpenAI chat completions with latency and faults."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from . import _reply
from ._profile import Profile

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

STATUS_FAULTS = ("429", "500", "503", "html502")
STREAM_FAULTS = ("drop", "malformed", "stream-error")
# Faults of the OpenAI wire mode only: a clean end without the end of the answer, a slow-loris
# trickle of one event, an event far larger than any real one.
TAIL_FAULTS = ("truncate", "loris", "oversized")
_HTML_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
_YIELD_EVERY = 8  # with zero delays, give the event loop a turn every this many chunks


@dataclass
class Fault:
    """The faults of one request (from `x-sim-fault` or drawn from the profile)."""

    kind: str | None = None
    after: int = 0
    slow: float | None = None
    stall_after: int | None = None
    stall_seconds: float = 0.0
    amount: float = 0.0
    """``loris``: seconds between bytes; ``oversized``: the event's size in bytes."""

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """Parse a comma-separated `x-sim-fault` value; ValueError when malformed."""
        fault = cls()
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, arg = item.partition(":")
            if name in STATUS_FAULTS or name == "hang":
                fault.kind = name
            elif name in STREAM_FAULTS:
                fault.kind, fault.after = name, int(arg or 0)
            elif name in TAIL_FAULTS:
                k, _, amount = arg.partition(":")
                fault.kind, fault.after = name, int(k or 0)
                fault.amount = float(amount or (0.5 if name == "loris" else 32 * 1024 * 1024))
            elif name == "slow":
                fault.slow = float(arg)
            elif name == "stall-between":
                k, _, seconds = arg.partition(":")
                fault.stall_after, fault.stall_seconds = int(k), float(seconds)
            else:
                raise ValueError(f"unknown x-sim-fault {item!r}")
        return fault


def _error_body(message: str, type_: str, code: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


def _zero_stats() -> dict[str, Any]:
    return {
        "requests": 0,
        "chat_requests": 0,
        "streams_started": 0,
        "streams_completed": 0,
        "streams_cancelled": 0,
        "in_flight": 0,
        "peak_in_flight": 0,
        "faults": {},
    }


class SimApp:
    """ASGI app of one simulated provider. Counters are read from other threads."""

    def __init__(self, profile: Profile, *, seed: int | None = None, history: int = 64) -> None:
        self.profile = profile
        self.rng = random.Random(profile.seed if seed is None else seed)
        self.last_requests: deque[dict[str, Any]] = deque(maxlen=history)
        self.models: dict[str, None] = dict.fromkeys(profile.models)
        self.on_startup: Callable[[], None] | None = None
        self._stats = _zero_stats()
        self._fault_uses: dict[str, int] = {}
        self._gone: set[asyncio.Event] = set()
        self._closing = False
        from ._anthropic import AnthropicSimApp  # the same server speaks Anthropic's Messages API

        self.anthropic = AnthropicSimApp(
            profile,
            seed=seed,
            stats=lambda: self._stats,
            closing=lambda: self._closing,
            fault_uses=self._fault_uses,  # x-sim-fault-times counts both wire modes' requests
        )

    # -- counters ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters."""
        snap = dict(self._stats)
        snap["faults"] = dict(self._stats["faults"])
        return snap

    def reset_stats(self) -> None:
        """Zero the counters (in_flight is kept) and forget recorded requests."""
        fresh = _zero_stats()
        fresh["in_flight"] = fresh["peak_in_flight"] = self._stats["in_flight"]
        self._stats = fresh
        self.last_requests.clear()

    def _count_fault(self, kind: str) -> None:
        faults = self._stats["faults"]
        faults[kind] = faults.get(kind, 0) + 1

    def close(self) -> None:
        """End hanging and stalled handlers at once (call on the server's loop)."""
        self._closing = True
        for event in list(self._gone):
            event.set()

    # -- ASGI entry ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        rid = "req_" + uuid.uuid4().hex[:24]
        self._stats["requests"] += 1
        body = await _read_body(receive)
        if body is None:
            return
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if path.startswith("/_sim/"):
            await self._sim_route(path, method, send, rid)
            return
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        self.last_requests.append(
            {
                "method": method,
                "path": path,
                "http_version": scope["http_version"],
                "headers": headers,
                "query": dict(parse_qsl(scope["query_string"].decode("latin-1"))),
                "json": payload,
            }
        )
        auth = headers.get("authorization", "")
        if path == "/v1/messages" and method == "POST":
            self._stats["chat_requests"] += 1
            await self.anthropic.handle(scope, body, receive, send)
        elif not auth.startswith("Bearer ") or not auth[7:].strip():
            msg = "You didn't provide an API key (Authorization: Bearer <key>)."
            body401 = _error_body(msg, "invalid_request_error", "invalid_api_key")
            await _respond(send, 401, body401, rid)
        elif path == "/v1/chat/completions" and method == "POST":
            await self._chat(payload, headers, receive, send, rid)
        elif path == "/v1/completions" and method == "POST":
            await self._text_completion(payload, send, rid)
        elif path == "/v1/embeddings" and method == "POST":
            await self._embeddings(payload, send, rid)
        elif path.startswith("/v1/models/") and method == "GET":
            model = path[len("/v1/models/") :]
            if model in self.models:
                body = json.dumps(_reply.model_object(model)).encode()
                await _respond(send, 200, body, rid)
            else:
                msg = f"The model '{model}' does not exist"
                error = _error_body(msg, "invalid_request_error", "model_not_found")
                await _respond(send, 404, error, rid)
        elif path == "/v1/models" and method == "GET":
            created = 1_700_000_000
            data = [
                {"id": m, "object": "model", "created": created, "owned_by": "llmroute-sim"}
                for m in self.models
            ]
            await _respond(send, 200, json.dumps({"object": "list", "data": data}).encode(), rid)
        else:
            msg = f"Unknown request URL: {method} {path}."
            await _respond(send, 404, _error_body(msg, "invalid_request_error", "unknown_url"), rid)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.on_startup is not None:
                    self.on_startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _sim_route(self, path: str, method: str, send: Send, rid: str) -> None:
        if path == "/_sim/stats":
            await _respond(send, 200, json.dumps(self.stats()).encode(), rid)
        elif path == "/_sim/reset" and method == "POST":
            self.reset_stats()
            await _respond(send, 200, b"{}", rid)
        else:
            await _respond(send, 404, _error_body("not found", "invalid_request_error"), rid)

    # -- chat completions ---------------------------------------------------------------------
    async def _chat(
        self, req: Any, headers: dict[str, str], receive: Receive, send: Send, rid: str
    ) -> None:
        stats = self._stats
        stats["chat_requests"] += 1
        stats["in_flight"] += 1
        stats["peak_in_flight"] = max(stats["peak_in_flight"], stats["in_flight"])
        try:
            await self._chat_inner(req, headers, receive, send, rid)
        finally:
            self._stats["in_flight"] -= 1

    async def _chat_inner(
        self, req: Any, headers: dict[str, str], receive: Receive, send: Send, rid: str
    ) -> None:
        problem = _validate(req)
        fault, retry_after = Fault(), self.profile.retry_after
        if problem is None:
            try:
                spec = headers.get("x-sim-fault")
                fault = Fault.parse(spec) if spec else self._random_fault()
                if spec and "x-sim-fault-times" in headers:
                    key = headers.get("x-sim-fault-key", spec)
                    used = self._fault_uses.get(key, 0)
                    self._fault_uses[key] = used + 1
                    if used >= int(headers["x-sim-fault-times"]):
                        fault = Fault()
                retry_after = float(headers.get("x-sim-retry-after", self.profile.retry_after))
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            await _respond(send, 400, _error_body(problem, "invalid_request_error"), rid)
            return
        if fault.kind in STATUS_FAULTS:
            self._count_fault(fault.kind)
            await _status_fault(send, fault.kind, retry_after, rid)
            return
        if fault.slow is not None:
            self._count_fault("slow")
        if fault.stall_after is not None:
            self._count_fault("stall-between")
        if fault.kind is not None:
            self._count_fault(fault.kind)

        model: str = req["model"]
        messages: list[dict[str, Any]] = req["messages"]
        self.models.setdefault(model)
        plan = _Plan.build(req, model, messages, self.profile.reply_tokens)
        ttft = fault.slow
        if ttft is None:
            ttft = self.profile.sample_ttft(self.rng, plan.prompt_tokens)

        gone = asyncio.Event()
        self._gone.add(gone)
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gone))
        try:
            if req.get("stream"):
                await self._stream(req, plan, fault, ttft, gone, send, rid)
            else:
                await self._complete(plan, fault, ttft, gone, send, rid)
        finally:
            watcher.cancel()
            self._gone.discard(gone)

    # -- legacy completions and embeddings (no latency or faults) -------------------------------
    async def _text_completion(self, req: Any, send: Send, rid: str) -> None:
        problem = _validate_other(req, "prompt")
        if problem is not None:
            await _respond(send, 400, _error_body(problem, "invalid_request_error"), rid)
            return
        model: str = req["model"]
        self.models.setdefault(model)
        limit = req.get("max_tokens")
        n_tokens = self.profile.reply_tokens if limit is None else min(limit, 4096)
        finish = "stop" if limit is None or limit >= self.profile.reply_tokens else "length"
        prompts = _reply.prompt_texts(req.get("prompt"))
        replies = [
            _reply.full_reply(_reply.text_seed(model, p), min(n_tokens, self.profile.reply_tokens))
            for p in prompts
        ]
        prompt_tokens = sum(len(p.split()) for p in prompts)
        usage = _reply.usage(prompt_tokens, sum(len(r) for r in replies))
        if not req.get("stream"):
            choices = [_reply.text_choice(i, "".join(r), finish) for i, r in enumerate(replies)]
            body = _reply.text_completion(model, choices, usage)
            await _respond(send, 200, json.dumps(body).encode(), rid)
            return
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", rid.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self._stats["streams_started"] += 1
        id_, created = f"cmpl-{self.rng.getrandbits(64):016x}", int(time.time())

        def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            chunk = _reply.text_completion(model, choices, usage, id_=id_, created=created)
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        for i, reply in enumerate(replies):
            for token in reply:
                await send(
                    {
                        "type": "http.response.body",
                        "body": event([_reply.text_choice(i, token, None)]),
                        "more_body": True,
                    }
                )
            tail = event([_reply.text_choice(i, "", finish)])
            await send({"type": "http.response.body", "body": tail, "more_body": True})
        if (req.get("stream_options") or {}).get("include_usage"):
            usage_event = event([], usage)
            await send({"type": "http.response.body", "body": usage_event, "more_body": True})
        self._stats["streams_completed"] += 1
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def _embeddings(self, req: Any, send: Send, rid: str) -> None:
        problem = _validate_other(req, "input")
        fmt = req.get("encoding_format", "float") if isinstance(req, dict) else None
        if problem is None and fmt not in ("float", "base64"):
            problem = f"'{fmt}' is not one of ['float', 'base64'] - 'encoding_format'"
        dims = req.get("dimensions") if isinstance(req, dict) else None
        if problem is None and dims is not None and (not isinstance(dims, int) or dims < 1):
            problem = "'dimensions' must be a positive integer"
        if problem is not None:
            await _respond(send, 400, _error_body(problem, "invalid_request_error"), rid)
            return
        model: str = req["model"]
        self.models.setdefault(model)
        texts = _reply.prompt_texts(req["input"])
        data: list[dict[str, Any]] = []
        for i, text in enumerate(texts):
            vector = _reply.embedding_vector(model, text, dims or _reply.EMBEDDING_DIMENSIONS)
            value = _reply.embedding_base64(vector) if fmt == "base64" else vector
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(t.split()) for t in texts)
        body = {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        await _respond(send, 200, json.dumps(body).encode(), rid)

    def _random_fault(self) -> Fault:
        kind = self.profile.sample_fault(self.rng)
        return Fault(kind=kind, after=self.profile.fault_after)

    async def _pause(self, seconds: float, gone: asyncio.Event) -> bool:
        """Sleep unless the client goes away first; True when it did (or we are closing)."""
        if gone.is_set():
            return True
        if seconds <= 0:
            return False
        try:
            async with asyncio.timeout(seconds):
                await gone.wait()
        except TimeoutError:
            return False
        return True

    def _ended_early(self) -> None:
        if not self._closing:
            self._stats["streams_cancelled"] += 1

    async def _stream(
        self,
        req: dict[str, Any],
        plan: _Plan,
        fault: Fault,
        ttft: float,
        gone: asyncio.Event,
        send: Send,
        rid: str,
    ) -> None:
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        writer = _reply.ChunkWriter(plan.model, include_usage, plan.seed)
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", rid.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self._stats["streams_started"] += 1

        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if await self._pause(ttft, gone):
            return self._ended_early()
        if fault.kind == "hang":
            if await self._pause(self.profile.hang_max, gone):
                return self._ended_early()
            return None  # hang bound passed: the stream breaks (h2 reset, h1 close)
        await emit(writer.event(plan.first_delta()))
        itl = self.profile.inter_token
        pieces = plan.pieces
        for i in range(len(pieces) + 1):
            if fault.kind in TAIL_FAULTS and i == min(fault.after, len(pieces)):
                if fault.kind == "truncate":  # a clean end, without finish_reason or [DONE]
                    await send({"type": "http.response.body", "body": b""})
                    return None
                if fault.kind == "oversized":
                    await self._oversized(emit, int(fault.amount))
                elif await self._trickle(emit, writer.content("slow"), fault.amount, gone):
                    return self._ended_early()
                else:
                    return None  # the hang bound passed: the stream breaks
            if fault.kind in STREAM_FAULTS and i == min(fault.after, len(pieces)):
                if fault.kind == "drop":
                    return None  # no end of stream: the server resets it / closes
                if fault.kind == "stream-error":
                    err = {
                        "error": {
                            "message": "The server had an error while processing your request.",
                            "type": "server_error",
                        }
                    }
                    body = b"data: " + json.dumps(err).encode() + b"\n\n"
                    await send({"type": "http.response.body", "body": body})
                    return None
                await emit(b"data: {not json\n\n")
            if i == len(pieces):
                break
            if fault.stall_after is not None and i == fault.stall_after and i > 0:
                if await self._pause(fault.stall_seconds, gone):
                    return self._ended_early()
            elif itl > 0 and i > 0:
                if await self._pause(itl, gone):
                    return self._ended_early()
            elif i % _YIELD_EVERY == 1:
                await asyncio.sleep(0)
                if gone.is_set():
                    return self._ended_early()
            await emit(writer.arguments(pieces[i]) if plan.tool else writer.content(pieces[i]))
        tail = writer.event({}, plan.finish)
        if include_usage:
            tail += writer.usage_event(plan.prompt_tokens, len(pieces))
        if gone.is_set():
            return self._ended_early()
        self._stats["streams_completed"] += 1  # counted first: the client may look at once
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n"})
        return None

    @staticmethod
    async def _oversized(emit: Callable[[bytes], Awaitable[None]], size: int) -> None:
        """One ``data:`` event of ``size`` bytes (valid JSON), sent in 64 KiB pieces."""
        await emit(b'data: {"padding": "')
        piece = b"x" * 65536
        left = max(0, size - 20)
        while left > 0:
            await emit(piece[:left])
            left -= len(piece)
        await emit(b'"}\n\n')

    async def _trickle(
        self,
        emit: Callable[[bytes], Awaitable[None]],
        event: bytes,
        every: float,
        gone: asyncio.Event,
    ) -> bool:
        """Send ``event`` one byte every ``every`` seconds, never its end (a slow loris), until
        the client goes away (True) or ``Profile.hang_max`` passes (False)."""
        deadline = time.monotonic() + self.profile.hang_max
        for i in itertools.count():
            if time.monotonic() >= deadline:
                return False
            await emit(event[i % (len(event) - 2) : i % (len(event) - 2) + 1])
            if await self._pause(every, gone):
                return True
        return False  # pragma: no cover - the loop only ends by returning

    async def _complete(
        self, plan: _Plan, fault: Fault, ttft: float, gone: asyncio.Event, send: Send, rid: str
    ) -> None:
        delay = ttft + self.profile.inter_token * max(0, len(plan.pieces) - 1)
        if fault.stall_after is not None:
            delay += fault.stall_seconds
        if fault.kind == "hang":
            delay = self.profile.hang_max
        if await self._pause(delay, gone) or fault.kind == "hang":
            return None  # client gone, or the hang bound passed: no response at all
        if fault.kind == "stream-error":
            body = _error_body(
                "The server had an error while processing your request.", "server_error"
            )
            await _respond(send, 500, body, rid)
            return None
        body = json.dumps(plan.completion()).encode()
        if fault.kind == "malformed":
            body = b"{not json"
        start_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", rid.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": start_headers})
        if fault.kind == "drop":  # half the body, then the connection/stream breaks
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            return None
        await send({"type": "http.response.body", "body": body})
        return None


@dataclass
class _Plan:
    """What one request will answer: text tokens or tool-call argument fragments."""

    model: str
    seed: int
    prompt_tokens: int
    pieces: list[str]
    finish: str
    tool: dict[str, Any] | None = None
    call_id: str = ""

    @classmethod
    def build(
        cls, req: dict[str, Any], model: str, messages: list[dict[str, Any]], reply_tokens: int
    ) -> _Plan:
        seed = _reply.reply_seed(model, messages)
        _, prefill = _reply.split_prefill(messages)
        n_prompt = _reply.prompt_tokens(messages)
        tool = _reply.pick_tool(req.get("tools") or [], req.get("tool_choice"))
        if tool is not None:
            args = _reply.tool_arguments(tool, seed)
            return cls(
                model,
                seed,
                n_prompt,
                _reply.split_fragments(args),
                "tool_calls",
                tool,
                f"call_{seed:016x}",
            )
        full = _reply.full_reply(seed, reply_tokens)
        pieces = list(full)
        if prefill is not None:
            rest = _reply.continue_after(full, prefill)
            if rest is not None:
                pieces = rest
        finish = "stop"
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        if limit is not None and len(pieces) > limit:
            pieces, finish = pieces[:limit], "length"
        return cls(model, seed, n_prompt, pieces, finish)

    def first_delta(self) -> dict[str, Any]:
        if self.tool is None:
            return {"role": "assistant", "content": ""}
        call = {
            "index": 0,
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.tool.get("name", ""), "arguments": ""},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if self.tool is None:
            message["content"] = "".join(self.pieces)
        else:
            message["tool_calls"] = [
                {
                    "id": self.call_id,
                    "type": "function",
                    "function": {
                        "name": self.tool.get("name", ""),
                        "arguments": "".join(self.pieces),
                    },
                }
            ]
        return _reply.completion(
            self.model, self.seed, message, self.finish, self.prompt_tokens, len(self.pieces)
        )


def _validate(req: Any) -> str | None:
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    if not isinstance(req.get("model"), str) or not req["model"]:
        return "you must provide a model parameter"
    if not isinstance(req.get("messages"), list) or not req["messages"]:
        return "'messages' must be a non-empty array"
    if req.get("n") not in (None, 1):
        return "the simulator supports only n=1"
    for key in ("max_tokens", "max_completion_tokens"):
        value = req.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            return f"'{key}' must be a positive integer"
    return None


def _validate_other(req: Any, field: str) -> str | None:
    """Check a completions (``prompt``) or embeddings (``input``) request."""
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    if not isinstance(req.get("model"), str) or not req["model"]:
        return "you must provide a model parameter"
    if req.get(field) is None:
        return f"'{field}' is a required property"
    if req.get("n") not in (None, 1):
        return "the simulator supports only n=1"
    value = req.get("max_tokens")
    if value is not None and (not isinstance(value, int) or value < 1):
        return "'max_tokens' must be a positive integer"
    return None


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    rid: str,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
    id_header: bytes = b"x-request-id",
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (id_header, rid.encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _status_fault(send: Send, kind: str, retry_after: float, rid: str) -> None:
    retry = [
        (b"retry-after", str(max(0, math.ceil(retry_after))).encode()),
        (b"retry-after-ms", str(max(0, round(retry_after * 1000))).encode()),
    ]
    if kind == "429":
        msg = "Rate limit reached for requests (simulated)."
        await _respond(
            send, 429, _error_body(msg, "requests", "rate_limit_exceeded"), rid, extra=retry
        )
    elif kind == "500":
        msg = "The server had an error while processing your request."
        await _respond(send, 500, _error_body(msg, "server_error"), rid)
    elif kind == "503":
        msg = "The engine is currently overloaded, please try again later."
        await _respond(send, 503, _error_body(msg, "server_error", "overloaded"), rid, extra=retry)
    else:
        await _respond(send, 502, _HTML_502, rid, content_type=b"text/html")
