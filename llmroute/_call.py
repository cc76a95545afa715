"""The call llmroute serves itself, as the seam reads it from openai's request options, and
what it is served with.

:class:`Call` is one chat, Responses, legacy completions or embeddings call (its route, body,
headers, timeout); :class:`Served` is what it produced. Both pass between the client, its
:class:`~llmroute._dispatch.Dispatch` and the dispatch's parts (the cache glue in
:mod:`._call_cache`, the tier glue in :mod:`._tiering`, the Responses API's pins in
:mod:`._response_pins`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx
from openai import NOT_GIVEN, BadRequestError

from ._tiers import Conversation, TieredModel
from ._timeouts import RequestTimeouts
from ._types import RouteReport, TierDecision, Timings
from .config import ResolvedProvider
from .protocols import adapter_for
from .routing.route import Route

__all__ = [
    "RECEIVED",
    "ROUTABLE",
    "Call",
    "Posted",
    "Received",
    "Served",
    "TierCall",
    "attach",
    "bad_request",
    "serves",
]

ROUTABLE = {
    "chat/completions": "chat",
    "responses": "responses",
    "completions": "completions",
    "embeddings": "embeddings",
}
"""The endpoints (relative to the base URL) where a model name may be a route, by kind."""


@dataclass
class Call:
    """One call of openai's machinery that llmroute serves itself."""

    kind: str
    """"chat", "responses", "completions" or "embeddings"."""
    path: str
    route: Route | None
    """``None``: a chat call for a model name that is not a route (the client's base URL)."""
    body: dict[str, Any]
    stream: bool
    headers: Mapping[str, Any]
    """The call's own headers (``extra_headers``)."""
    query: Mapping[str, object] | None
    timeout: httpx.Timeout
    client_headers: Mapping[str, str] = field(default_factory=dict)
    """The client's ``default_headers`` as given (llmroute reads its ``x-llmroute-*`` ones)."""
    sent_headers: Mapping[str, str] = field(default_factory=dict)
    """What a direct call is sent with (the client's default and auth headers)."""
    signed_late: bool = False
    """A direct call whose credentials only openai's machinery knows, as it sends the request
    (an API key provider, a workload identity, a cloud provider's signing): ``sent_headers``
    do not say who asks, so the cache answers it only in a namespace the call names."""
    base_url: str = ""
    http: Any = None
    """The application's own async HTTP client (``http_client=``), which routed calls use
    too; ``None``: llmroute's transport."""
    goal_options: object = None
    """The call's ``extra_body={"llmroute": {...}}`` options, taken out of the body (never
    sent upstream); read by :meth:`Dispatch.goal`."""
    tiered: TierCall | None = None
    """A call for a tiered model name: ``route`` is its default tier until the decision."""
    trace: Any = None
    """The call's trace (``metrics._traceparent.RequestTrace``): its attempts' traceparent."""
    prompt_tokens: int | None = None
    """The prompt's tokens, estimated by the caller (a server counted them as it parsed the
    body); ``None``: the routing counts them."""
    off_loop: bool = False
    """Each attempt's body encoded in a worker thread: a large body a server received
    (``AsyncOpenAI.route_json``'s ``body_bytes``), whose encoding would hold the event loop."""


@dataclass(frozen=True, slots=True)
class Received:
    """What a server knows of a JSON body it received and posts through openai's ``post()``
    (a legacy completion, an embedding): its ``size`` in bytes and its prompt's tokens,
    counted as it parsed it. The call of that very ``body`` takes them as ``route_json``'s
    ``body_bytes`` and ``prompt_tokens``: :data:`RECEIVED`."""

    body: Mapping[str, Any]
    size: int
    prompt_tokens: int | None = None

    def of(self, json_data: object) -> bool:
        """Whether openai's ``json_data`` is this body: openai copies the body's dict, not
        its values, so the same keys holding the same objects (a look at each key, not a
        pass over the body)."""
        body = self.body
        return (
            isinstance(json_data, Mapping)
            and len(json_data) == len(body)
            and all(json_data.get(key, _ABSENT) is value for key, value in body.items())
        )


_ABSENT = object()


RECEIVED: ContextVar[Received | None] = ContextVar("llmroute_received", default=None)
"""A server's :class:`Received` for the body it is about to post (set around the ``post()``
call, in its task): openai's ``post()`` has no argument to carry it."""


@dataclass
class TierCall:
    """What a call for a tiered model name needs to choose its tier (:meth:`Tiering.decide`)."""

    model: TieredModel
    forced: str | None
    """The route the call's ``llmroute.tier`` option named, if any."""
    own: RequestTimeouts
    timeout: httpx.Timeout
    """The call's HTTP timeout before its route's were applied."""
    decision: TierDecision | None = None
    conversation: Conversation | None = None
    """A chat call's conversation (hashes of its messages), for stickiness."""


class Posted:
    """openai's request options as the seam reads them, for a call that has not been through
    openai's machinery (the client's early cache check, the gateway's hand-off): a POST of a
    JSON body, with the call's own headers, no query, the client's timeout."""

    __slots__ = ("headers", "json_data", "url")
    method = "post"
    extra_json = None
    params = None
    timeout: Any = NOT_GIVEN
    post_parser: Any = NOT_GIVEN

    def __init__(
        self, url: str, json_data: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.json_data = json_data
        self.headers = headers


@dataclass
class Served:
    """What llmroute served a call with: ``result`` (``None``: openai's machinery parses
    ``response``), the HTTP response behind it and the retries taken. (Not a target's
    outcome in the stats, ``routing.stats.Outcome``.)"""

    result: Any
    response: httpx.Response
    retries: int = 0


def serves(provider: ResolvedProvider, kind: str) -> bool:
    """Whether ``provider`` serves the endpoint ``kind`` (chat is served by every one)."""
    if kind == "chat":
        return True
    if not adapter_for(provider.spec.protocol).serves(kind):
        return False
    if kind == "responses":
        return provider.spec.responses
    return True


def attach(
    completion: Any, timings: Timings, report: RouteReport | None, started: float | None = None
) -> None:
    """Give a completion its timings and route report (``started``: measured until now)."""
    if started is not None:
        timings.first_byte = timings.first_token = timings.total = time.monotonic() - started
    usage = getattr(completion, "usage", None)
    tokens = getattr(usage, "completion_tokens", None) or getattr(usage, "output_tokens", 0)
    timings.tokens = tokens if isinstance(tokens, int) else 0
    object.__setattr__(completion, "timings", timings)
    object.__setattr__(completion, "route", report)


def bad_request(message: str, *, param: str | None = None) -> BadRequestError:
    """openai's ``BadRequestError`` for a call llmroute refuses before sending anything."""
    request = httpx.Request("POST", "llmroute://refused")
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    response = httpx.Response(400, json={"error": body}, request=request)
    return BadRequestError(message, response=response, body=body)  # type: ignore[arg-type]
