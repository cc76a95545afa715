"""Anthropic's Messages protocol, the request: a chat completions body (OpenAI's shape) translated
into a native ``POST /v1/messages`` body (:func:`translate_request`), refused with a
``openai.BadRequestError`` naming the parameter where the Messages API cannot express it, and
the trailing whitespace of a prefill (:func:`prefill_whitespace`) that the answer repeats.
:mod:`llmroute.protocols.anthropic` (which re-exports these) describes the mapping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, cast

import httpx
from openai import BadRequestError

__all__ = ["DEFAULT_MAX_TOKENS", "prefill_whitespace", "translate_request"]

DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` sent when the chat request sets neither ``max_tokens`` nor
``max_completion_tokens`` (the Messages API requires one)."""

_PASSED = ("top_k", "thinking")


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
