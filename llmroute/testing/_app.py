"""The simulator's raw ASGI app: OpenAI chat completions and Responses with latency and faults."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import llmroute.testing._reply as _reply
import llmroute.testing._responses as _responses

from ._answer import _ChatStream, _Reply, _ResponsesStream, _Wire
from ._anthropic import AnthropicSimApp
from ._profile import Profile
from ._requests import _reasoning_words, _validate, _validate_other, _vendor_refusal
from ._wire import (
    STATUS_FAULTS,
    STREAM_FAULTS,
    TAIL_FAULTS,
    Fault,
    Receive,
    Scope,
    Send,
    error_body,
    open_event_stream,
    over_window,
    pace,
    pause,
    read_body,
    request_headers,
    requested_fault,
    respond,
    send_whole,
    serve_lifespan,
    status_fault,
    wait_whole,
    watch_disconnect,
)


def _zero_stats() -> dict[str, Any]:
    return {
        "requests": 0,
        "chat_requests": 0,
        "responses_requests": 0,
        "streams_started": 0,
        "streams_completed": 0,
        "streams_cancelled": 0,
        "prompt_tokens": 0,
        "tokens_streamed": 0,
        "in_flight": 0,
        "peak_in_flight": 0,
        "held": 0,
        "faults": {},
    }


class PromptCache:
    """A vendor's automatic prompt cache, as the simulator keeps it: the longest run of leading
    messages an earlier request of the same model began with is read from the cache (its
    tokens, the simulator's count); every request's leading runs are remembered after."""

    LIMIT = 100_000
    """Runs remembered at most (then it starts again, as an evicted cache does)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def read(self, model: str, messages: list[dict[str, Any]]) -> int:
        """The cached prompt tokens of a request for ``model`` with ``messages``."""
        keys: list[str] = []
        digest = hashlib.sha256(model.encode())
        for message in messages:
            digest.update(json.dumps(message, sort_keys=True).encode())
            keys.append(digest.hexdigest())
        hit = next((n for n in range(len(keys) - 1, 0, -1) if keys[n - 1] in self._seen), 0)
        if len(self._seen) > self.LIMIT:
            self._seen.clear()
        self._seen.update(keys)
        return _reply.prompt_tokens(messages[:hit]) if hit else 0


class SimApp:
    """ASGI app of one simulated provider. Counters are read from other threads."""

    def __init__(self, profile: Profile, *, seed: int | None = None, history: int = 64) -> None:
        self.profile = profile
        self.rng = random.Random(profile.seed if seed is None else seed)
        self.last_requests: deque[dict[str, Any]] = deque(maxlen=history)
        self.models: dict[str, None] = dict.fromkeys(profile.models)
        self.on_startup: Callable[[], None] | None = None
        self._stats = _zero_stats()
        self.issued = _responses.IssuedIds()
        """The ids of responses this simulator issued (``previous_response_id`` must be one)."""
        self._fault_uses: dict[str, int] = {}
        self._prompt_cache = PromptCache()
        self._gone: set[asyncio.Event] = set()
        self._release = asyncio.Event()  # set by release(): the streams held now go on
        self._closing = False
        # the same server speaks Anthropic's Messages API
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
        """Zero the counters (in_flight and held are kept) and forget recorded requests."""
        fresh = _zero_stats()
        fresh["in_flight"] = fresh["peak_in_flight"] = self._stats["in_flight"]
        fresh["held"] = self._stats["held"]
        self._stats = fresh
        self.last_requests.clear()

    def _enter(self) -> None:
        """One more request in flight (``peak_in_flight`` keeps the most at once)."""
        stats = self._stats
        stats["in_flight"] += 1
        stats["peak_in_flight"] = max(stats["peak_in_flight"], stats["in_flight"])

    def _count_fault(self, kind: str) -> None:
        faults = self._stats["faults"]
        faults[kind] = faults.get(kind, 0) + 1

    def release(self) -> int:
        """Let every stream held before its first token go on (``Profile.hold_first_token``);
        streams that come later are held until the next release. Returns how many were held.
        Call on the server's loop."""
        held = self._stats["held"]
        event, self._release = self._release, asyncio.Event()
        event.set()
        return held

    async def _hold(self, gone: asyncio.Event) -> bool:
        """Wait for the next release (``hang_max`` at most); True when the client left first."""
        self._stats["held"] += 1
        waits = (asyncio.ensure_future(self._release.wait()), asyncio.ensure_future(gone.wait()))
        try:
            await asyncio.wait(
                waits, timeout=self.profile.hang_max, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            self._stats["held"] -= 1
            for waiting in waits:
                waiting.cancel()
        return gone.is_set()

    def close(self) -> None:
        """End hanging and stalled handlers at once (call on the server's loop)."""
        self._closing = True
        for event in list(self._gone):
            event.set()

    # -- ASGI entry ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send, self.on_startup)
            return
        if scope["type"] != "http":
            return
        rid = "req_" + uuid.uuid4().hex[:24]
        self._stats["requests"] += 1
        body = await read_body(receive)
        if body is None:
            return
        path, method = scope["path"], scope["method"]
        headers = request_headers(scope)
        if path.startswith("/_sim/"):
            await self._sim_route(path, method, send, rid, body)
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
                "request_id": rid,
                "received": time.monotonic(),  # orders records across simulators
            }
        )
        if id_header := headers.get("x-sim-request-id-header"):
            send = _renamed_id_header(send, id_header.lower().encode("latin-1"))
        auth = headers.get("authorization", "")
        if path == "/v1/messages" and method == "POST":
            self._stats["chat_requests"] += 1
            await self.anthropic.handle(scope, body, receive, send, rid)
        elif (not auth.startswith("Bearer ") or not auth[7:].strip()) and not (
            path == "/v1/models" and headers.get("x-api-key")  # Anthropic's way, as it lists
        ):
            msg = "You didn't provide an API key (Authorization: Bearer <key>)."
            body401 = error_body(msg, "invalid_request_error", "invalid_api_key")
            await respond(send, 401, body401, rid)
        elif path == "/v1/chat/completions" and method == "POST":
            await self._counted("chat_requests", self._chat, payload, headers, receive, send, rid)
        elif path == "/v1/responses" and method == "POST":
            handle = self._responses
            await self._counted("responses_requests", handle, payload, headers, receive, send, rid)
        elif path == "/v1/completions" and method == "POST":
            if not await self._status_fault(headers, send, rid):
                await self._text_completion(payload, send, rid)
        elif path == "/v1/embeddings" and method == "POST":
            if not await self._status_fault(headers, send, rid):
                await self._embeddings(payload, send, rid)
        elif path.startswith("/v1/models/") and method == "GET":
            model = path[len("/v1/models/") :]
            if model in self.models:
                body = json.dumps(_reply.model_object(model)).encode()
                await respond(send, 200, body, rid)
            else:
                msg = f"The model '{model}' does not exist"
                error = error_body(msg, "invalid_request_error", "model_not_found")
                await respond(send, 404, error, rid)
        elif path == "/v1/models" and method == "GET":
            created = 1_700_000_000
            listed = self.profile.listed_models
            data = [
                {"id": m, "object": "model", "created": created, "owned_by": "llmroute-sim"}
                for m in (self.models if listed is None else listed)
            ]
            await respond(send, 200, json.dumps({"object": "list", "data": data}).encode(), rid)
        else:
            msg = f"Invalid URL ({method} {path})"
            await respond(send, 404, error_body(msg, "invalid_request_error"), rid)

    async def _sim_route(
        self, path: str, method: str, send: Send, rid: str, body: bytes = b""
    ) -> None:
        if path == "/_sim/stats":
            await respond(send, 200, json.dumps(self.stats()).encode(), rid)
        elif path == "/_sim/release" and method == "POST":
            held = self.release()
            await respond(send, 200, json.dumps({"released": held}).encode(), rid)
        elif path == "/_sim/reset" and method == "POST":
            self.reset_stats()
            await respond(send, 200, b"{}", rid)
        elif path == "/_sim/profile" and method == "POST":
            # A provider that changes mid-run (benchmarks): the given Profile fields, replaced.
            try:
                fields = json.loads(body)
                for key in ("stall_range",):
                    if key in fields:
                        fields[key] = tuple(fields[key])
                self.profile = dataclasses.replace(self.profile, **fields)
            except (ValueError, TypeError) as exc:
                error = error_body(f"bad profile change: {exc}", "invalid_request_error")
                await respond(send, 400, error, rid)
                return
            await respond(send, 200, b"{}", rid)
        else:
            await respond(send, 404, error_body("not found", "invalid_request_error"), rid)

    async def _counted(
        self,
        kind: str,
        handle: Callable[[Any, dict[str, str], Receive, Send, str], Awaitable[None]],
        req: Any,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        rid: str,
    ) -> None:
        """``handle`` one request, counted under ``kind`` and in flight while it runs."""
        self._stats[kind] += 1
        self._enter()
        try:
            await handle(req, headers, receive, send, rid)
        finally:
            self._stats["in_flight"] -= 1

    # -- chat completions ---------------------------------------------------------------------
    async def _chat(
        self, req: Any, headers: dict[str, str], receive: Receive, send: Send, rid: str
    ) -> None:
        problem = _validate(req)
        if problem is not None:
            await respond(send, 400, error_body(problem, "invalid_request_error"), rid)
            return
        refusal = _vendor_refusal(self.profile, req)
        if refusal is not None:
            self._count_fault(f"refused-{refusal[0]}")
            await respond(send, refusal[0], refusal[1], rid)
            return
        room = req.get("max_completion_tokens", req.get("max_tokens"))
        if await self._too_long(headers, _reply.prompt_tokens(req["messages"]), room, send, rid):
            return
        fault = await self._fault(headers, send, rid)
        if fault is None:
            return
        model: str = req["model"]
        messages: list[dict[str, Any]] = req["messages"]
        self.models.setdefault(model)
        profile = self.profile
        plan = _Reply.build(
            req,
            model,
            messages,
            profile.reply_tokens,
            profile.token_bytes,
            echo=profile.echo_prefix,
            echo_counted=profile.echo_counted,
            reasoning=_reasoning_words(profile, req),
        )
        if profile.prompt_cache:
            plan.cache = profile.prompt_cache
            plan.cached = self._prompt_cache.read(model, messages)
        options = req.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        wire = _ChatStream(plan, include_usage, continuous) if req.get("stream") else None
        await self._serve(
            plan.pieces, plan.prompt_tokens, wire, plan.completion, fault, receive, send, rid
        )

    async def _too_long(
        self,
        headers: dict[str, str],
        prompt: int,
        room: Any,
        send: Send,
        rid: str,
        *,
        responses: bool = False,
    ) -> bool:
        """Answer OpenAI's 400 ``context_length_exceeded`` when the request does not fit the
        context window; whether it was answered so."""
        try:
            over = over_window(self.profile.context_window, headers, prompt, room)
        except ValueError as exc:
            await respond(send, 400, error_body(str(exc), "invalid_request_error"), rid)
            return True
        if over is None:
            return False
        window, asked = over
        self._count_fault("context-window")
        if responses:
            message = (
                f"Your input exceeds the context window of this model ({window} tokens, "
                f"{asked} asked for). Please adjust your input and try again. (simulated)"
            )
            param = "input"
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {asked} tokens ({prompt} in the messages, {asked - prompt} in the "
                "completion). Please reduce the length of the messages or completion. (simulated)"
            )
            param = "messages"
        body = error_body(message, "invalid_request_error", "context_length_exceeded", param)
        await respond(send, 400, body, rid)
        return True

    async def _fault(self, headers: dict[str, str], send: Send, rid: str) -> Fault | None:
        """The request's fault (``x-sim-fault`` or drawn from the profile), counted; None when
        the request is already answered (a status fault, or a malformed fault header)."""
        try:
            fault = requested_fault(headers, self.rng, self._fault_uses, self._random_fault)
            retry_after = float(headers.get("x-sim-retry-after", self.profile.retry_after))
        except ValueError as exc:
            await respond(send, 400, error_body(str(exc), "invalid_request_error"), rid)
            return None
        if fault.kind in STATUS_FAULTS:
            self._count_fault(fault.kind)
            key = headers.get("authorization", "").removeprefix("Bearer ").strip()
            await status_fault(send, fault.kind, retry_after, rid, key)
            return None
        if fault.slow is not None:
            self._count_fault("slow")
        if fault.stall_after is not None:
            self._count_fault("stall-between")
        if fault.kind is not None:
            self._count_fault(fault.kind)
        return fault

    async def _status_fault(self, headers: dict[str, str], send: Send, rid: str) -> bool:
        """For legacy completions and embeddings, which have no latency or stream faults: a
        status fault the request's ``x-sim-fault`` header names, answered; whether it was
        (the profile's drawn faults never hit these endpoints)."""
        spec = headers.get("x-sim-fault")
        try:
            kind = Fault.parse(spec, self.rng).kind if spec else None
        except ValueError:  # answered as a 400 by _fault, as on every endpoint
            return await self._fault(headers, send, rid) is None
        if kind not in STATUS_FAULTS:
            return False
        return await self._fault(headers, send, rid) is None

    async def _serve(
        self,
        pieces: list[str],
        prompt_tokens: int,
        wire: _Wire | None,
        whole: Callable[[], dict[str, Any]],
        fault: Fault,
        receive: Receive,
        send: Send,
        rid: str,
    ) -> None:
        """Answer after the TTFT: streamed through ``wire``, or ``whole()`` as one JSON body."""
        ttft = fault.slow
        if ttft is None:
            ttft = self.profile.sample_ttft(self.rng, prompt_tokens)
        self._stats["prompt_tokens"] += prompt_tokens  # what a vendor bills once it prefills
        gone = asyncio.Event()
        self._gone.add(gone)
        watcher = asyncio.ensure_future(watch_disconnect(receive, gone))
        try:
            if wire is not None:
                await self._stream(wire, pieces, fault, ttft, gone, send, rid)
            else:
                await self._complete(len(pieces), whole, fault, ttft, gone, send, rid)
        finally:
            watcher.cancel()
            self._gone.discard(gone)

    # -- the Responses API ----------------------------------------------------------------------
    async def _responses(
        self, req: Any, headers: dict[str, str], receive: Receive, send: Send, rid: str
    ) -> None:
        problem = _responses.validate(req)
        if problem is not None:
            message, param = problem
            body = error_body(message, "invalid_request_error", None, param)
            await respond(send, 400, body, rid)
            return
        prior = req.get("previous_response_id")
        if prior is not None and prior not in self.issued:
            msg = f"Previous response with id '{prior}' not found."
            code = "previous_response_not_found"
            body = error_body(msg, "invalid_request_error", code, "previous_response_id")
            await respond(send, 404, body, rid)
            return
        plan = _responses.ResponsePlan.build(req, self.profile.reply_tokens)
        room = req.get("max_output_tokens")
        if await self._too_long(headers, plan.input_tokens, room, send, rid, responses=True):
            return
        fault = await self._fault(headers, send, rid)
        if fault is None:
            return
        self.models.setdefault(req["model"])
        if req.get("store", True) is not False:
            self.issued.add(plan.id)
        wire = _ResponsesStream(plan) if req.get("stream") else None

        def whole() -> dict[str, Any]:
            return plan.response(plan.status)

        await self._serve(plan.pieces, plan.input_tokens, wire, whole, fault, receive, send, rid)

    # -- legacy completions and embeddings (status faults only, no latency) ---------------------
    async def _text_completion(self, req: Any, send: Send, rid: str) -> None:
        problem = _validate_other(req, "prompt")
        if problem is not None:
            await respond(send, 400, error_body(problem, "invalid_request_error"), rid)
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
            await respond(send, 200, json.dumps(body).encode(), rid)
            return
        await self._start_stream(send, rid)
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
        if problem is None and dims is not None and dims > _reply.MAX_EMBEDDING_DIMENSIONS:
            problem = f"'dimensions' must be at most {_reply.MAX_EMBEDDING_DIMENSIONS}"
        if problem is not None:
            await respond(send, 400, error_body(problem, "invalid_request_error"), rid)
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
        await respond(send, 200, json.dumps(body).encode(), rid)

    async def _start_stream(self, send: Send, rid: str) -> None:
        """Open a 200 event stream (the response's head) and count it as started."""
        await open_event_stream(send, rid, b"x-request-id")
        self._stats["streams_started"] += 1

    def _random_fault(self) -> Fault:
        kind = self.profile.sample_fault(self.rng)
        return Fault(kind=kind, after=self.profile.fault_after)

    def _ended_early(self) -> None:
        if not self._closing:
            self._stats["streams_cancelled"] += 1

    async def _stream(
        self,
        wire: _Wire,
        pieces: list[str],
        fault: Fault,
        ttft: float,
        gone: asyncio.Event,
        send: Send,
        rid: str,
    ) -> None:
        await self._start_stream(send, rid)

        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        for frame in wire.opening():
            await emit(frame)
        if self.profile.hold_first_token and await self._hold(gone):
            return self._ended_early()
        if await pause(ttft, gone):
            return self._ended_early()
        if fault.kind == "hang":
            if await pause(self.profile.hang_max, gone):
                return self._ended_early()
            return None  # hang bound passed: the stream breaks (h2 reset, h1 close)
        for frame in wire.first():
            await emit(frame)
        tokens, per = len(pieces), max(1, self.profile.tokens_per_chunk)
        pieces = _reply.group(pieces, self.profile.tokens_per_chunk)
        for i in range(len(pieces) + 1):
            if fault.kind in TAIL_FAULTS and i == min(fault.after, len(pieces)):
                if fault.kind == "truncate":  # a clean end, without the answer's end events
                    await send({"type": "http.response.body", "body": b""})
                    return None
                if fault.kind == "oversized":
                    await self._oversized(emit, int(fault.amount))
                elif await self._trickle(emit, wire.piece("slow"), fault.amount, gone):
                    return self._ended_early()
                else:
                    return None  # the hang bound passed: the stream breaks
            if fault.kind in STREAM_FAULTS and i == min(fault.after, len(pieces)):
                if fault.kind == "drop":
                    return None  # no end of stream: the server resets it / closes
                if fault.kind == "stream-error":
                    await send({"type": "http.response.body", "body": wire.error()})
                    return None
                await emit(wire.malformed())
            if i == len(pieces):
                break
            if await pace(i, fault, self.profile.inter_token, gone):
                return self._ended_early()
            await emit(wire.piece(pieces[i]))
            self._stats["tokens_streamed"] += min(per, tokens - i * per)
        closing = wire.closing()
        if self.profile.frame_per_event:  # each event in a frame of its own, the last ones too
            closing = [e + b"\n\n" for part in closing for e in part.split(b"\n\n") if e]
        if gone.is_set():
            return self._ended_early()
        self._stats["streams_completed"] += 1  # counted first: the client may look at once
        for frame in closing[:-1]:
            await emit(frame)
        await send({"type": "http.response.body", "body": closing[-1]})
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
            if await pause(every, gone):
                return True
        return False  # pragma: no cover - the loop only ends by returning

    async def _complete(
        self,
        n_pieces: int,
        whole: Callable[[], dict[str, Any]],
        fault: Fault,
        ttft: float,
        gone: asyncio.Event,
        send: Send,
        rid: str,
    ) -> None:
        if await wait_whole(ttft, n_pieces, fault, self.profile, gone):
            return None  # client gone, or the hang bound passed: no response at all
        if fault.kind == "stream-error":
            body = error_body(
                "The server had an error while processing your request.", "server_error"
            )
            await respond(send, 500, body, rid)
            return None
        await send_whole(send, json.dumps(whole()).encode(), rid, fault, b"x-request-id")
        return None


def _renamed_id_header(send: Send, name: bytes) -> Send:
    """``send`` with the response's request-id header renamed to ``name``: a vendor that names
    its request id otherwise (the request header ``x-sim-request-id-header``)."""

    async def renamed(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {
                **message,
                "headers": [
                    (name if key in (b"x-request-id", b"request-id") else key, value)
                    for key, value in message["headers"]
                ],
            }
        await send(message)

    return renamed
