"""The gateway's call of its client for a checked request (:class:`ApiCall`, what the relay,
the accounting and the client's call read): a chat or Responses call on a route through the
client's public hand-off (:meth:`llmroute.AsyncOpenAI.route_json`), any other call posted as
its checked JSON body through openai's ``post()``, with the headers a gateway client may send
on. No call goes through openai's resource methods: their params transform walks every item
of the body on the event loop (a 100,000-token prompt: 2 s, every other key's request
waiting)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from .._call import RECEIVED, Received
from .._client import AsyncOpenAI
from .._timeouts import BETWEEN_TOKENS_HEADER, CONNECT_HEADER, FIRST_TOKEN_HEADER
from ..metrics import REQUEST_ID_HEADER, TRACEPARENT, TRACESTATE
from ..routing import RequestEstimate, estimate_request
from ..routing.goal import TTFT_TARGET_HEADER
from ..routing.windows import answer_room
from ._exchange import Exchange, Request
from ._tenants import Tenant

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "RESPONSES",
    "ROUTABLE",
    "ApiCall",
    "call_client",
    "upstream_headers",
]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
ROUTABLE = {CHAT: "/chat/completions", RESPONSES: "/responses"}  # handed to the routing
_POSTED: dict[str, tuple[str, type, Any]] = {
    CHAT: ("/chat/completions", ChatCompletion, ChatCompletionChunk),
    COMPLETIONS: ("/completions", Completion, Completion),
    EMBEDDINGS: ("/embeddings", CreateEmbeddingResponse, None),  # never streamed
    RESPONSES: ("/responses", Response, ResponseStreamEvent),  # an annotated union
}
"""The client's path, the answer's type and its stream event's type, for a call posted as it
is."""
# Headers a gateway client may set for the cache, the timeouts (checked first) and its latency
# goal; nothing else it sends goes upstream. Its x-llmroute-timeout-total the gateway keeps.
_FORWARDED = (
    "x-llmroute-cache",
    "x-llmroute-cache-replay",
    CONNECT_HEADER,
    FIRST_TOKEN_HEADER,
    BETWEEN_TOKENS_HEADER,
    TTFT_TARGET_HEADER,
    TRACEPARENT,  # the caller's trace goes on (each attempt its span)
    TRACESTATE,
)
_NAMESPACE_HEADER = "x-llmroute-cache-namespace"


@dataclass(frozen=True, slots=True, eq=False)
class ApiCall:
    """A ``/v1`` POST once its checks passed, built once (``GatewayApp._v1``) and read by its
    admission, the relay, the client's call and the accounting: the ``request`` it came as,
    its key's ``tenant``, the ``model`` it names, its endpoint's ``kind`` (``chat``,
    ``completions``, ``embeddings``, ``responses``), its ``body`` (``size``: its bytes as
    received; ``prompt_tokens``: its prompt's estimate, counted where it was parsed), the
    ``upstream`` headers sent on (:func:`upstream_headers`) and its ``total`` timeout in
    seconds (``None``: none)."""

    request: Request
    tenant: Tenant
    model: str
    kind: str
    body: dict[str, Any] = field(repr=False)
    upstream: dict[str, str] = field(repr=False)
    total: float | None
    size: int | None = None
    prompt_tokens: int | None = None

    def estimate(self) -> RequestEstimate:
        """The request's tokens (:func:`~llmroute.routing.estimate_request`), its prompt's
        counted once: the answer's room is read now, after the checks set a default."""
        if self.prompt_tokens is None:
            return estimate_request(self.body, self.kind)
        return RequestEstimate(self.prompt_tokens, answer_room(self.body, self.kind))

    @property
    def path(self) -> str:
        return self.request.path

    @property
    def exchange(self) -> Exchange:
        return self.request.exchange


def upstream_headers(
    headers: Mapping[str, str], namespace: str | None, request_id: str | None = None
) -> dict[str, str]:
    """The cache settings a client may give, its W3C trace context; the key's cache
    ``namespace`` when it has one; the gateway's ``request_id`` for a routed call's report."""
    out = {name: headers[name] for name in _FORWARDED if name in headers}
    if namespace is not None:
        out[_NAMESPACE_HEADER] = namespace
    if request_id is not None:
        out[REQUEST_ID_HEADER] = request_id
    return out


async def call_client(
    client: AsyncOpenAI,
    path: str,
    body: dict[str, Any],
    extra_headers: dict[str, str],
    timeout: httpx.Timeout,
    size: int | None = None,
    prompt_tokens: int | None = None,
) -> object:
    """The client's call for ``path``: every field of the body is passed on as it is
    (``size``: its bytes as received, a large body encoded for each target off the event
    loop; ``prompt_tokens``: its prompt's estimate; ``AsyncOpenAI.route_json``'s
    ``body_bytes`` and ``prompt_tokens``)."""
    if path in ROUTABLE:
        # A chat or Responses call on a route goes straight to the client's routing, as the
        # client's seam would send it: openai's post() would first build its request options
        # (FinalRequestOptions, ~70 µs of CPU per request, most of it deep-copying defaults;
        # benchmarks/gateway_call.py) only for the seam to take the call out of openai's path.
        # Any other call (a model that is not a route, with a default provider) takes post().
        result = await client.route_json(
            ROUTABLE[path],
            body,
            headers=extra_headers,
            timeout=timeout,
            body_bytes=size,
            prompt_tokens=prompt_tokens,
        )
        if result is not None:
            return result
    # openai's resource method would walk the whole body through its TypedDict transform
    # (8% of the gateway's CPU per streamed request; for a legacy completion's prompt of
    # 100,000 token ids, 2 s of the event loop): the body is JSON the gateway has checked
    # already, so it is posted as it is. An embedding asked without encoding_format is
    # answered in floats, as the API answers it (openai's method would ask for base64 and
    # decode it).
    url, cast_to, event = _POSTED[path]
    if event is None and "stream" in body:  # an embedding has no stream: never sent on
        body = {name: value for name, value in body.items() if name != "stream"}
    stream = event is not None and bool(body.get("stream"))
    # post() has no argument for what the gateway knows of the body: its size (a large one is
    # encoded for each target off the event loop) and its prompt's count, for this body only.
    noted = RECEIVED.set(Received(body, size, prompt_tokens) if size is not None else None)
    try:
        return await client.post(
            url,
            body=body,
            cast_to=cast_to,
            options={"headers": extra_headers},
            stream=stream,
            stream_cls=openai.AsyncStream[event] if stream else None,
        )
    finally:
        RECEIVED.reset(noted)
