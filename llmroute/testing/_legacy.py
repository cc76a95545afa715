"""The simulator's legacy completions and embeddings: answered at once (no latency, no stream
faults; :class:`._faults.FaultDecisions` answers their status faults first)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import llmroute.testing._reply as _reply

from ._counters import SimCounters
from ._profile import Profile
from ._requests import _validate_other
from ._wire import Send, error_body, open_event_stream, respond

__all__ = ["embeddings", "text_completion"]


async def text_completion(
    req: Any,
    send: Send,
    rid: str,
    *,
    profile: Profile,
    rng: random.Random,
    models: dict[str, None],
    counters: SimCounters,
) -> None:
    """Answer ``POST /v1/completions``: one reply per prompt, whole or streamed a token an
    event."""
    problem = _validate_other(req, "prompt")
    if problem is not None:
        await respond(send, 400, error_body(problem, "invalid_request_error"), rid)
        return
    model: str = req["model"]
    models.setdefault(model)
    limit = req.get("max_tokens")
    n_tokens = profile.reply_tokens if limit is None else min(limit, 4096)
    finish = "stop" if limit is None or limit >= profile.reply_tokens else "length"
    prompts = _reply.prompt_texts(req.get("prompt"))
    replies = [
        _reply.full_reply(_reply.text_seed(model, p), min(n_tokens, profile.reply_tokens))
        for p in prompts
    ]
    prompt_tokens = sum(len(p.split()) for p in prompts)
    usage = _reply.usage(prompt_tokens, sum(len(r) for r in replies))
    if not req.get("stream"):
        choices = [_reply.text_choice(i, "".join(r), finish) for i, r in enumerate(replies)]
        body = _reply.text_completion(model, choices, usage)
        await respond(send, 200, json.dumps(body).encode(), rid)
        return
    await open_event_stream(send, rid, b"x-request-id")
    counters.count("streams_started")
    id_, created = f"cmpl-{rng.getrandbits(64):016x}", int(time.time())

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        chunk = _reply.text_completion(model, choices, usage, id_=id_, created=created)
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def emit(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    for i, reply in enumerate(replies):
        for token in reply:
            await emit(event([_reply.text_choice(i, token, None)]))
        await emit(event([_reply.text_choice(i, "", finish)]))
    if (req.get("stream_options") or {}).get("include_usage"):
        await emit(event([], usage))
    counters.count("streams_completed")
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def embeddings(req: Any, send: Send, rid: str, models: dict[str, None]) -> None:
    """Answer ``POST /v1/embeddings``: a vector per input, the same for the same text."""
    problem = _validate_other(req, "input")
    fmt = req.get("encoding_format", "float") if isinstance(req, dict) else None
    if problem is None and fmt not in ("float", "base64"):
        problem = f"'{fmt}' is not one of ['float', 'base64'] - 'encoding_format'"
    dims = req.get("dimensions") if isinstance(req, dict) else None
    if problem is None and dims is not None and (not isinstance(dims, int) or dims < 1):
        problem = "'dimensions' must be a positive integer"
    if problem is None and dims is not None and dims > _reply.MAX_EMBEDDING_DIMENSIONS:
        problem = f"'dimensions' must be at most {_reply.MAX_EMBEDDING_DIMENSIONS}"
    if problem is not None:
        await respond(send, 400, error_body(problem, "invalid_request_error"), rid)
        return
    model: str = req["model"]
    models.setdefault(model)
    texts = _reply.prompt_texts(req["input"])
    data: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        vector = _reply.embedding_vector(model, text, dims or _reply.EMBEDDING_DIMENSIONS)
        value = _reply.embedding_base64(vector) if fmt == "base64" else vector
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(len(t.split()) for t in texts)
    body = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    await respond(send, 200, json.dumps(body).encode(), rid)
