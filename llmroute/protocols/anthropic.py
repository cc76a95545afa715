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
import math
import time
from collections.abc import Mapping
from typing import Any, cast

import httpx
from openai import APIResponseValidationError, BadRequestError
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .._errors import MalformedStreamError, make_status_error
from .._prices import UsageFields
from ..transport import ServerSentEvent
from ._adapter import ProtocolAdapter
from .openai import REQUEST_ID_HEADER as OPENAI_REQUEST_ID_HEADER
from .openai import ChatStreamDecoder, build_chunk, load_json

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
DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` sent when the chat request sets neither ``max_tokens`` nor
``max_completion_tokens`` (the Messages API requires one)."""

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# Anthropic's error types and the HTTP status each one comes with.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_PASSED = ("top_k", "thinking")
# Events of a message: each needs message_start first (ping, error and new kinds do not).
_MESSAGE_EVENTS = frozenset(
    {
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)


def headers(api_key: str) -> dict[str, str]:
    """The headers of a Messages API request: the key, the API version, JSON content."""
    return {
        "x-api-key": api_key,
        "anthropic-version": ANTHROPIC_VERSION,
        "content-type": "application/json",
    }


def _bad_request(param: str, target: str, detail: str, *, invalid: bool = False) -> BadRequestError:
    if invalid:  # a value of the wrong type or shape, whatever the protocol
        message = f"{detail} (parameter {param!r}, for target {target!r})"
    else:
        message = (
            f"{detail} (parameter {param!r}): target {target!r} speaks the Anthropic Messages "
            "protocol, which cannot express it"
        )
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    request = httpx.Request("POST", "https://llmroute.invalid/v1/messages")
    response = httpx.Response(400, request=request, json={"error": body})
    return BadRequestError(f"Error code: 400 - {message}", response=response, body=body)  # type: ignore[arg-type]


def _check_supported(body: Mapping[str, Any], target: str) -> None:
    n = body.get("n")
    if n not in (None, 1):
        raise _bad_request("n", target, f"n={n!r} asks for several choices")
    if body.get("logprobs"):
        raise _bad_request("logprobs", target, "log probabilities are not available")
    if body.get("top_logprobs"):
        raise _bad_request("top_logprobs", target, "log probabilities are not available")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name):
            raise _bad_request(name, target, f"{name} has no equivalent")
    if body.get("logit_bias"):
        raise _bad_request("logit_bias", target, "token biases have no equivalent")
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and cast(Mapping[str, Any], fmt).get("type") not in (None, "text"):
        raise _bad_request("response_format", target, "structured output is not available")
    modalities = body.get("modalities")
    if body.get("audio") or (isinstance(modalities, list | tuple | str) and "audio" in modalities):
        raise _bad_request("audio", target, "audio output is not available")
    if body.get("functions") or body.get("function_call"):
        raise _bad_request("functions", target, "use tools instead of the legacy functions")


def translate_request(body: Mapping[str, Any], *, target: str) -> dict[str, Any]:
    """Translate a chat completions request body into an Anthropic Messages request body.

    Raises ``openai.BadRequestError`` naming the parameter and ``target`` for what the Messages
    API cannot express (see the module docstring); nothing is sent in that case.
    """
    _check_supported(body, target)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad_request("messages", target, "messages must be a non-empty list")
    system, turns = _messages(cast(list[Any], messages), target)
    out: dict[str, Any] = {"model": body.get("model"), "messages": turns}
    if system is not None:
        out["system"] = system
    limit = _integer(body, "max_completion_tokens", target)
    if limit is None:
        limit = _integer(body, "max_tokens", target)
    thinking = body.get("thinking")
    budget = thinking.get("budget_tokens") if isinstance(thinking, Mapping) else None
    if isinstance(budget, int) and limit is None:
        limit = budget + DEFAULT_MAX_TOKENS  # Anthropic wants max_tokens above the budget
    elif isinstance(budget, int) and isinstance(limit, int) and limit <= budget:
        raise _bad_request(
            "max_tokens",
            target,
            f"max_tokens ({limit}) must be above thinking.budget_tokens ({budget})",
        )
    out["max_tokens"] = DEFAULT_MAX_TOKENS if limit is None else limit
    stop = body.get("stop")
    if stop:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _bad_request(
                "stop", target, "stop must be a string or a list of strings", invalid=True
            )
        out["stop_sequences"] = list(cast(list[str], stop))
    temperature = _number(body, "temperature", target)
    if temperature is not None:
        out["temperature"] = min(float(temperature), 1.0)
    top_p = _number(body, "top_p", target)
    if top_p is not None:
        out["top_p"] = top_p
    for name in _PASSED:
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stream"):
        out["stream"] = True
    if isinstance(body.get("user"), str) and body["user"]:
        out["metadata"] = {"user_id": body["user"]}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise _bad_request("tools", target, "tools must be a list", invalid=True)
        out["tools"] = [_tool(t, i, target) for i, t in enumerate(cast(list[Any], tools))]
        choice = _tool_choice(body.get("tool_choice"), target)
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice is not None:
            out["tool_choice"] = choice
    return out


def _integer(body: Mapping[str, Any], name: str, target: str) -> int | None:
    value = body.get(name)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise _bad_request(name, target, f"{name} must be an integer", invalid=True)


def _number(body: Mapping[str, Any], name: str, target: str) -> float | int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    raise _bad_request(name, target, f"{name} must be a number", invalid=True)


def _tool(tool: Any, i: int, target: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        raise _bad_request(f"tools[{i}]", target, "only function tools are available")
    fn = cast(Mapping[str, Any], tool).get("function") or {}
    if not isinstance(fn, Mapping):
        raise _bad_request(
            f"tools[{i}].function", target, "a tool's function must be an object", invalid=True
        )
    fn = cast(Mapping[str, Any], fn)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise _bad_request(
            f"tools[{i}].function.name", target, "a function needs a name", invalid=True
        )
    out: dict[str, Any] = {"name": name}
    if fn.get("description"):
        out["description"] = fn["description"]
    parameters = fn.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise _bad_request(
            f"tools[{i}].function.parameters",
            target,
            "a function's parameters must be an object",
            invalid=True,
        )
    out["input_schema"] = parameters or {"type": "object", "properties": {}}
    return out


def _tool_choice(choice: Any, target: str) -> dict[str, Any] | None:
    if choice is None:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, Mapping):
        fn = cast(Mapping[str, Any], choice).get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn.get("name"):
            return {"type": "tool", "name": cast(Mapping[str, Any], fn)["name"]}
    raise _bad_request("tool_choice", target, f"tool_choice {choice!r} is not understood")


def _messages(messages: list[Any], target: str) -> tuple[Any, list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _bad_request(f"messages[{i}]", target, "a message must be an object")
        message = cast(Mapping[str, Any], message)
        role = message.get("role")
        where = f"messages[{i}]"
        if role in ("system", "developer"):
            system.extend(_blocks(message.get("content"), where, target, text_only=True))
            continue
        if role == "user":
            content: Any = _content(message.get("content"), where, target)
        elif role == "assistant":
            content = _assistant(message, where, target)
            if content is None:
                continue
        elif role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
            }
            inner = message.get("content")
            if inner is not None and inner != "":
                result["content"] = _content(inner, where, target)
            role, content = "user", [result]
        else:
            raise _bad_request(f"{where}.role", target, f"role {role!r} is not available")
        if turns and turns[-1]["role"] == role:
            previous = turns[-1]
            blocks = previous["content"]
            if isinstance(blocks, str):  # the lists here are this function's own: extend them
                blocks = previous["content"] = _as_blocks(blocks)
            blocks.extend(content if isinstance(content, list) else _as_blocks(content))
        else:
            turns.append({"role": role, "content": content})
    last = turns[-1] if turns else None
    if last is not None and last["role"] == "assistant":
        _strip_prefill(last)
        if not last["content"]:
            turns.pop()  # a prefill of whitespace only: the model writes it
    if not system:
        return None, turns
    if any("cache_control" in block for block in system):
        return system, turns
    return "\n\n".join(block["text"] for block in system), turns


def prefill_whitespace(body: Mapping[str, Any]) -> str:
    """The trailing whitespace :func:`translate_request` strips from a chat request's prefill.

    Anthropic rejects a final assistant message that ends in whitespace, so the model writes it
    again; pass this to :class:`AnthropicStreamDecoder` or :func:`parse_message` so the answer
    continues the prefill exactly, as an OpenAI-compatible target's would.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return ""
    last = cast(list[Any], messages)[-1]
    if not isinstance(last, Mapping):
        return ""
    last = cast(Mapping[str, Any], last)
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return ""
    content = last.get("content")
    if isinstance(content, list) and content:
        part = cast(list[Any], content)[-1]
        content = cast(Mapping[str, Any], part).get("text") if isinstance(part, Mapping) else None
    if not isinstance(content, str):
        return ""
    return content[len(content.rstrip()) :]


def _skip(text: str, pending: str, at: int = 0) -> tuple[str, int]:
    """Drop the part of ``pending[at:]`` (stripped prefill whitespace) that ``text`` starts with.

    Returns the rest of ``text`` and how far into ``pending`` the answer has come. A position,
    not a slice of ``pending``: a long prefill answered a character at a time costs linear time.
    """
    n = 0
    while n < len(text) and at + n < len(pending) and text[n] == pending[at + n]:
        n += 1
    if n < len(text):
        return text[n:], len(pending)  # the answer went on: what was not repeated is not skipped
    return "", at + n


def _strip_prefill(message: dict[str, Any]) -> None:
    content = message["content"]
    if isinstance(content, str):
        message["content"] = content.rstrip()
    elif content and content[-1].get("type") == "text":
        text = content[-1]["text"].rstrip()
        if text:
            content[-1] = {**content[-1], "text": text}
        else:
            content.pop()


def _as_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _content(content: Any, where: str, target: str) -> Any:
    if isinstance(content, str):
        return content
    return _blocks(content, where, target)


def _blocks(
    content: Any, where: str, target: str, *, text_only: bool = False
) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise _bad_request(f"{where}.content", target, "content must be a string or a list")
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(cast(list[Any], content)):
        if not isinstance(part, Mapping):
            raise _bad_request(f"{where}.content[{j}]", target, "a content part must be an object")
        part = cast(Mapping[str, Any], part)
        kind = part.get("type")
        if kind in ("text", "refusal"):
            text = part.get(kind) or ""
            if not isinstance(text, str):
                raise _bad_request(
                    f"{where}.content[{j}].{kind}", target, f"{kind} must be a string", invalid=True
                )
            block: dict[str, Any] = {"type": "text", "text": text}
        elif kind == "image_url" and not text_only:
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            block = _image(url, f"{where}.content[{j}]", target)
        else:
            raise _bad_request(
                f"{where}.content[{j}]", target, f"content part {kind!r} is not available here"
            )
        if "cache_control" in part:
            block["cache_control"] = part["cache_control"]
        blocks.append(block)
    return blocks


def _image(url: Any, where: str, target: str) -> dict[str, Any]:
    if not isinstance(url, str) or not url:
        raise _bad_request(where, target, "an image_url part needs a url")
    if url.startswith("data:"):
        head, sep, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        if not sep or encoding != "base64":
            raise _bad_request(where, target, "a data: image URL must be base64")
        source = {"type": "base64", "media_type": media_type, "data": data}
    else:
        source = {"type": "url", "url": url}
    return {"type": "image", "source": source}


def _assistant(message: Mapping[str, Any], where: str, target: str) -> Any:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad_request(f"{where}.tool_calls", target, "tool_calls must be a list", invalid=True)
    content = message.get("content")
    if not calls:
        if isinstance(content, str):
            return content or None
        return _blocks(content, where, target) or None
    blocks = _blocks(content, where, target)
    for k, call in enumerate(cast(list[Any], calls)):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise _bad_request(f"{where}.tool_calls[{k}]", target, "a tool call needs a function")
        fn = cast(Mapping[str, Any], fn)
        arguments = fn.get("arguments") or "{}"
        try:
            value = json.loads(arguments)
        except (TypeError, ValueError, RecursionError):
            value = None
        if not isinstance(value, dict):
            raise _bad_request(
                f"{where}.tool_calls[{k}].function.arguments",
                target,
                "tool call arguments must be a JSON object",
            )
        call_id = cast(Mapping[str, Any], call).get("id")
        blocks.append({"type": "tool_use", "id": call_id, "name": fn.get("name"), "input": value})
    return blocks


# -- responses ------------------------------------------------------------------------------


def finish_reason(stop_reason: str | None) -> str | None:
    """openai's ``finish_reason`` for an Anthropic ``stop_reason`` (unknown ones map to stop)."""
    if stop_reason is None:
        return None
    return _FINISH.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def usage_of(usage: Mapping[str, Any]) -> dict[str, Any]:
    """openai's usage object for Anthropic's: prompt tokens include the cache's.

    A count that is not an integer counts 0.
    """
    cache_read = _count(usage.get("cache_read_input_tokens"))
    prompt = _count(usage.get("input_tokens")) + _count(usage.get("cache_creation_input_tokens"))
    prompt += cache_read
    completion = _count(usage.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cache_read},
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_message(
    raw: bytes,
    *,
    request: httpx.Request,
    target: str,
    response: httpx.Response | None = None,
    prefill_whitespace: str = "",
) -> ChatCompletion:
    """Decode a non-streamed Messages response into a ``ChatCompletion``.

    Text blocks are joined into ``content``, ``tool_use`` blocks become ``tool_calls``, thinking
    becomes the ``reasoning_content`` field; invalid JSON raises ``MalformedResponseError``, and
    content of the wrong shape ``openai.APIResponseValidationError`` naming the target.
    ``prefill_whitespace`` (see :func:`prefill_whitespace`) is dropped from the text's start.
    """
    data = load_json(raw, request=request, target=target, response=response)
    if not isinstance(data, dict):
        return cast(ChatCompletion, construct_type(type_=ChatCompletion, value=data))
    data = cast(dict[str, Any], data)
    if data.get("type") == "error":
        raise _stream_error(data, request)
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    content = data.get("content") or []
    if not isinstance(content, list):
        raise _invalid_response("'content' is not an array", data, request, response, target)
    for i, block in enumerate(cast(list[Any], content)):
        kind = block.get("type") if isinstance(block, dict) else None
        block = cast(dict[str, Any], block)
        if kind in ("text", "thinking"):
            piece = block.get(kind) or ""
            if not isinstance(piece, str):
                what = f"content[{i}].{kind} is not a string"
                raise _invalid_response(what, data, request, response, target)
            (text if kind == "text" else thinking).append(piece)
        elif kind == "tool_use":
            try:
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            except (ValueError, RecursionError):
                what = f"content[{i}].input cannot be encoded"
                raise _invalid_response(what, data, request, response, target) from None
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
    answer = "".join(text)
    if prefill_whitespace:
        answer = _skip(answer, prefill_whitespace)[0]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer if text or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    value: dict[str, Any] = {
        "id": data.get("id"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": data.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(data.get("stop_reason")) or "stop",
            }
        ],
    }
    if isinstance(data.get("usage"), dict):
        value["usage"] = usage_of(data["usage"])
    return cast(ChatCompletion, construct_type(type_=ChatCompletion, value=value))


def _invalid_response(
    what: str,
    data: Any,
    request: httpx.Request,
    response: httpx.Response | None,
    target: str,
) -> APIResponseValidationError:
    if response is None:
        response = httpx.Response(200, request=request)
    message = f"Messages response from target {target!r} is not valid: {what}"
    return APIResponseValidationError(response, data, message=message)  # type: ignore[arg-type]


def _stream_error(data: Mapping[str, Any], request: httpx.Request) -> Exception:
    error = data.get("error")
    kind = error.get("type") if isinstance(error, Mapping) else None
    status = _ERROR_STATUS.get(kind, 500) if isinstance(kind, str) else 500
    response = httpx.Response(status, request=request)
    try:
        raw = json.dumps(data).encode()
    except (ValueError, RecursionError):
        raw = b"{}"
    return make_status_error(response, raw)


class AnthropicStreamDecoder(ChatStreamDecoder):
    """Turn the bytes of a streamed Messages response into ``ChatCompletionChunk`` objects.

    The interface of :class:`~llmroute.protocols.openai.ChatStreamDecoder` (``feed``, ``close``,
    ``done``, ``finished``, ``text``, ``tokens``). The chunks are those an OpenAI stream gives:
    a role chunk first (from ``message_start``), a chunk per text, thinking
    (``reasoning_content``) or tool-input delta (a tool call's id and name come first, on
    ``content_block_start``), a finish chunk (from ``message_delta``), and, with
    ``include_usage`` (``stream_options.include_usage``), a last chunk with no choices and the
    usage. ``message_stop`` sets ``done``; ``ping`` is ignored; an ``error`` event raises the
    openai status error of its type (``overloaded_error`` -> ``InternalServerError``, status 529).
    :attr:`usage` has openai's usage whether asked for or not. ``prefill_whitespace`` (see
    :func:`prefill_whitespace`) is dropped from the start of the text.

    A stream that breaks the protocol raises ``MalformedStreamError``: an event that is not a
    JSON object, a member of the wrong type (a ``delta`` that is not an object, an ``index`` that
    is not an integer, text that is not a string), or a message event before ``message_start``.
    ``finished`` (the answer is whole even if ``message_stop`` never comes) needs the
    ``message_delta`` with the stop reason and no content block left open.
    """

    __slots__ = (
        "_base",
        "_begun",
        "_calls",
        "_include_usage",
        "_open",
        "_pending",
        "_raw_usage",
        "_skipped",
        "_tools",
    )

    def __init__(
        self,
        *,
        request: httpx.Request,
        target: str,
        include_usage: bool = False,
        prefill_whitespace: str = "",
        max_event_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        super().__init__(request=request, target=target, max_event_bytes=max_event_bytes)
        self._include_usage = include_usage
        self._pending = prefill_whitespace
        self._skipped = 0  # how much of it the answer has repeated so far
        self._base: dict[str, Any] = {
            "id": "",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "",
        }
        self._raw_usage: dict[str, Any] = {}
        self._tools: dict[int, int] = {}  # content block index -> tool call index
        self._calls = 0
        self._begun = False  # message_start seen
        self._open: set[int] = set()  # content blocks started and not stopped

    @property
    def usage(self) -> dict[str, Any] | None:
        """openai's usage object for what arrived so far (None before ``message_start``)."""
        return usage_of(self._raw_usage) if self._raw_usage else None

    @property
    def vendor_usage(self) -> dict[str, Any] | None:
        """Anthropic's own usage object so far (cache writes by lifetime included)."""
        return dict(self._raw_usage) if self._raw_usage else None

    def _chunks(self, events: list[ServerSentEvent]) -> list[ChatCompletionChunk]:
        chunks: list[ChatCompletionChunk] = []
        for sse in events:
            try:
                chunk = self._event(sse)
            except Exception as exc:
                if not chunks:
                    self.done = True
                    raise
                self._error = exc
                break
            if chunk is not None:
                chunks.append(chunk)
                self._track(chunk)
                if self._open:
                    self.finished = False  # a stop reason while a block is open: not whole
            if self.done:
                break
        return chunks

    def _make(self, delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk = {**self._base, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None
        return build_chunk(chunk)

    def _malformed(self, what: str, sse: ServerSentEvent) -> MalformedStreamError:
        return MalformedStreamError(what, self.request, target=self.target, line=sse.data)

    def _member(
        self,
        data: Mapping[str, Any],
        name: str,
        kind: type | tuple[type, ...],
        sse: ServerSentEvent,
    ) -> Any:
        """``data[name]``, None if absent or null; MalformedStreamError if not of ``kind``."""
        value = data.get(name)
        if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
            return value
        event = data.get("type")
        where = f"{event} event" if isinstance(event, str) else "Stream event"
        raise self._malformed(f"{where} has a {name!r} of the wrong type", sse)

    def _index(self, data: Mapping[str, Any], sse: ServerSentEvent) -> int:
        index = self._member(data, "index", int, sse)
        return 0 if index is None else index

    def _content_chunk(
        self, holder: Mapping[str, Any], sse: ServerSentEvent
    ) -> ChatCompletionChunk | None:
        """A content chunk of ``holder``'s text (a delta or a block's start), less the prefill
        whitespace the answer repeats (see :func:`_skip`)."""
        text = self._member(holder, "text", str, sse)
        if text and self._skipped < len(self._pending):
            text, self._skipped = _skip(text, self._pending, self._skipped)
        return self._make({"content": text}) if text else None

    def _reasoning_chunk(
        self, holder: Mapping[str, Any], sse: ServerSentEvent
    ) -> ChatCompletionChunk | None:
        thinking = self._member(holder, "thinking", str, sse)
        return self._make({"reasoning_content": thinking}) if thinking else None

    def _event(self, sse: ServerSentEvent) -> ChatCompletionChunk | None:
        try:
            data = json.loads(sse.data)
        except (ValueError, RecursionError) as exc:
            raise self._malformed("Stream event data is not valid JSON", sse) from exc
        if not isinstance(data, dict):
            raise self._malformed("Stream event is not an object", sse)
        data = cast(dict[str, Any], data)
        kind = data.get("type", sse.event)
        if not isinstance(kind, str):
            if kind is None:
                return None
            raise self._malformed("Stream event has a 'type' that is not a string", sse)
        if kind in _MESSAGE_EVENTS and not self._begun:
            raise self._malformed(f"{kind} event before message_start", sse)
        if kind == "content_block_delta":
            delta = self._member(data, "delta", dict, sse) or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                return self._content_chunk(delta, sse)
            if dtype == "input_json_delta":
                fragment = self._member(delta, "partial_json", str, sse)
                call = self._tools.get(self._index(data, sse))
                if not fragment or call is None:
                    return None
                tool = {"index": call, "function": {"arguments": fragment}}
                return self._make({"tool_calls": [tool]})
            if dtype == "thinking_delta":
                return self._reasoning_chunk(delta, sse)
            return None  # signature_delta, citations_delta: nothing openai has
        if kind == "content_block_start":
            block = self._member(data, "content_block", dict, sse) or {}
            index = self._index(data, sse)
            self._open.add(index)
            btype = block.get("type")
            if btype == "tool_use":
                call_id = self._member(block, "id", str, sse)
                name = self._member(block, "name", str, sse)
                call_index = self._tools[index] = self._calls
                self._calls += 1
                call = {
                    "index": call_index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                return self._make({"tool_calls": [call]})
            if btype == "text":
                return self._content_chunk(block, sse)
            if btype == "thinking":
                return self._reasoning_chunk(block, sse)
            return None
        if kind == "content_block_stop":
            self._open.discard(self._index(data, sse))
            return None
        if kind == "ping":
            return None
        if kind == "message_start":
            message = self._member(data, "message", dict, sse) or {}
            usage = self._member(message, "usage", dict, sse) or {}
            self._begun = True
            self._base["id"] = self._member(message, "id", str, sse) or ""
            self._base["model"] = self._member(message, "model", str, sse) or ""
            self._base["created"] = int(time.time())
            self._raw_usage.update(usage)
            return self._make({"role": "assistant", "content": ""})
        if kind == "message_delta":
            usage = self._member(data, "usage", dict, sse)
            if usage is not None:
                self._raw_usage.update({k: v for k, v in usage.items() if v is not None})
            delta = self._member(data, "delta", dict, sse) or {}
            return self._make({}, finish_reason(delta.get("stop_reason")) or "stop")
        if kind == "message_stop":
            self.done = True
            if not self._include_usage:
                return None
            chunk = {**self._base, "choices": [], "usage": usage_of(self._raw_usage)}
            return build_chunk(chunk)
        if kind == "error":
            raise _stream_error(data, self.request)
        return None  # event types added later: ignored, as Anthropic's docs ask


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
