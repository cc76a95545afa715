"""The simulator's Anthropic wire mode: ``POST /v1/messages`` as Anthropic's API answers it.

:class:`AnthropicSimApp` is a raw ASGI app, served like :class:`~llmroute.testing._app.SimApp`
(hypercorn over TLS/HTTP2, or ``httpx.ASGITransport`` in a test); an app that has read the
request body already hands the request on with :meth:`AnthropicSimApp.handle`. It needs
``x-api-key`` and ``anthropic-version`` headers, validates the body as the Messages API does
(``max_tokens`` required), and answers deterministically from the prompt (``_reply``'s words):
text, or a ``tool_use`` block when tools are given (``tool_choice`` ``none`` disables them, a
``tool`` choice picks one). A trailing assistant message is a prefill: the reply continues it.
``stop_sequences`` cut the reply (``stop_reason: "stop_sequence"``), ``max_tokens`` too
(``"max_tokens"``). Prompt caching is simulated: the prompt up to the last ``cache_control``
block is written to the cache the first time (``cache_creation_input_tokens``) and read after
(``cache_read_input_tokens``).

Streams have Anthropic's exact event sequence: ``message_start``, ``content_block_start``,
``ping``, ``content_block_delta`` per token, ``content_block_stop``, ``message_delta`` (stop
reason, usage), ``message_stop``. Errors have Anthropic's shape,
``{"type": "error", "error": {"type": ..., "message": ...}}``, and a ``request-id`` header.

Faults, header ``x-sim-fault`` as for the OpenAI simulator: ``429`` (rate_limit_error with
retry-after), ``500`` (api_error), ``503`` (529 overloaded_error, Anthropic's overload status),
``html502``, ``drop:K``, ``hang``, ``malformed:K``, ``stream-error:K`` (an in-stream
``event: error`` with ``overloaded_error`` after K tokens; non-streamed: a 529), ``slow:S``,
``stall-between:K:S``; ``x-sim-fault-times`` / ``x-sim-fault-key`` / ``x-sim-retry-after`` too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llmroute.testing._reply as _reply

from ._profile import Profile
from ._stream import StreamMode, stream_answer
from ._wire import (
    HTML_502,
    STATUS_FAULTS,
    Fault,
    Receive,
    Scope,
    Send,
    answer_whole,
    over_window,
    read_body,
    request_headers,
    requested_fault,
    respond,
    serve_lifespan,
    watching,
)

__all__ = ["AnthropicSimApp", "anthropic_app"]

_OVERLOADED = "Overloaded"
_MODE = StreamMode(id_header=b"request-id")  # no tail faults, no hold, no tokens_streamed


def anthropic_app(profile: Profile | None = None, *, seed: int | None = None) -> AnthropicSimApp:
    """A simulated Anthropic Messages API as an ASGI app (mount it at the server's root)."""
    return AnthropicSimApp(profile or Profile(), seed=seed)


def error_body(type_: str, message: str) -> bytes:
    """An error in Anthropic's format."""
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}}).encode()


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class AnthropicSimApp:
    """ASGI app of one simulated Anthropic provider."""

    def __init__(
        self,
        profile: Profile,
        *,
        seed: int | None = None,
        stats: Callable[[], dict[str, Any]] | None = None,
        closing: Callable[[], bool] | None = None,
        fault_uses: dict[str, int] | None = None,
    ) -> None:
        """``stats`` gives the counters to update (a mounting app's shared ``stats()`` dict:
        ``in_flight``, ``streams_started``/``completed``/``cancelled``); ``closing`` says the
        server is shutting down, when a stream that ends early is not counted as cancelled;
        ``fault_uses`` is the mounting app's count of ``x-sim-fault-key`` uses, so that
        ``x-sim-fault-times`` counts the requests of both wire modes."""
        self.profile = profile
        self.rng = random.Random(profile.seed if seed is None else seed)
        self.requests: list[dict[str, Any]] = []
        self._cached: set[str] = set()
        self._fault_uses: dict[str, int] = {} if fault_uses is None else fault_uses
        self._own_stats: dict[str, Any] = {
            "in_flight": 0,
            "streams_started": 0,
            "streams_completed": 0,
            "streams_cancelled": 0,
        }
        self._stats = stats or (lambda: self._own_stats)
        self._closing = closing or (lambda: False)

    def count(self, key: str, step: int = 1) -> None:
        """Add ``step`` to the counter ``key``."""
        stats = self._stats()
        stats[key] = stats.get(key, 0) + step

    def ended_early(self) -> None:
        """A stream ended before its end: counted as cancelled unless the server is closing."""
        if not self._closing():
            self.count("streams_cancelled")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if body is not None:
            await self.handle(scope, body, receive, send)

    async def handle(
        self, scope: Scope, body: bytes, receive: Receive, send: Send, rid: str | None = None
    ) -> None:
        """Answer one HTTP request whose body was already read (for mounting in another app,
        which may give the request's id)."""
        rid = rid or "req_" + uuid.uuid4().hex[:24]
        headers = request_headers(scope)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        self.requests.append(
            {"path": scope["path"], "headers": headers, "json": payload, "request_id": rid}
        )
        if not headers.get("x-api-key", "").strip():
            msg = "x-api-key header is required"
            await _respond(send, 401, error_body("authentication_error", msg), rid)
        elif scope["path"] != "/v1/messages" or scope["method"] != "POST":
            msg = f"Not found: {scope['method']} {scope['path']}"
            await _respond(send, 404, error_body("not_found_error", msg), rid)
        elif not headers.get("anthropic-version"):
            msg = "anthropic-version: header is required"
            await _respond(send, 400, error_body("invalid_request_error", msg), rid)
        else:
            await self._messages(payload, headers, receive, send, rid)

    async def _messages(
        self, req: Any, headers: dict[str, str], receive: Receive, send: Send, rid: str
    ) -> None:
        problem = _validate(req)
        fault, retry_after = Fault(), self.profile.retry_after
        if problem is None:
            try:
                fault = requested_fault(headers, self.rng, self._fault_uses)
                retry_after = float(headers.get("x-sim-retry-after", self.profile.retry_after))
            except ValueError as exc:
                problem = str(exc)
        over = None
        if problem is None:
            try:
                over = over_window(
                    self.profile.context_window, headers, _prompt_tokens(req), req["max_tokens"]
                )
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            await _respond(send, 400, error_body("invalid_request_error", problem), rid)
            return
        if over is not None:
            window, asked = over
            prompt = _prompt_tokens(req)
            if prompt > window:
                msg = f"prompt is too long: {prompt} tokens > {window} maximum (simulated)"
            else:
                msg = (
                    f"input length and `max_tokens` exceed context limit: {prompt} + "
                    f"{asked - prompt} > {window}, decrease input length or `max_tokens` and "
                    "try again (simulated)"
                )
            await _respond(send, 400, error_body("invalid_request_error", msg), rid)
            return
        if fault.kind in STATUS_FAULTS:
            await _status_fault(send, fault.kind, retry_after, rid)
            return
        plan = _AnthropicReply.build(req, self._cached, self.profile.reply_tokens)
        ttft = fault.slow
        if ttft is None:
            ttft = self.profile.sample_ttft(self.rng, plan.input_tokens)
        async with watching(receive) as gone:
            self.count("in_flight")
            try:
                await self._answer(plan, bool(req.get("stream")), fault, ttft, gone, send, rid)
            finally:
                self.count("in_flight", -1)

    async def _answer(
        self,
        plan: _AnthropicReply,
        stream: bool,
        fault: Fault,
        ttft: float,
        gone: asyncio.Event,
        send: Send,
        rid: str,
    ) -> None:
        if not stream:
            await answer_whole(
                lambda: json.dumps(plan.message()).encode(),
                len(plan.pieces),
                fault,
                ttft,
                self.profile,
                gone,
                send,
                rid,
                id_header=b"request-id",
                error=(529, error_body("overloaded_error", _OVERLOADED)),
            )
            return
        wire = _AnthropicStream(plan)
        await stream_answer(
            wire,
            plan.pieces,
            fault,
            ttft,
            gone,
            send,
            rid,
            mode=_MODE,
            tally=self,
            profile=lambda: self.profile,
        )


def _prompt_tokens(req: dict[str, Any]) -> int:
    """The simulator's count of a Messages request's prompt (its system text included)."""
    system = _text(req.get("system"))
    messages = [
        {"role": m.get("role"), "content": _text(m.get("content"))} for m in req["messages"]
    ]
    return _reply.prompt_tokens(
        ([{"role": "system", "content": system}] if system else []) + messages
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, dict):
                text = block.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    return ""


def _words(content: Any) -> int:
    return len(_text(content).split())


def _cache_prefix(req: dict[str, Any]) -> tuple[str, int] | None:
    """The prompt up to its last ``cache_control`` block: a key and its token count."""
    units: list[tuple[Any, bool]] = []
    system = req.get("system")
    if isinstance(system, list):
        units += [(b, "cache_control" in b) for b in system if isinstance(b, dict)]
    elif system:
        units.append((system, False))
    for message in req["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            units += [(b, "cache_control" in b) for b in content if isinstance(b, dict)]
        else:
            units.append((content, False))
    marks = [i for i, (_, marked) in enumerate(units) if marked]
    if not marks:
        return None
    prefix = [u for u, _ in units[: marks[-1] + 1]]
    key = hashlib.sha256(json.dumps([req["model"], prefix], sort_keys=True).encode()).hexdigest()
    return key, sum(_words(u if isinstance(u, str) else [u]) for u in prefix)


def _one_hour(req: dict[str, Any]) -> bool:
    """Whether the request's last ``cache_control`` asks for the 1-hour cache (``ttl``)."""
    blocks = [req.get("system")] + [m.get("content") for m in req["messages"]]
    marks = [
        b["cache_control"]
        for content in blocks
        if isinstance(content, list)
        for b in content
        if isinstance(b, dict) and isinstance(b.get("cache_control"), dict)
    ]
    return bool(marks) and marks[-1].get("ttl") == "1h"


@dataclass
class _AnthropicReply:
    model: str
    seed: int
    input_tokens: int
    cache_creation: int
    cache_read: int
    pieces: list[str]
    stop_reason: str
    stop_sequence: str | None = None
    tool: dict[str, Any] | None = None
    one_hour: bool = False
    """The cache write is to the 1-hour cache (``cache_control.ttl = "1h"``)."""

    @classmethod
    def build(cls, req: dict[str, Any], cached: set[str], reply_tokens: int) -> _AnthropicReply:
        model: str = req["model"]
        messages: list[dict[str, Any]] = [
            {"role": m.get("role"), "content": _text(m.get("content"))} for m in req["messages"]
        ]
        system = _text(req.get("system"))
        prompt = ([{"role": "system", "content": system}] if system else []) + messages
        seed = _reply.reply_seed(model, prompt)
        total = _reply.prompt_tokens(prompt)
        creation = read = 0
        prefix = _cache_prefix(req)
        if prefix is not None:
            key, n = prefix
            n = min(n, total)
            if key in cached:
                read = n
            else:
                creation = n
                cached.add(key)
        input_tokens = total - creation - read
        tools = [
            {"type": "function", "function": {**t, "parameters": t.get("input_schema")}}
            for t in req.get("tools") or []
        ]
        choice = req.get("tool_choice") or {}
        openai_choice: Any = None
        if choice.get("type") == "none":
            openai_choice = "none"
        elif choice.get("type") == "tool":
            openai_choice = {"type": "function", "function": {"name": choice.get("name")}}
        tool = _reply.pick_tool(tools, openai_choice)
        if tool is not None:
            pieces = _reply.split_fragments(_reply.tool_arguments(tool, seed))
            plan = cls(model, seed, input_tokens, creation, read, pieces, "tool_use", None, tool)
            plan.one_hour = _one_hour(req)
            return plan
        full = _reply.full_reply(seed, reply_tokens)
        _, prefill = _reply.split_prefill(messages)
        pieces = list(full)
        if prefill is not None:
            rest = _reply.continue_after(full, prefill)
            if rest is not None:
                pieces = rest
        stop_reason, stop_sequence = "end_turn", None
        stops = [s for s in req.get("stop_sequences") or [] if isinstance(s, str) and s]
        if stops:
            text = ""
            for i, piece in enumerate(pieces):
                text += piece
                hit = [s for s in stops if s in text]
                if hit:
                    stop_sequence = min(hit, key=text.find)
                    cut = text.find(stop_sequence) - (len(text) - len(piece))
                    pieces = pieces[:i] + ([piece[:cut]] if cut > 0 else [])
                    stop_reason = "stop_sequence"
                    break
        if len(pieces) > req["max_tokens"]:
            pieces, stop_reason, stop_sequence = pieces[: req["max_tokens"]], "max_tokens", None
        plan = cls(model, seed, input_tokens, creation, read, pieces, stop_reason, stop_sequence)
        plan.one_hour = _one_hour(req)
        return plan

    def block_start(self) -> dict[str, Any]:
        if self.tool is None:
            return {"type": "text", "text": ""}
        return {"type": "tool_use", "id": self.tool_id, "name": self.tool.get("name"), "input": {}}

    @property
    def tool_id(self) -> str:
        return f"toolu_{self.seed:016x}"

    def message(
        self,
        *,
        content: list[dict[str, Any]] | None = None,
        stop_reason: str | None = "",
        output_tokens: int | None = None,
    ) -> dict[str, Any]:
        if content is None:
            if self.tool is None:
                content = [{"type": "text", "text": "".join(self.pieces)}]
            else:
                block = self.block_start()
                block["input"] = json.loads("".join(self.pieces))
                content = [block]
        final = stop_reason == ""
        return {
            "id": f"msg_{self.seed:016x}{random.getrandbits(32):08x}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason if final else stop_reason,
            "stop_sequence": self.stop_sequence if final else None,
            "usage": {
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": self.cache_creation,
                "cache_read_input_tokens": self.cache_read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 0 if self.one_hour else self.cache_creation,
                    "ephemeral_1h_input_tokens": self.cache_creation if self.one_hour else 0,
                },
                "output_tokens": len(self.pieces) if output_tokens is None else output_tokens,
            },
        }


class _AnthropicStream:
    """Messages API events (a ``_Wire``): ``message_start``, ``content_block_start`` and
    ``ping`` in the first frame, a ``content_block_delta`` a frame, and the closing events in
    the last one."""

    def __init__(self, plan: _AnthropicReply) -> None:
        self.plan = plan

    def opening(self) -> list[bytes]:
        return []

    def first(self) -> list[bytes]:
        plan = self.plan
        message = plan.message(content=[], stop_reason=None, output_tokens=1)
        head = _sse("message_start", {"type": "message_start", "message": message})
        head += _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": plan.block_start()},
        )
        return [head + _sse("ping", {"type": "ping"})]

    def piece(self, text: str) -> bytes:
        if self.plan.tool is not None:
            delta = {"type": "input_json_delta", "partial_json": text}
        else:
            delta = {"type": "text_delta", "text": text}
        return _sse(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    def error(self) -> bytes:
        err = {"type": "error", "error": {"type": "overloaded_error"}}
        err["error"]["message"] = _OVERLOADED
        return _sse("error", err)

    def malformed(self) -> bytes:
        return b"event: content_block_delta\ndata: {not json\n\n"

    def closing(self) -> list[bytes]:
        plan = self.plan
        tail = _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        tail += _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": plan.stop_reason, "stop_sequence": plan.stop_sequence},
                "usage": {"output_tokens": len(plan.pieces)},
            },
        )
        return [tail + _sse("message_stop", {"type": "message_stop"})]


def _validate(req: Any) -> str | None:
    if not isinstance(req, dict):
        return "The request body must be a JSON object."
    if not isinstance(req.get("model"), str) or not req["model"]:
        return "model: Field required"
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
    max_tokens = req.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required"
    for key in ("n", "logprobs", "stream_options", "frequency_penalty", "presence_penalty"):
        if key in req:
            return f"{key}: Extra inputs are not permitted"
    return None


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    rid: str,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """The OpenAI simulator's response, with Anthropic's ``request-id`` header."""
    await respond(send, status, body, rid, content_type, extra, id_header=b"request-id")


async def _status_fault(send: Send, kind: str, retry_after: float, rid: str) -> None:
    retry = [(b"retry-after", str(max(0, math.ceil(retry_after))).encode())]
    if kind == "429":
        msg = "Number of request tokens has exceeded your per-minute rate limit (simulated)"
        await _respond(send, 429, error_body("rate_limit_error", msg), rid, extra=retry)
    elif kind == "500":
        await _respond(send, 500, error_body("api_error", "Internal server error"), rid)
    elif kind == "503":
        await _respond(send, 529, error_body("overloaded_error", _OVERLOADED), rid, extra=retry)
    elif kind in _REQUEST_ERRORS:
        status, type_, msg = _REQUEST_ERRORS[kind]
        await _respond(send, status, error_body(type_, msg), rid)
    else:
        await _respond(send, 502, HTML_502, rid, content_type=b"text/html")


_REQUEST_ERRORS = {
    "400": (400, "invalid_request_error", "temperature: Input should be a number (simulated)"),
    "context-length": (
        400,
        "invalid_request_error",
        "prompt is too long: 210000 tokens > 200000 maximum (simulated)",
    ),
    "content-policy": (
        400,
        "invalid_request_error",
        "Output blocked by content filtering policy (simulated)",
    ),
    "401": (401, "authentication_error", "invalid x-api-key (simulated)"),
    "403": (403, "permission_error", "Your API key does not have permission (simulated)"),
    "404": (404, "not_found_error", "model: sim-x (simulated)"),
}
