"""Deterministic replies and OpenAI wire objects for the simulator."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import struct
import time
from typing import Any

from ._schema import find_schema, instance

SYSTEM_FINGERPRINT = "fp_llmroute_sim"

_VOCAB = tuple(
    """the a of to and in is it that for on with as was at by be this from or an are not
    but have one all can will more time when there so some what up out about into than
    then them these its only new other could also two first way may like over such our
    fast token stream route cache warm edge model reply prompt answer server client
    latency packet vendor pool hedge race queue batch prefix""".split()
)
_MARK = "__llmroute_sim_mark__"


def message_text(message: dict[str, Any]) -> str:
    """The text of a message's content (a string or a list of text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """A rough, deterministic prompt token count (words plus a few per message)."""
    return sum(len(message_text(m).split()) + 3 for m in messages if isinstance(m, dict))


def split_prefill(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Split off a trailing assistant message (an assistant prefill)."""
    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        return messages[:-1], message_text(messages[-1])
    return messages, None


def reply_seed(model: str, messages: list[dict[str, Any]]) -> int:
    """A 64-bit seed from the model name and the messages (a trailing prefill excluded)."""
    prompt, _ = split_prefill(messages)
    blob = json.dumps([model, prompt], sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "big")


@functools.lru_cache(maxsize=256)
def full_reply(seed: int, n_tokens: int) -> tuple[str, ...]:
    """The full reply as tokens: words, each after the first with its leading space."""
    if n_tokens <= 0:
        return ()
    words = random.Random(seed).choices(_VOCAB, k=n_tokens)
    return (words[0], *(" " + w for w in words[1:]))


def continue_after(tokens: tuple[str, ...], prefix: str) -> list[str] | None:
    """The rest of the reply after `prefix` (greedy decoding), or None if it is no prefix."""
    if not "".join(tokens).startswith(prefix):
        return None
    used = 0
    for i, tok in enumerate(tokens):
        if used + len(tok) > len(prefix):
            return [tok[len(prefix) - used :], *tokens[i + 1 :]]
        used += len(tok)
    return []


def split_like(tokens: tuple[str, ...], prefix: str) -> list[str]:
    """``prefix`` cut where ``tokens`` (whose text begins with it) cut it: the pieces a model
    streams when it repeats the prefix it was given."""
    pieces: list[str] = []
    used = 0
    for tok in tokens:
        if used >= len(prefix):
            break
        pieces.append(prefix[used : used + len(tok)])
        used += len(tok)
    return pieces


def pick_tool(
    tools: list[Any], tool_choice: Any, messages: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """The function to call, or None for a text answer.

    ``tool_choice`` ``"none"`` means text; a named function is that function; ``"required"``
    is a call. Otherwise (``"auto"``, absent) a conversation whose last message is a tool's
    result gets a text answer (the model has what it asked for), a last user message that
    names a function calls that one, and any other the first function.
    """
    if tool_choice == "none" or not tools:
        return None
    functions = [t["function"] for t in tools if isinstance(t, dict) and "function" in t]
    if not functions:
        return None
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        for fn in functions:
            if fn.get("name") == name:
                return fn
    if tool_choice != "required" and messages:
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        if last.get("role") == "tool":
            return None
        text = message_text(last)
        for fn in functions:
            if fn.get("name") and fn["name"] in text:
                return fn
    return functions[0]


def tool_arguments(function: dict[str, Any], seed: int) -> str:
    """Deterministic JSON arguments that fit the function's parameter schema."""
    return json.dumps(instance(function.get("parameters") or {"type": "object"}, seed ^ 0x5EED))


def structured_text(response_format: Any, messages: list[dict[str, Any]], seed: int) -> str | None:
    """The JSON answer a response format asks for, or None for plain text.

    ``json_schema`` (chat's ``{"json_schema": {"schema": ...}}`` or the Responses API's flat
    ``{"schema": ...}``): an instance of the schema. ``json_object``: an instance of the first
    JSON schema spelled out in the messages (as instructor's JSON mode sends it), else a small
    object.
    """
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or response_format
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return json.dumps(instance(schema or {"type": "object"}, seed))
    if kind == "json_object":
        for message in reversed(messages):
            schema = find_schema(message_text(message)) if isinstance(message, dict) else None
            if schema is not None:
                return json.dumps(instance(schema, seed))
        words = full_reply(seed, 4)
        return json.dumps({"answer": "".join(words).strip()})
    return None


def split_fragments(text: str, size: int = 8) -> list[str]:
    """Cut a string into fragments of `size` characters (argument deltas)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def group(pieces: list[str], size: int) -> list[str]:
    """``pieces`` joined ``size`` at a time (several tokens per streamed delta)."""
    if size <= 1:
        return pieces
    return ["".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]


def usage(
    prompt: int, completion: int, reasoning: int = 0, cached: int = 0, cache: str = ""
) -> dict[str, Any]:
    """OpenAI's usage; ``reasoning`` tokens are part of ``completion`` and named in its
    details, as DeepSeek and OpenAI report them. ``cached`` prompt tokens (part of ``prompt``)
    are reported as the ``cache`` family does (``Profile.prompt_cache``): ``"openai"`` in
    ``prompt_tokens_details.cached_tokens`` (always present, as OpenAI sends it),
    ``"deepseek"`` as ``prompt_cache_hit_tokens`` and ``prompt_cache_miss_tokens``."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if reasoning:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if cache == "openai":
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    elif cache == "deepseek":
        body["prompt_cache_hit_tokens"] = cached
        body["prompt_cache_miss_tokens"] = prompt - cached
    return body


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class ChunkWriter:
    """Builds the SSE events of one streamed chat completion."""

    def __init__(self, model: str, include_usage: bool, seed: int) -> None:
        self.id = f"chatcmpl-{seed:016x}{random.getrandbits(32):08x}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self._content = self._template({"content": _MARK})
        self._args = self._template(
            {"tool_calls": [{"index": 0, "function": {"arguments": _MARK}}]}
        )

    def _base(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _choice(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def _template(self, delta: dict[str, Any]) -> tuple[bytes, bytes]:
        text = _dumps(self._base([self._choice(delta)]))
        head, tail = text.split(f'"{_MARK}"')
        return b"data: " + head.encode(), tail.encode() + b"\n\n"

    def event(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return b"data: " + _dumps(self._base([self._choice(delta, finish)])).encode() + b"\n\n"

    def content(self, text: str, usage_: dict[str, Any] | None = None) -> bytes:
        if usage_ is not None:
            chunk = self._base([self._choice({"content": text})])
            chunk["usage"] = usage_
            return b"data: " + _dumps(chunk).encode() + b"\n\n"
        head, tail = self._content
        return head + _dumps(text).encode() + tail

    def arguments(self, fragment: str) -> bytes:
        head, tail = self._args
        return head + _dumps(fragment).encode() + tail

    def usage_event(self, usage_: dict[str, Any]) -> bytes:
        chunk = self._base([])
        chunk["usage"] = usage_
        return b"data: " + _dumps(chunk).encode() + b"\n\n"


def completion(
    model: str,
    seed: int,
    message: dict[str, Any],
    finish: str,
    usage_: dict[str, Any],
) -> dict[str, Any]:
    """A non-streamed chat.completion object."""
    return {
        "id": f"chatcmpl-{seed:016x}{random.getrandbits(32):08x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage_,
    }


# -- legacy completions, embeddings, models ---------------------------------------------------

EMBEDDING_DIMENSIONS = 8
MAX_EMBEDDING_DIMENSIONS = 3072
"""The most ``dimensions`` an embeddings request may ask (OpenAI's largest model's)."""


def prompt_texts(prompt: Any) -> list[str]:
    """The prompts of a completions request: a string, a list of strings, token lists."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return [" ".join(str(p) for p in prompt)]
    if isinstance(prompt, list):
        return [p if isinstance(p, str) else " ".join(str(t) for t in p) for p in prompt]
    return [""]


def text_seed(model: str, text: str) -> int:
    """A 64-bit seed from a model name and one prompt or input text."""
    digest = hashlib.sha256(json.dumps([model, text]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def text_completion(
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, int] | None,
    *,
    id_: str | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` object (whole, or one streamed chunk)."""
    body: dict[str, Any] = {
        "id": id_ or f"cmpl-{random.getrandbits(64):016x}",
        "object": "text_completion",
        "created": created or int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def text_choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


def embedding_vector(model: str, text: str, dimensions: int) -> list[float]:
    """A deterministic unit-scale vector for ``text``; every value is exact in float32."""
    rng = random.Random(text_seed(model, text))
    raw = struct.pack(f"<{dimensions}f", *(rng.uniform(-1.0, 1.0) for _ in range(dimensions)))
    return list(struct.unpack(f"<{dimensions}f", raw))


def embedding_base64(vector: list[float]) -> str:
    """OpenAI's base64 form: the little-endian float32 bytes of the vector."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 1_700_000_000, "owned_by": "llmroute-sim"}
