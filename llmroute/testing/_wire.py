"""ASGI plumbing and faults shared by the simulator's wire modes (OpenAI, Anthropic, SGLang).

The bottom of the simulator: it imports no other simulator module but :mod:`._profile`, so the
wire modes (``_app``, ``_anthropic``, ``_sglang``) import it and never one another in a circle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._profile import Profile

__all__ = [
    "HTML_502",
    "STATUS_FAULTS",
    "STREAM_FAULTS",
    "TAIL_FAULTS",
    "Fault",
    "Receive",
    "Scope",
    "Send",
    "answer_whole",
    "error_body",
    "open_event_stream",
    "pace",
    "pause",
    "read_body",
    "request_headers",
    "requested_fault",
    "respond",
    "send_whole",
    "serve_lifespan",
    "status_fault",
    "wait_whole",
    "watch_disconnect",
    "watching",
]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

STATUS_FAULTS = (
    "429",
    "500",
    "503",
    "html502",
    "400",
    "context-length",
    "content-policy",
    "401",
    "403",
    "404",
)
STREAM_FAULTS = ("drop", "malformed", "stream-error")
# Faults of the OpenAI wire mode only: a clean end without the end of the answer, a slow-loris
# trickle of one event, an event far larger than any real one.
TAIL_FAULTS = ("truncate", "loris", "oversized")
YIELD_EVERY = 8  # with zero delays, a stream gives the event loop a turn every this many chunks
HTML_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


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
    def parse(cls, spec: str, rng: random.Random | None = None) -> Fault:
        """Parse a comma-separated `x-sim-fault` value; ValueError when malformed. A stream
        fault's count may be a range, ``drop:1-39``: drawn per request with ``rng`` (the
        simulator's seeded one)."""
        fault = cls()
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, arg = item.partition(":")
            if name in STATUS_FAULTS or name == "hang":
                fault.kind = name
            elif name in STREAM_FAULTS:
                low, dash, high = (arg or "0").partition("-")
                fault.kind, fault.after = name, int(low)
                if dash:
                    fault.after = (rng or random.Random()).randint(int(low), int(high))
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


def requested_fault(
    headers: dict[str, str],
    rng: random.Random,
    uses: dict[str, int],
    otherwise: Callable[[], Fault] = Fault,
) -> Fault:
    """The fault header ``x-sim-fault`` names (``otherwise()`` without one), or none once its
    ``x-sim-fault-times`` uses are spent (counted in ``uses`` by ``x-sim-fault-key``, else by the
    header's value). A malformed header: ValueError."""
    spec = headers.get("x-sim-fault")
    if not spec:
        return otherwise()
    fault = Fault.parse(spec, rng)
    if "x-sim-fault-times" in headers:
        key = headers.get("x-sim-fault-key", spec)
        used = uses.get(key, 0)
        uses[key] = used + 1
        if used >= int(headers["x-sim-fault-times"]):
            return Fault()
    return fault


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    """An error in OpenAI's shape."""
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


def over_window(
    window: int, headers: dict[str, str], prompt_tokens: int, room: Any
) -> tuple[int, int] | None:
    """``(window, tokens asked for)`` when a request does not fit the context window (the
    profile's, or header ``x-sim-context-window``), else ``None``; ``room`` is the answer's
    ``max_tokens`` (anything not a positive integer counts 0). A bad header: ValueError."""
    raw = headers.get("x-sim-context-window")
    if raw is not None:
        window = int(raw)
    asked = prompt_tokens + (room if isinstance(room, int) and room > 0 else 0)
    return (window, asked) if 0 < window < asked else None


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def serve_lifespan(
    receive: Receive, send: Send, on_startup: Callable[[], None] | None = None
) -> None:
    """Answer an ASGI lifespan's startup (after ``on_startup()``) and its shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if on_startup is not None:
                on_startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client went away first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client goes away."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


@contextlib.asynccontextmanager
async def watching(
    receive: Receive, open_: set[asyncio.Event] | None = None
) -> AsyncIterator[asyncio.Event]:
    """An event set when the client goes away (:func:`watch_disconnect`) while the block runs;
    kept in ``open_`` meanwhile, where a closing server sets it too."""
    gone = asyncio.Event()
    if open_ is not None:
        open_.add(gone)
    watcher = asyncio.ensure_future(watch_disconnect(receive, gone))
    try:
        yield gone
    finally:
        watcher.cancel()
        if open_ is not None:
            open_.discard(gone)


async def pause(seconds: float, gone: asyncio.Event) -> bool:
    """Sleep unless the client goes away first; True when it did (or the server is closing)."""
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


async def pace(i: int, fault: Fault, inter_token: float, gone: asyncio.Event) -> bool:
    """Wait before a stream's piece ``i``: a stall fault's pause, else the inter-token time,
    else (with no delay at all) a turn of the event loop now and then. True when the client
    went away (or the server is closing)."""
    if fault.stall_after is not None and i == fault.stall_after and i > 0:
        return await pause(fault.stall_seconds, gone)
    if inter_token > 0 and i > 0:
        return await pause(inter_token, gone)
    if i % YIELD_EVERY == 1:
        await asyncio.sleep(0)
        return gone.is_set()
    return False


async def wait_whole(
    ttft: float, pieces: int, fault: Fault, profile: Profile, gone: asyncio.Event
) -> bool:
    """Wait as long as a non-streamed answer of ``pieces`` takes to generate (a ``hang``
    fault: the hang bound). True when no answer is due: the client went away, or it hangs."""
    delay = ttft + profile.inter_token * max(0, pieces - 1)
    if fault.stall_after is not None:
        delay += fault.stall_seconds
    if fault.kind == "hang":
        delay = profile.hang_max
    return await pause(delay, gone) or fault.kind == "hang"


async def open_event_stream(send: Send, rid: str, id_header: bytes) -> None:
    """Start a 200 answer that is an event stream (its head: the body follows in pieces)."""
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (id_header, rid.encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})


async def send_whole(send: Send, body: bytes, rid: str, fault: Fault, id_header: bytes) -> None:
    """A 200 JSON answer; under a ``malformed`` fault not JSON, under a ``drop`` fault only
    its first half, then the connection (or stream) breaks."""
    if fault.kind == "malformed":
        body = b"{not json"
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (id_header, rid.encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if fault.kind == "drop":
        half = body[: len(body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})
        return
    await send({"type": "http.response.body", "body": body})


async def answer_whole(
    body: Callable[[], bytes],
    pieces: int,
    fault: Fault,
    ttft: float,
    profile: Profile,
    gone: asyncio.Event,
    send: Send,
    rid: str,
    *,
    id_header: bytes,
    error: tuple[int, bytes],
) -> None:
    """A non-streamed answer of ``pieces``, ``body()``, once it is generated (see
    :func:`send_whole`); under a ``stream-error`` fault the ``error`` status and body instead;
    nothing at all when the client went away or a ``hang`` fault reached its bound."""
    if await wait_whole(ttft, pieces, fault, profile, gone):
        return
    if fault.kind == "stream-error":
        status, error_bytes = error
        await respond(send, status, error_bytes, rid, id_header=id_header)
        return
    await send_whole(send, body(), rid, fault, id_header)


async def respond(
    send: Send,
    status: int,
    body: bytes,
    rid: str,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
    id_header: bytes = b"x-request-id",
) -> None:
    """A whole response with a content-length and a request-id header."""
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (id_header, rid.encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def masked_key(key: str) -> str:
    """A key as OpenAI's 401 message echoes it: its first 8 characters, stars, its last 4."""
    if len(key) < 16:
        return "*" * len(key)
    return key[:8] + "*" * (len(key) - 12) + key[-4:]


async def status_fault(
    send: Send, kind: str, retry_after: float, rid: str, api_key: str = ""
) -> None:
    """Answer a status fault (429, 500, 503, html502) as OpenAI (or a proxy in front) does;
    a 401 names the masked ``api_key`` as OpenAI's does."""
    retry = [
        (b"retry-after", str(max(0, math.ceil(retry_after))).encode()),
        (b"retry-after-ms", str(max(0, round(retry_after * 1000))).encode()),
    ]
    if kind == "429":
        msg = "Rate limit reached for requests (simulated)."
        body = error_body(msg, "requests", "rate_limit_exceeded")
        await respond(send, 429, body, rid, extra=retry)
    elif kind == "500":
        msg = "The server had an error while processing your request."
        await respond(send, 500, error_body(msg, "server_error"), rid)
    elif kind == "503":
        msg = "The engine is currently overloaded, please try again later."
        await respond(send, 503, error_body(msg, "server_error", "overloaded"), rid, extra=retry)
    elif kind in _REQUEST_ERRORS:
        status, message, type_, code, param = _REQUEST_ERRORS[kind]
        if kind == "401" and api_key:
            message = f"Incorrect API key provided: {masked_key(api_key)} (simulated)."
        await respond(send, status, error_body(message, type_, code, param), rid)
    else:
        await respond(send, 502, HTML_502, rid, content_type=b"text/html")


_REQUEST_ERRORS: dict[str, tuple[int, str, str, str | None, str | None]] = {
    "400": (
        400,
        "Invalid value for 'temperature': expected a number (simulated).",
        "invalid_request_error",
        "invalid_value",
        "temperature",
    ),
    "context-length": (
        400,
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages. (simulated)",
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    ),
    "content-policy": (
        400,
        "Your request was rejected as a result of our safety system (simulated).",
        "invalid_request_error",
        "content_policy_violation",
        None,
    ),
    "401": (
        401,
        "Incorrect API key provided (simulated).",
        "invalid_request_error",
        "invalid_api_key",
        None,
    ),
    "403": (
        403,
        "You are not allowed to use this model (simulated).",
        "invalid_request_error",
        None,
        None,
    ),
    "404": (
        404,
        "The model 'sim-x' does not exist or you do not have access to it (simulated).",
        "invalid_request_error",
        "model_not_found",
        None,
    ),
}
