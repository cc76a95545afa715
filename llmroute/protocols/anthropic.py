"""The Anthropic Messages protocol: translate a chat request, decode Messages responses.

A chat completions request (OpenAI's shape) becomes a native ``POST /v1/messages`` body with
:func:`translate_request`; the streamed answer (``message_start``, ``content_block_*``,
``message_delta``, ``message_stop``, ``ping``, ``error`` events) comes back as the same
``ChatCompletionChunk`` objects an OpenAI stream gives (:class:`AnthropicStreamDecoder`), and a
whole answer as a ``ChatCompletion`` (:func:`parse_message`), with openai's finish reasons and
usage (cached prompt tokens in ``prompt_tokens_details.cached_tokens``).

Mapping, OpenAI -> Anthropic:

- ``system`` and ``developer`` messages (wherever they are) -> top-level ``system``: a string, or
  text blocks when a part carries ``cache_control``;
- ``user``/``assistant`` roles kept, consecutive messages of one role merged into one message;
  ``tool`` messages -> ``tool_result`` blocks of a user message; assistant ``tool_calls`` ->
  ``tool_use`` blocks; ``image_url`` parts -> ``image`` blocks (a ``data:`` URL as a base64
  source, any other URL as a url source);
- a trailing assistant message is kept as is: Anthropic's native prefill, which the answer
  continues (its trailing whitespace is stripped, which the API requires; give
  :func:`prefill_whitespace` to the decoder so the answer does not repeat it);
- ``tools`` (functions) -> ``{name, description, input_schema}``; ``tool_choice`` ``auto`` /
  ``none`` / ``required`` / a named function -> ``auto`` / ``none`` / ``any`` / ``tool``;
  ``parallel_tool_calls=false`` -> ``disable_parallel_tool_use``;
- ``stop`` -> ``stop_sequences``; ``max_completion_tokens`` or ``max_tokens`` -> ``max_tokens``
  (:data:`DEFAULT_MAX_TOKENS` when absent: the Messages API requires it); ``temperature``
  (clamped to Anthropic's 0..1), ``top_p``, ``stream``; ``user`` -> ``metadata.user_id``;
  Anthropic's own ``top_k`` and ``thinking`` (e.g. from ``extra_body``) are passed through.

Parameters the Messages API cannot express (``n > 1``, ``logprobs``, ``top_logprobs``, non-zero
``presence_penalty``/``frequency_penalty``, ``logit_bias``, a JSON ``response_format``, audio)
raise ``openai.BadRequestError`` naming the parameter and the target, before anything is sent;
so do values of the wrong type (a ``temperature`` that is not a number, a text part that is not a
string, ``tools`` that are not a list of functions with names).
Parameters with no effect on the answer's shape (``seed``, ``store``, ``metadata``,
``service_tier``, ``reasoning_effort``, ``prediction``, ``stream_options``) are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from .._prices import UsageFields
from ._adapter import ProtocolAdapter
from ._anthropic_answer import AnthropicStreamDecoder, finish_reason, parse_message, usage_of
from ._anthropic_request import DEFAULT_MAX_TOKENS, prefill_whitespace, translate_request
from ._decoder import ChatStreamDecoder
from .openai import REQUEST_ID_HEADER as OPENAI_REQUEST_ID_HEADER

__all__ = [
    "ANTHROPIC",
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "REQUEST_ID_HEADER",
    "AnthropicAdapter",
    "AnthropicStreamDecoder",
    "finish_reason",
    "headers",
    "parse_message",
    "prefill_whitespace",
    "translate_request",
    "usage_of",
]

ANTHROPIC_VERSION = "2023-06-01"
REQUEST_ID_HEADER = "request-id"
"""The response header with Anthropic's id of a request (``req_...``)."""


def headers(api_key: str) -> dict[str, str]:
    """The headers of a Messages API request: the key, the API version, JSON content."""
    return {
        "x-api-key": api_key,
        "anthropic-version": ANTHROPIC_VERSION,
        "content-type": "application/json",
    }


# -- the adapter ----------------------------------------------------------------------------


class AnthropicAdapter(ProtocolAdapter):
    """Anthropic's Messages API: chat calls only, translated (:func:`translate_request`) and
    sent to ``messages`` with the key in ``x-api-key``; a continuation is the native prefill,
    its trailing whitespace given back by the decoder (:func:`prefill_whitespace`)."""

    name = "anthropic"
    translates = True
    usage_fields = UsageFields(
        prompt="input_tokens",
        prompt_includes_cache=False,
        cache_read="cache_read_input_tokens",
        cache_write="cache_creation_input_tokens",
        cache_write_1h="cache_creation.ephemeral_1h_input_tokens",
        completion="output_tokens",
    )

    def serves(self, kind: str) -> bool:
        return kind == "chat"

    def headers(
        self, api_key: str | None, *, user_agent: str, configured: Mapping[str, str]
    ) -> dict[str, str]:
        return {"User-Agent": user_agent, **headers(api_key or ""), **configured}

    def models_request(self, api_key: str) -> tuple[dict[str, str], dict[str, Any]]:
        return {"x-api-key": api_key}, {"limit": 1000}  # Anthropic pages its list, 20 by default

    def wire_request(
        self, path: str, body: Mapping[str, Any], *, target: str
    ) -> tuple[str, Mapping[str, Any]]:
        if path != "chat/completions":
            return path, body
        return "messages", translate_request(body, target=target)

    def send_limit_as(self, body: dict[str, Any], field: str) -> None:
        return None  # translate_request sends the limit as max_tokens, the one field there is

    def stream_decoder(
        self,
        kind: str,
        *,
        request: httpx.Request,
        target: str,
        body: Mapping[str, Any],
        include_usage: bool,
    ) -> ChatStreamDecoder:
        _chat_only(kind)
        return AnthropicStreamDecoder(
            request=request,
            target=target,
            include_usage=include_usage,
            prefill_whitespace=prefill_whitespace(body),
        )

    def parse_answer(
        self, kind: str, response: httpx.Response, *, target: str, body: Mapping[str, Any]
    ) -> Any:
        _chat_only(kind)
        return parse_message(
            response.content,
            request=response.request,
            target=target,
            response=response,
            prefill_whitespace=prefill_whitespace(body),
        )

    def request_id(self, headers: Mapping[str, str]) -> str | None:
        return headers.get(REQUEST_ID_HEADER) or headers.get(OPENAI_REQUEST_ID_HEADER)

    def answer_usage(self, kind: str, completion: Any, response: httpx.Response) -> Any:
        try:  # the completion's usage is openai's, without the cache writes' lifetimes
            data = json.loads(response.content)
        except ValueError:
            return None
        usage = data.get("usage") if isinstance(data, dict) else None
        return usage if isinstance(usage, dict) else None


def _chat_only(kind: str) -> None:
    if kind != "chat":
        raise ValueError(f"the Anthropic Messages protocol has no {kind} API")


ANTHROPIC = AnthropicAdapter()
"""The Anthropic Messages protocol's adapter."""
