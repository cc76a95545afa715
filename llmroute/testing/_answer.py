"""What one simulated request answers (``_Reply``: text tokens or tool-call argument fragments,
its usage, its whole completion) and how a streamed answer is framed: chat completion chunks
(``_ChatStream``) or Responses API events (``_ResponsesStream``), both a ``_Wire``. The
simulator (:mod:`._app`) and the SGLang stand-in answer with them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import llmroute.testing._reply as _reply
import llmroute.testing._responses as _responses


class _Wire(Protocol):
    """The SSE framing of one streamed answer (chat chunks or Responses events)."""

    def opening(self) -> list[bytes]: ...
    def first(self) -> list[bytes]: ...
    def piece(self, text: str) -> bytes: ...
    def error(self) -> bytes: ...
    def malformed(self) -> bytes: ...
    def closing(self) -> list[bytes]: ...


class _ChatStream:
    """Chat completion chunks: the role chunk, one chunk per token (or per
    ``Profile.tokens_per_chunk``), the finish reason chunk, the usage chunk (when asked) and
    ``[DONE]``, the last three in one frame. With ``stream_options.continuous_usage_stats``
    (vLLM's and SGLang's option), every content chunk also carries the usage so far."""

    def __init__(self, plan: _Reply, include_usage: bool, continuous: bool = False) -> None:
        self.plan = plan
        self.include_usage = include_usage
        self.continuous = continuous
        self.sent = 0  # tokens of plan.pieces sent so far
        self.writer = _reply.ChunkWriter(plan.model, include_usage, plan.seed)

    def opening(self) -> list[bytes]:
        return []

    def first(self) -> list[bytes]:
        thinking = [
            self.writer.event({"content": None, "reasoning_content": word})
            for word in self.plan.reasoning
        ]
        return [self.writer.event(self.plan.first_delta()), *thinking]

    def piece(self, text: str) -> bytes:
        if self.plan.tool:
            return self.writer.arguments(text)
        if not self.continuous:
            return self.writer.content(text)
        pieces, length = self.plan.pieces, 0
        while self.sent < len(pieces) and length < len(text):  # the tokens this text joins
            length += len(pieces[self.sent])
            self.sent += 1
        done = max(0, self.sent - self.plan.uncounted)
        return self.writer.content(text, self.plan.usage(done))

    def error(self) -> bytes:
        msg = "The server had an error while processing your request."
        return (
            b"data: "
            + json.dumps({"error": {"message": msg, "type": "server_error"}}).encode()
            + b"\n\n"
        )

    def malformed(self) -> bytes:
        return b"data: {not json\n\n"

    def closing(self) -> list[bytes]:
        tail = self.writer.event({}, self.plan.finish)
        if self.include_usage:
            tail += self.writer.usage_event(self.plan.usage(self.plan.generated))
        return [tail + b"data: [DONE]\n\n"]


class _ResponsesStream:
    """Responses API events, one per frame (see :mod:`._responses`)."""

    def __init__(self, plan: _responses.ResponsePlan) -> None:
        self.events = _responses.ResponseEvents(plan)

    def opening(self) -> list[bytes]:
        return self.events.opening()

    def first(self) -> list[bytes]:
        return self.events.first()

    def piece(self, text: str) -> bytes:
        return self.events.delta(text)

    def error(self) -> bytes:
        return self.events.error()

    def malformed(self) -> bytes:
        return b"event: response.output_text.delta\ndata: {not json\n\n"

    def closing(self) -> list[bytes]:
        return self.events.closing()


@dataclass
class _Reply:
    """What one request will answer: text tokens or tool-call argument fragments."""

    model: str
    seed: int
    prompt_tokens: int
    pieces: list[str]
    finish: str
    tool: dict[str, Any] | None = None
    call_id: str = ""
    echoed: int = 0
    """Pieces at the start that repeat the prefix (``Profile.echo_prefix``): not generated."""
    echo_counted: bool = False
    """The echoed pieces count in the usage all the same (``Profile.echo_counted``)."""
    reasoning: tuple[str, ...] = ()
    """Reasoning words streamed before the answer (``Profile.reasoning_tokens``)."""
    cached: int = 0
    """Prompt tokens read from the simulated prompt cache (``Profile.prompt_cache``)."""
    cache: str = ""
    """How the usage reports them (``Profile.prompt_cache``)."""

    def usage(self, answered: int) -> dict[str, Any]:
        """The usage after ``answered`` answer tokens, the reasoning streamed first included."""
        thought = len(self.reasoning)
        return _reply.usage(
            self.prompt_tokens, answered + thought, thought, self.cached, self.cache
        )

    @property
    def uncounted(self) -> int:
        """The pieces at the start the usage leaves out (an echoed prefix is the prompt's)."""
        return 0 if self.echo_counted else self.echoed

    @property
    def generated(self) -> int:
        """The completion tokens of the answer."""
        return len(self.pieces) - self.uncounted

    @classmethod
    def build(
        cls,
        req: dict[str, Any],
        model: str,
        messages: list[dict[str, Any]],
        reply_tokens: int,
        token_bytes: int = 0,
        *,
        echo: bool = False,
        echo_counted: bool = False,
        reasoning: tuple[str, ...] = (),
    ) -> _Reply:
        seed = _reply.reply_seed(model, messages)
        _, prefill = _reply.split_prefill(messages)
        n_prompt = _reply.prompt_tokens(messages)
        tool = _reply.pick_tool(req.get("tools") or [], req.get("tool_choice"), messages)
        if tool is not None:
            args = _reply.tool_arguments(tool, seed)
            return cls(
                model,
                seed,
                n_prompt,
                _reply.split_fragments(args),
                "tool_calls",
                tool,
                f"call_{seed:016x}",
            )
        structured = _reply.structured_text(req.get("response_format"), messages, seed)
        if structured is not None:
            full = tuple(_reply.split_fragments(structured))
        else:
            full = _reply.full_reply(seed, reply_tokens)
            if token_bytes > 0:
                full = tuple(t.ljust(token_bytes, "x") for t in full)
        pieces = list(full)
        echoed: list[str] = []
        if prefill is not None:
            rest = _reply.continue_after(full, prefill)
            if rest is not None:
                pieces = rest
                if echo and prefill:
                    echoed = _reply.split_like(full, prefill)
        finish = "stop"
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        if limit is not None and len(pieces) > limit:
            pieces, finish = pieces[:limit], "length"
        return cls(
            model,
            seed,
            n_prompt,
            echoed + pieces,
            finish,
            echoed=len(echoed),
            echo_counted=echo_counted,
            reasoning=reasoning,
        )

    def first_delta(self) -> dict[str, Any]:
        if self.tool is None:
            return {"role": "assistant", "content": ""}
        call = {
            "index": 0,
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.tool.get("name", ""), "arguments": ""},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if self.tool is None:
            message["content"] = "".join(self.pieces)
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
        else:
            message["tool_calls"] = [
                {
                    "id": self.call_id,
                    "type": "function",
                    "function": {
                        "name": self.tool.get("name", ""),
                        "arguments": "".join(self.pieces),
                    },
                }
            ]
        return _reply.completion(
            self.model, self.seed, message, self.finish, self.usage(self.generated)
        )
