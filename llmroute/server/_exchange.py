"""One request and its answer on the wire: the :class:`Request` (what came: its path, method,
headers and body channel), the :class:`Exchange` (what was sent, whether the client left), its
JSON body read within the gateway's bounds, and an answer written back,
whole or streamed as server-sent events, with a watcher beside it for a client that leaves or
stops reading."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import pydantic

from .._sizes import format_size
from .._types import RouteReport
from ..config import GatewaySettings
from ._admission import Ticket
from ._errors import Refused, error_body, invalid_field, too_deep
from ._metrics import ANONYMOUS
from ._tenants import Tenant, Tenants
from ._validate import InvalidField, load

__all__ = [
    "TARGET_HEADER",
    "TIER_HEADER",
    "Exchange",
    "Receive",
    "Request",
    "Scope",
    "Send",
    "Stalled",
    "answer_headers",
    "cache_hit",
    "dump_json",
    "named_event",
    "parse_json",
    "read_body",
    "read_json",
    "watch",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TIER_HEADER = "x-llmroute-tier"
"""The answer's header naming the tier (route) a tiered model name's request went to."""
TARGET_HEADER = "x-llmroute-target"
"""The answer's header naming the target that gave it (``cache`` for a replay)."""
_DRAIN_BYTES = 16 * 2**20  # a refused body up to this size is read to its end before the 413
_DRAIN_SECONDS = 5.0


class Stalled(Exception):
    """The client did not take a write within ``write_timeout``."""


class Exchange:
    """One request's state: its id, key name, status sent and whether the client left."""

    __slots__ = (
        "counted",
        "failed",
        "finished",
        "first",
        "gone",
        "headers",
        "key",
        "label",
        "query",
        "report",
        "request_id",
        "revoked",
        "send",
        "since",
        "stalled",
        "started",
        "status",
        "tenant",
        "tenants",
        "ticket",
        "write_timeout",
    )

    def __init__(self, send: Send, label: str, write_timeout: float) -> None:
        self.send = send
        self.label = label
        self.key = ANONYMOUS
        self.query = b""  # the URL's query string (only the admin API reads one)
        self.tenant: Tenant | None = None
        self.tenants: Tenants | None = None  # the keys it was authenticated by
        self.headers: dict[str, str] = {}
        """Sent with the answer whatever it is (the key's x-ratelimit-* headers)."""
        self.started = 0.0  # when the answer's headers were sent (monotonic)
        self.first = 0.0  # when its first chunk (or the whole answer) began to be written
        self.failed = False  # a stream that ended with an error event
        self.counted = False  # in its key's usage, by the answer's accounting (settle)
        self.revoked = False  # the key was revoked on a reload, and its streams cut
        self.status = 0
        self.gone = False
        self.stalled = False
        self.finished = False
        self.write_timeout = write_timeout
        self.ticket: Ticket | None = None  # the key's slot and counts this request holds
        self.since = 0.0  # when the chunk being written began to be, 0.0: none is
        self.request_id = f"gw-{uuid.uuid4().hex}"
        self.report: RouteReport | None = None  # a routed call's: its trace and upstream ids

    async def start(self, status: int, content_type: str, headers: Mapping[str, str]) -> None:
        self.status = status
        self.started = time.monotonic()
        # One line per header: the answer's own replace the exchange's (an admin path's
        # cache-control is both).
        extra = {**self.headers, **headers} if self.headers and headers else self.headers or headers
        raw = [
            (b"content-type", content_type.encode()),
            (b"x-request-id", self.request_id.encode()),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()),
        ]
        await self.send({"type": "http.response.start", "status": status, "headers": raw})

    async def chunk(self, data: bytes) -> None:
        """One chunk of a streamed answer. Its write is timed by the request's watcher
        (:func:`watch`), which costs nothing per chunk, unlike a cancel scope per write."""
        self.since = time.monotonic()
        if not self.first:
            self.first = self.since
        await self.send({"type": "http.response.body", "body": data, "more_body": True})
        self.since = 0.0

    async def body(self, data: bytes, *, more: bool = False) -> None:
        if not more:
            self.finished = True
        with anyio.move_on_after(self.write_timeout) as waited:
            await self.send({"type": "http.response.body", "body": data, "more_body": more})
        if waited.cancelled_caught:
            # The client stopped reading: the response is cut (an HTTP/2 stream is reset, an
            # HTTP/1.1 connection closed) and, through the caller, the upstream cancelled.
            self.gone = self.stalled = True
            raise Stalled()

    async def whole(
        self,
        status: int,
        data: bytes,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        await self.start(status, content_type, headers or {})
        self.first = self.started
        await self.body(data)


# -- the request ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One HTTP request as the gateway's phases read it, built once at the edge
    (``GatewayApp.__call__``): its path, method and headers (names in lower case; never in its
    repr, which would show the key), the :class:`Exchange` its answer goes through and the
    channel its body comes on."""

    path: str
    method: str
    headers: Mapping[str, str] = field(repr=False)
    exchange: Exchange = field(repr=False)
    receive: Receive = field(repr=False)


async def read_json(
    request: Request,
    settings: GatewaySettings,
    reject: Callable[[str], None],
    *,
    allow_empty: bool = False,
) -> dict[str, Any]:
    """The request's body as a JSON object, read within ``max_body_bytes`` and
    ``body_timeout``, or a refusal (413, 408, 400; 499 when the client left). ``reject`` counts
    a refusal by its reason."""
    data = await read_body(request, settings, reject)
    if allow_empty and not data:
        return {}
    return parse_json(data, reject)


async def read_body(
    request: Request, settings: GatewaySettings, reject: Callable[[str], None]
) -> bytes:
    """The request's body, read within ``max_body_bytes`` and ``body_timeout``, or a refusal
    (413, 408; 499 when the client left) counted by ``reject``."""
    receive, exchange = request.receive, request.exchange
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        if int(declared) <= _DRAIN_BYTES:
            await _discard(receive, _DRAIN_BYTES)
        raise _too_large(reject, limit)
    data, more = await _received(receive, exchange, settings, reject)
    if more:
        reject("body_timeout")
        raise Refused(
            408,
            error_body(
                f"The request body did not arrive within {settings.body_timeout:g} s.",
                "invalid_request_error",
                "request_timeout",
            ),
        )
    return data


async def _received(
    receive: Receive, exchange: Exchange, settings: GatewaySettings, reject: Callable[[str], None]
) -> tuple[bytes, bool]:
    """The body's bytes, and whether more was to come when ``body_timeout`` passed."""
    limit = settings.max_body_bytes
    parts: list[bytes] = []
    size = 0
    more = True
    with anyio.move_on_after(settings.body_timeout):
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.gone = True
                raise Refused(499, error_body("The client went away.", "invalid_request_error"))
            part: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(part)
            if size > limit:
                if more:
                    await _discard(receive, _DRAIN_BYTES)
                raise _too_large(reject, limit)
            parts.append(part)
    return b"".join(parts), more


def parse_json(data: bytes, reject: Callable[[str], None]) -> dict[str, Any]:
    """``data`` as a JSON object, or the 400 saying why not (not JSON, not an object, nested
    too deeply, a number JSON cannot carry or a lone surrogate, named)."""
    try:
        body = load(data)
    except InvalidField as invalid:  # NaN, Infinity, 1e400: named
        reject("invalid_request")
        raise invalid_field(invalid) from None
    except ValueError:  # UnicodeDecodeError too
        raise Refused(
            400, error_body("The request body is not valid JSON.", "invalid_request_error")
        ) from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(body, dict):
        raise Refused(
            400, error_body("The request body must be a JSON object.", "invalid_request_error")
        )
    return body  # type: ignore[return-value]


def _too_large(reject: Callable[[str], None], limit: int) -> Refused:
    reject("body_too_large")
    return Refused(
        413,
        error_body(
            f"The request body is larger than the gateway allows ({format_size(limit)}).",
            "invalid_request_error",
            "request_too_large",
        ),
    )


async def _discard(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a refused body (bounded in bytes and time), so an HTTP/1.1
    client still sending it reads the 413 instead of a reset connection."""
    with anyio.move_on_after(_DRAIN_SECONDS):
        while budget > 0:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def watch(
    request: Request,
    gone: Callable[[], None],
    stalled: Callable[[], None],
    renew: Callable[[Exchange], Awaitable[None]],
) -> None:
    """Beside a request's work: call ``gone`` when the client disconnects, ``stalled`` when a
    chunk's write has waited ``write_timeout`` (checked every quarter of it, so the answer is
    cut within 1.25 times ``write_timeout``), and renew the request's shared slot meanwhile."""
    receive, exchange = request.receive, request.exchange
    interval = exchange.write_timeout / 4
    while True:
        with anyio.move_on_after(interval):
            message = await receive()
            if message["type"] == "http.disconnect":
                gone()
                return
            continue
        since = exchange.since
        if since and time.monotonic() - since >= exchange.write_timeout:
            stalled()
            return
        await renew(exchange)


# -- the answer -----------------------------------------------------------------------------


def dump_json(model: pydantic.BaseModel) -> bytes:
    """An ``openai.types`` object as the JSON it came from: the fields it was built with
    (``exclude_unset``: none invented), the vendor's unknown fields kept, API names used."""
    return model.model_dump_json(by_alias=True, exclude_unset=True, warnings=False).encode()


def named_event(event: pydantic.BaseModel) -> bytes:
    """A Responses API stream event on the wire: ``event: <type>`` and its JSON."""
    kind = getattr(event, "type", None)
    named = isinstance(kind, str) and kind.isprintable()
    head = b"event: " + kind.encode() + b"\n" if named else b""  # type: ignore[union-attr]
    return head + b"data: " + dump_json(event) + b"\n\n"


def cache_hit(result: object) -> bool:
    route = getattr(result, "route", None)
    return bool(getattr(route, "cache_hit", False))


def answer_headers(result: object, hit: bool) -> dict[str, str]:
    """``x-llmroute-cache``, and ``x-llmroute-tier`` (the route a tiered model name's request
    went to) and ``x-llmroute-target`` (whose answer this is, ``cache`` for a replay) when
    known."""
    headers = {"x-llmroute-cache": "hit" if hit else "miss"}
    route = getattr(result, "route", None)
    tier = getattr(route, "tier", None)
    if tier is not None:
        headers[TIER_HEADER] = tier.tier
    winner = getattr(route, "winner", None)
    if isinstance(winner, str):
        headers[TARGET_HEADER] = winner
    return headers
