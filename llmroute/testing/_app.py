"""The simulator's raw ASGI app: OpenAI chat completions and Responses with latency and faults.

:class:`SimApp` routes a request; its parts live beside it: the counters (:mod:`._counters`),
the fault decisions (:mod:`._faults`), the streamed answer (:mod:`._stream`, shared with the
Anthropic wire mode), legacy completions and embeddings (:mod:`._legacy`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
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
from ._counters import SimCounters
from ._faults import FaultDecisions
from ._legacy import embeddings, text_completion
from ._profile import Profile
from ._requests import _reasoning_words, _validate, _vendor_refusal
from ._stream import StreamMode, stream_answer
from ._wire import (
    Fault,
    Receive,
    Scope,
    Send,
    answer_whole,
    error_body,
    read_body,
    request_headers,
    respond,
    serve_lifespan,
    watching,
)

_SERVER_ERROR = (
    500,
    error_body("The server had an error while processing your request.", "server_error"),
)  # a stream-error fault's answer when not streamed
_MODE = StreamMode(
    id_header=b"x-request-id", tail_faults=True, count_tokens=True, frame_per_event=True
)


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
        self.counters = SimCounters()
        self.issued = _responses.IssuedIds()
        """The ids of responses this simulator issued (``previous_response_id`` must be one)."""
        fault_uses: dict[str, int] = {}  # x-sim-fault-times counts both wire modes' requests
        self.faults = FaultDecisions(lambda: self.profile, self.rng, self.counters, fault_uses)
        self._prompt_cache = PromptCache()
        # the same server speaks Anthropic's Messages API
        self.anthropic = AnthropicSimApp(
            profile,
            seed=seed,
            stats=lambda: self.counters.values,
            closing=lambda: self.counters.closing,
            fault_uses=fault_uses,
        )

    # -- counters ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters."""
        return self.counters.snapshot()

    def reset_stats(self) -> None:
        """Zero the counters (in_flight and held are kept) and forget recorded requests."""
        self.counters.reset()
        self.last_requests.clear()

    def release(self) -> int:
        """Let every stream held before its first token go on (``Profile.hold_first_token``);
        streams that come later are held until the next release. Returns how many were held.
        Call on the server's loop."""
        return self.counters.release()

    def close(self) -> None:
        """End hanging and stalled handlers at once (call on the server's loop)."""
        self.counters.close()

    # -- ASGI entry ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send, self.on_startup)
            return
        if scope["type"] != "http":
            return
        rid = "req_" + uuid.uuid4().hex[:24]
        self.counters.count("requests")
        body = await read_body(receive)
        if body is None:
            return
        path, method = scope["path"], scope["method"]
        headers = request_headers(scope)
        if path.startswith("/_sim/"):
            await self._sim_route(path, method, send, rid, body)
            return
        payload = self._record(scope, headers, body, rid)
        if id_header := headers.get("x-sim-request-id-header"):
            send = _renamed_id_header(send, id_header.lower().encode("latin-1"))
        if path == "/v1/messages" and method == "POST":
            self.counters.count("chat_requests")
            await self.anthropic.handle(scope, body, receive, send, rid)
        elif not _authorized(path, headers):
            msg = "You didn't provide an API key (Authorization: Bearer <key>)."
            body401 = error_body(msg, "invalid_request_error", "invalid_api_key")
            await respond(send, 401, body401, rid)
        else:
            await self._route(path, method, payload, headers, receive, send, rid)

    def _record(self, scope: Scope, headers: dict[str, str], body: bytes, rid: str) -> Any:
        """Remember the request in ``last_requests``; its JSON body (None when it has none)."""
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        self.last_requests.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "http_version": scope["http_version"],
                "headers": headers,
                "query": dict(parse_qsl(scope["query_string"].decode("latin-1"))),
                "json": payload,
                "request_id": rid,
                "received": time.monotonic(),  # orders records across simulators
            }
        )
        return payload

    async def _route(
        self,
        path: str,
        method: str,
        payload: Any,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        rid: str,
    ) -> None:
        if path == "/v1/chat/completions" and method == "POST":
            await self._counted("chat_requests", self._chat, payload, headers, receive, send, rid)
        elif path == "/v1/responses" and method == "POST":
            handle = self._responses
            await self._counted("responses_requests", handle, payload, headers, receive, send, rid)
        elif path == "/v1/completions" and method == "POST":
            if not await self.faults.status_only(headers, send, rid):
                await text_completion(
                    payload,
                    send,
                    rid,
                    profile=self.profile,
                    rng=self.rng,
                    models=self.models,
                    counters=self.counters,
                )
        elif path == "/v1/embeddings" and method == "POST":
            if not await self.faults.status_only(headers, send, rid):
                await embeddings(payload, send, rid, self.models)
        elif path.startswith("/v1/models/") and method == "GET":
            await self._model_card(path[len("/v1/models/") :], send, rid)
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

    async def _model_card(self, model: str, send: Send, rid: str) -> None:
        if model in self.models:
            body = json.dumps(_reply.model_object(model)).encode()
            await respond(send, 200, body, rid)
        else:
            msg = f"The model '{model}' does not exist"
            error = error_body(msg, "invalid_request_error", "model_not_found")
            await respond(send, 404, error, rid)

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
        with self.counters.in_flight(kind):
            await handle(req, headers, receive, send, rid)

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
            self.counters.count_fault(f"refused-{refusal[0]}")
            await respond(send, refusal[0], refusal[1], rid)
            return
        room = req.get("max_completion_tokens", req.get("max_tokens"))
        if await self.faults.too_long(
            headers, _reply.prompt_tokens(req["messages"]), room, send, rid
        ):
            return
        fault = await self.faults.fault(headers, send, rid)
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
        self.counters.count("prompt_tokens", prompt_tokens)  # what a vendor bills once it prefills
        async with watching(receive, self.counters.open) as gone:
            if wire is not None:
                await stream_answer(
                    wire,
                    pieces,
                    fault,
                    ttft,
                    gone,
                    send,
                    rid,
                    mode=_MODE,
                    tally=self.counters,
                    profile=lambda: self.profile,
                    hold=self._hold,
                )
            else:
                await answer_whole(
                    lambda: json.dumps(whole()).encode(),
                    len(pieces),
                    fault,
                    ttft,
                    self.profile,
                    gone,
                    send,
                    rid,
                    id_header=b"x-request-id",
                    error=_SERVER_ERROR,
                )

    async def _hold(self, gone: asyncio.Event) -> bool:
        """Wait for the next release (``hang_max`` at most); True when the client left first."""
        return await self.counters.hold(gone, self.profile.hang_max)

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
        if await self.faults.too_long(headers, plan.input_tokens, room, send, rid, responses=True):
            return
        fault = await self.faults.fault(headers, send, rid)
        if fault is None:
            return
        self.models.setdefault(req["model"])
        if req.get("store", True) is not False:
            self.issued.add(plan.id)
        wire = _ResponsesStream(plan) if req.get("stream") else None

        def whole() -> dict[str, Any]:
            return plan.response(plan.status)

        await self._serve(plan.pieces, plan.input_tokens, wire, whole, fault, receive, send, rid)


def _authorized(path: str, headers: dict[str, str]) -> bool:
    """Whether the request carries an API key: ``Authorization: Bearer``, or Anthropic's
    ``x-api-key`` as it lists models."""
    auth = headers.get("authorization", "")
    if auth.startswith("Bearer ") and auth[7:].strip():
        return True
    return path == "/v1/models" and bool(headers.get("x-api-key"))


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
