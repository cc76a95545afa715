"""The simulator's OpenAI Responses API (``POST /v1/responses``): requests, objects, events.

Pure wire logic, no I/O: :class:`ResponsePlan` is what one request answers (text, JSON that fits
``text.format``'s schema, or one function call), :class:`ResponseEvents` writes its SSE events as
OpenAI sends them, and :class:`IssuedIds` remembers the response ids a simulator issued so that
``previous_response_id`` is accepted only where it was issued. The app (``_app``) adds latency,
faults and the stream's pacing.

A streamed text answer is ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per token, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and ``response.completed``
(``response.incomplete`` when ``max_output_tokens`` cut it). A function call has
``response.function_call_arguments.delta`` / ``.done`` in place of the content part and text
events. Every event has ``type`` and ``sequence_number`` and is sent with an ``event:`` line.
"""

from __future__ import annotations

import json
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import llmroute.testing._reply as _reply

__all__ = ["IssuedIds", "ResponseEvents", "ResponsePlan", "validate"]


class IssuedIds:
    """The ids of the last ``size`` responses issued (an LRU: a lookup refreshes an id)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, id_: str) -> None:
        self._ids[id_] = None
        self._ids.move_to_end(id_)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def __contains__(self, id_: object) -> bool:
        if id_ in self._ids:
            assert isinstance(id_, str)
            self._ids.move_to_end(id_)
            return True
        return False

    def __len__(self) -> int:
        return len(self._ids)


def validate(req: Any) -> tuple[str, str | None] | None:
    """What is wrong with a request body (a message and the param), or None."""
    if not isinstance(req, dict):
        return "The request body must be a JSON object.", None
    if not isinstance(req.get("model"), str) or not req["model"]:
        return "Missing required parameter: 'model'.", "model"
    value = req.get("input")
    if value is None or not isinstance(value, str | list):
        return "Missing required parameter: 'input'.", "input"
    limit = req.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or limit < 16):
        msg = f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {limit} instead."  # noqa: E501
        return msg, "max_output_tokens"
    return None


def _messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as chat messages (for the reply seed, token counts, tool choice)."""
    out: list[dict[str, Any]] = []
    if isinstance(req.get("instructions"), str):
        out.append({"role": "system", "content": req["instructions"]})
    items = req["input"]
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role", "user"), "content": item.get("content")})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append({"role": "tool", "content": text})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": item.get("arguments", "")})
    return out


def _tools(req: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """The request's function tools and tool_choice in chat completions' shape."""
    tools = [
        {"type": "function", "function": t}
        for t in req.get("tools") or []
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    choice = req.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return tools, choice


@dataclass
class ResponsePlan:
    """What one Responses request answers."""

    model: str
    seed: int
    input_tokens: int
    pieces: list[str]
    incomplete: bool
    req: dict[str, Any]
    tool: dict[str, Any] | None = None
    id: str = ""
    item_id: str = ""
    created_at: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def build(cls, req: dict[str, Any], reply_tokens: int) -> ResponsePlan:
        model: str = req["model"]
        messages = _messages(req)
        prior = req.get("previous_response_id")
        seed = _reply.reply_seed(model, [*messages, {"previous_response_id": prior}])
        n_input = _reply.prompt_tokens(messages)
        unique = random.getrandbits(32)
        tools, choice = _tools(req)
        tool = _reply.pick_tool(tools, choice, messages)
        if tool is not None:
            pieces = _reply.split_fragments(_reply.tool_arguments(tool, seed))
            item_id = f"fc_{seed:016x}{unique:08x}"
        else:
            fmt = (
                (req.get("text") or {}).get("format") if isinstance(req.get("text"), dict) else None
            )
            structured = _reply.structured_text(fmt, messages, seed)
            if structured is not None:
                pieces = _reply.split_fragments(structured)
            else:
                pieces = list(_reply.full_reply(seed, reply_tokens))
            item_id = f"msg_{seed:016x}{unique:08x}"
        limit = req.get("max_output_tokens")
        incomplete = isinstance(limit, int) and len(pieces) > limit
        if incomplete:
            pieces = pieces[:limit]
        return cls(
            model,
            seed,
            n_input,
            pieces,
            incomplete,
            req,
            tool,
            f"resp_{seed:016x}{unique:08x}",
            item_id,
        )

    @property
    def call_id(self) -> str:
        return f"call_{self.seed:016x}"

    @property
    def status(self) -> str:
        return "incomplete" if self.incomplete else "completed"

    def item(self, done: bool) -> dict[str, Any]:
        """The output item, as added (empty, in progress) or done."""
        status = self.status if done else "in_progress"
        if self.tool is not None:
            return {
                "id": self.item_id,
                "type": "function_call",
                "status": status,
                "arguments": "".join(self.pieces) if done else "",
                "call_id": self.call_id,
                "name": self.tool.get("name", ""),
            }
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "content": [self.part(done)] if done else [],
            "role": "assistant",
        }

    def part(self, done: bool) -> dict[str, Any]:
        text = "".join(self.pieces) if done else ""
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def response(self, status: str, *, output: bool = True) -> dict[str, Any]:
        """The response object: as created (no output, no usage) or final."""
        req = self.req
        final = status in ("completed", "incomplete")
        text: dict[str, Any] = req["text"] if isinstance(req.get("text"), dict) else {}
        usage = None
        if final:
            usage = {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": len(self.pieces),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + len(self.pieces),
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "max_tool_calls": None,
            "model": self.model,
            "output": [self.item(True)] if final and output else [],
            "parallel_tool_calls": req.get("parallel_tool_calls", True),
            "previous_response_id": req.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": req.get("store", True),
            "temperature": req.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium", **text},
            "tool_choice": req.get("tool_choice", "auto"),
            "tools": req.get("tools") or [],
            "top_logprobs": 0,
            "top_p": req.get("top_p", 1.0),
            "truncation": req.get("truncation", "disabled"),
            "usage": usage,
            "user": None,
            "metadata": req.get("metadata") or {},
        }


def _sse(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class ResponseEvents:
    """The SSE events of one streamed response, numbered in order."""

    def __init__(self, plan: ResponsePlan) -> None:
        self.plan = plan
        self.seq = 0
        tool = plan.tool is not None
        self._kind = "function_call_arguments" if tool else "output_text"
        where = f'"item_id":"{plan.item_id}","output_index":0'
        if not tool:
            where += ',"content_index":0'
        self._head = f'{{"type":"response.{self._kind}.delta","sequence_number":'
        self._mid = f',{where},"delta":'
        self._tail = "}" if tool else ',"logprobs":[]}'

    def event(self, data: dict[str, Any]) -> bytes:
        data = {"type": data.pop("type"), "sequence_number": self.seq, **data}
        self.seq += 1
        return _sse(data)

    def opening(self) -> list[bytes]:
        """``response.created`` and ``response.in_progress`` (sent before the first token)."""
        plan = self.plan
        return [
            self.event({"type": "response.created", "response": plan.response("in_progress")}),
            self.event({"type": "response.in_progress", "response": plan.response("in_progress")}),
        ]

    def first(self) -> list[bytes]:
        """The output item added, and its content part (text)."""
        plan = self.plan
        out = [
            self.event(
                {"type": "response.output_item.added", "output_index": 0, "item": plan.item(False)}
            )
        ]
        if plan.tool is None:
            added = {"type": "response.content_part.added", "item_id": plan.item_id}
            added |= {"output_index": 0, "content_index": 0, "part": plan.part(False)}
            out.append(self.event(added))
        return out

    def delta(self, piece: str) -> bytes:
        """One token (a text delta or an arguments fragment)."""
        data = f"{self._head}{self.seq}{self._mid}{json.dumps(piece)}{self._tail}"
        self.seq += 1
        return f"event: response.{self._kind}.delta\ndata: {data}\n\n".encode()

    def closing(self) -> list[bytes]:
        """The done events of the part and item, then ``response.completed`` (or incomplete)."""
        plan = self.plan
        full = "".join(plan.pieces)
        out: list[bytes] = []
        at = {"item_id": plan.item_id, "output_index": 0}
        if plan.tool is None:
            text_done = {"type": "response.output_text.done", **at, "content_index": 0}
            out.append(self.event(text_done | {"text": full, "logprobs": []}))
            part_done = {"type": "response.content_part.done", **at, "content_index": 0}
            out.append(self.event(part_done | {"part": plan.part(True)}))
        else:
            args_done = {"type": "response.function_call_arguments.done", **at}
            out.append(
                self.event(args_done | {"name": plan.tool.get("name", ""), "arguments": full})
            )
        item_done = {"type": "response.output_item.done", "output_index": 0}
        out.append(self.event(item_done | {"item": plan.item(True)}))
        status = plan.status
        out.append(self.event({"type": f"response.{status}", "response": plan.response(status)}))
        return out

    def error(self) -> bytes:
        """An in-stream ``error`` event (a server error after some tokens)."""
        msg = "The server had an error while processing your request."
        data = {"type": "error", "code": "server_error", "message": msg, "param": None}
        return self.event(data)
