"""The gateway's call of its client for a checked request: a chat or Responses call on a route
through the client's public hand-off (:meth:`llmroute.AsyncOpenAI.route_json`), any other call
through openai's own methods, with the headers a gateway client may send on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from .._client import AsyncOpenAI
from .._timeouts import BETWEEN_TOKENS_HEADER, CONNECT_HEADER, FIRST_TOKEN_HEADER
from ..metrics import REQUEST_ID_HEADER, TRACEPARENT, TRACESTATE
from ..routing.goal import TTFT_TARGET_HEADER

__all__ = ["CHAT", "COMPLETIONS", "RESPONSES", "ROUTABLE", "call_client", "upstream_headers"]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
ROUTABLE = {CHAT: "/chat/completions", RESPONSES: "/responses"}  # handed to the routing
_POSTED: dict[str, tuple[type, Any]] = {
    CHAT: (ChatCompletion, ChatCompletionChunk),
    RESPONSES: (Response, ResponseStreamEvent),  # an annotated union, as openai builds it
}
"""The answer's type and its stream event's type, for a routable call posted as it is."""
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
) -> object:
    """The client's call for ``path``: every field of the body is passed on as it is."""
    if path in ROUTABLE:
        # A chat or Responses call on a route goes straight to the client's routing, as the
        # client's seam would send it: openai's post() would first build its request options
        # (FinalRequestOptions, ~70 µs of CPU per request, most of it deep-copying defaults;
        # benchmarks/gateway_call.py) only for the seam to take the call out of openai's path.
        # Any other call (a model that is not a route, with a default provider) takes post().
        result = await client.route_json(
            ROUTABLE[path], body, headers=extra_headers, timeout=timeout
        )
        if result is not None:
            return result
    posted = _POSTED.get(path)
    if posted is not None:
        # openai's resource method would walk the whole body through its TypedDict
        # transform (8% of the gateway's CPU per streamed request, measured with py-spy);
        # the body is JSON the gateway has checked already, so it is posted as it is.
        cast_to, event = posted
        return await client.post(
            ROUTABLE[path],
            body=body,
            cast_to=cast_to,
            options={"headers": extra_headers},
            stream=bool(body.get("stream")),
            stream_cls=openai.AsyncStream[event],
        )
    return await _resource_call(client, path, body, extra_headers)


async def _resource_call(
    client: AsyncOpenAI, path: str, body: dict[str, Any], extra_headers: dict[str, str]
) -> object:
    """A legacy completion or an embedding, through openai's resource method."""
    rest = dict(body)
    model = rest.pop("model")
    kwargs: dict[str, Any] = {"model": model, "extra_headers": extra_headers}
    if "stream" in rest:
        kwargs["stream"] = rest.pop("stream")
    if path == COMPLETIONS:
        kwargs["prompt"] = rest.pop("prompt")
        return await client.completions.create(extra_body=rest, **kwargs)
    kwargs.pop("stream", None)
    kwargs["input"] = rest.pop("input")
    if "encoding_format" in rest:
        kwargs["encoding_format"] = rest.pop("encoding_format")
    return await client.embeddings.create(extra_body=rest, **kwargs)
