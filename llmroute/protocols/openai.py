"""The OpenAI wire protocol (chat completions, Responses, completions, embeddings): decode
streamed and whole responses, and the protocol's adapter.

Answers are the ``openai`` package's own classes, built as openai builds them (fast, in
:mod:`llmroute.protocols._construct`); a chat stream is read by :class:`ChatStreamDecoder`
(:mod:`llmroute.protocols._decoder`, re-exported here), the Responses and completions streams by
its subclasses below. This module knows nothing of routing or sockets.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Any, cast

import httpx
import pydantic
from openai import APIError, APIResponseValidationError
from openai._models import construct_type
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from .._errors import quote
from .._prices import UsageFields
from ..transport import ServerSentEvent
from ._adapter import ProtocolAdapter
from ._construct import _shape, _Slow, build_chunk
from ._decoder import ChatStreamDecoder, _stream_error, is_token_chunk

__all__ = [
    "OPENAI",
    "REQUEST_ID_HEADER",
    "ChatStreamDecoder",
    "CompletionStreamDecoder",
    "MalformedResponseError",
    "OpenAIAdapter",
    "ResponsesStreamDecoder",
    "build_chunk",
    "is_output",
    "is_preamble_chunk",
    "is_token_chunk",
    "load_json",
    "parse_body",
    "parse_chat_completion",
    "parse_response",
    "rename_limit",
    "response_text_delta",
]

REQUEST_ID_HEADER = "x-request-id"
"""The response header with the vendor's id of a request (OpenAI and most compatible APIs)."""


class MalformedResponseError(json.JSONDecodeError, APIResponseValidationError):
    """Raised when a target answers 200 with a body that is not valid JSON.

    openai raises the bare ``json.JSONDecodeError`` here, so this is one too, and also an
    ``openai.APIResponseValidationError`` that names the target and quotes the body.
    """

    def __init__(
        self,
        exc: json.JSONDecodeError,
        request: httpx.Request,
        *,
        target: str,
        response: httpx.Response | None = None,
    ) -> None:
        json.JSONDecodeError.__init__(self, exc.msg, exc.doc, exc.pos)
        message = (
            f"Response body is not valid JSON ({exc}) from target {target!r}: {quote(exc.doc)}"
        )
        self.args = (message,)
        self.message = message
        self.request = request  # type: ignore[assignment]
        self.body = exc.doc
        self.code = self.param = self.type = None
        self.response = response  # type: ignore[assignment]
        self.status_code = response.status_code if response is not None else 200
        self.target = target

    def __str__(self) -> str:
        return self.message


def load_json(
    raw: bytes,
    *,
    request: httpx.Request,
    target: str,
    response: httpx.Response | None = None,
) -> Any:
    """A response body's JSON; :class:`MalformedResponseError` naming ``target`` if it is not."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MalformedResponseError(exc, request, target=target, response=response) from None
    except UnicodeDecodeError as exc:
        doc = raw.decode("utf-8", "replace")
        err = json.JSONDecodeError(f"invalid text encoding: {exc.reason}", doc, exc.start)
        raise MalformedResponseError(err, request, target=target, response=response) from None
    except (ValueError, RecursionError) as exc:  # nested too deeply, an int of 4300+ digits
        doc = raw.decode("utf-8", "replace")
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        err = json.JSONDecodeError(what, doc, 0)
        raise MalformedResponseError(err, request, target=target, response=response) from None


def parse_chat_completion(
    raw: bytes,
    *,
    request: httpx.Request,
    target: str,
    response: httpx.Response | None = None,
) -> ChatCompletion:
    """Decode a non-streamed chat completion body, as openai does for a JSON response.

    Invalid JSON raises :class:`MalformedResponseError` naming ``target``.
    """
    return parse_body(raw, ChatCompletion, request=request, target=target, response=response)


def is_output(item: object) -> bool:
    """Whether a chat chunk (see :func:`is_token_chunk`) or a Responses API stream event (a
    ``*.delta`` event: text, refusal, function-call arguments, reasoning) carries output."""
    if type(item) is ChatCompletionChunk:
        return is_token_chunk(item)
    kind = getattr(item, "type", None)
    return type(kind) is str and kind.endswith(".delta")


def is_preamble_chunk(chunk: ChatCompletionChunk) -> bool:
    """Whether a chunk only opens an answer (a role, empty content): no token, no
    ``finish_reason``, no usage. A stream sent again repeats it, so a caller must not see it twice.
    """
    if is_token_chunk(chunk):
        return False
    try:
        if getattr(chunk, "usage", None) is not None:
            return False
        return all(choice.finish_reason is None for choice in chunk.choices)
    except (AttributeError, TypeError):
        return False


# Other endpoints (completions, embeddings, models): whole bodies and the completions stream.

_M = typing.TypeVar("_M")


def parse_body(
    raw: bytes,
    cls: type[_M],
    *,
    request: httpx.Request,
    target: str,
    response: httpx.Response | None = None,
) -> _M:
    """Decode a JSON response body as ``cls`` without validation, as openai does.

    Invalid JSON raises :class:`MalformedResponseError` naming ``target``.
    """
    data = load_json(raw, request=request, target=target, response=response)
    if type(data) is dict and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
        try:
            return cast(_M, _shape(cls).construct(data))
        except _Slow:
            pass
    return cast(_M, construct_type(type_=cls, value=data))


class CompletionStreamDecoder(ChatStreamDecoder):
    """Turn the bytes of a streamed (legacy) completion into ``openai.types.Completion`` chunks.

    The same rules as :class:`ChatStreamDecoder` (``[DONE]``, ``error`` objects, malformed data);
    ``text`` is choice 0's text so far and ``finished`` says every choice had a ``finish_reason``.
    """

    def _chunk(self, sse: ServerSentEvent, payload: str) -> ChatCompletionChunk:
        data = self._load(payload)
        if type(data) is dict and data.get("error"):
            raise _stream_error(data["error"], self.request)
        if type(data) is dict:
            try:
                return cast(ChatCompletionChunk, _shape(Completion).construct(data))
            except _Slow:
                pass
        return cast(ChatCompletionChunk, construct_type(type_=Completion, value=data))

    def _track(self, chunk: ChatCompletionChunk) -> None:
        completion = cast(Any, chunk)
        if type(completion) is not Completion:
            return
        try:
            token = False
            for choice in completion.choices:
                if choice.finish_reason is not None:
                    self._unfinished.discard(choice.index)
                    self.finished = not self._unfinished
                elif choice.index not in self._unfinished:
                    self._unfinished.add(choice.index)
                    self.finished = False
                if choice.text:
                    token = True
                    if choice.index == 0 and type(choice.text) is str:
                        self._text.append(choice.text)
        except (AttributeError, TypeError):
            return
        if token:
            self.tokens += 1


# The Responses API.

_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""Events that end a Responses stream: the answer is whole (``incomplete``: cut by a limit the
caller set, as a chat completion's ``finish_reason: length``; ``failed``: the vendor says so)."""


def parse_response(
    raw: bytes,
    *,
    request: httpx.Request,
    target: str,
    response: httpx.Response | None = None,
) -> Response:
    """Decode a non-streamed Responses API body into openai's ``Response``, as openai does.

    A response whose ``status`` is ``failed`` raises ``openai.APIError`` with its error (another
    target may answer); invalid JSON raises :class:`MalformedResponseError` naming ``target``.
    """
    data = load_json(raw, request=request, target=target, response=response)
    if type(data) is dict and data.get("status") == "failed":
        error = data.get("error")
        message = error.get("message") if isinstance(error, Mapping) else None
        raise APIError(
            message=f"target {target!r}: the response failed ({quote(message or 'no message')})",
            request=request,  # type: ignore[arg-type]
            body=error,
        )
    return cast(Response, construct_type(type_=Response, value=data))


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses API ``usage`` (openai's object or a dict) in chat completions' shape, which
    the adapter's ``usage_fields`` read: input as prompt, output as completion tokens, with
    their cached and reasoning parts; ``None`` when it is not an object."""
    data = usage.model_dump() if hasattr(usage, "model_dump") else usage
    if not isinstance(data, Mapping):
        return None
    names = {"input_tokens": "prompt_tokens", "output_tokens": "completion_tokens"}
    out: dict[str, Any] = {new: data[old] for old, new in names.items() if old in data}
    if "total_tokens" in data:
        out["total_tokens"] = data["total_tokens"]
    for old, new, part in (
        ("input_tokens_details", "prompt_tokens_details", "cached_tokens"),
        ("output_tokens_details", "completion_tokens_details", "reasoning_tokens"),
    ):
        details = data.get(old)
        if isinstance(details, Mapping) and details.get(part) is not None:
            out[new] = {part: details[part]}
    return out


def response_text_delta(event: object) -> str | None:
    """The text an ``response.output_text.delta`` event adds, else ``None``."""
    if getattr(event, "type", None) == "response.output_text.delta":
        delta = getattr(event, "delta", None)
        return delta if type(delta) is str else None
    return None


class ResponsesStreamDecoder(ChatStreamDecoder):
    """Turn the bytes of a streamed Responses API call into openai's ``ResponseStreamEvent``
    objects, built as ``openai.AsyncStream`` builds them.

    ``tokens`` counts the events that carry generated output (every ``*.delta`` event: text,
    refusal, function-call arguments, reasoning); ``finished`` is set by the event that ends the
    response (``response.completed``, ``response.incomplete`` or ``response.failed``), after
    which later bytes are ignored. Before the first token, an ``error`` or ``response.failed``
    event raises ``openai.APIError`` (the attempt failed and another target may answer); after
    it, they are passed on as openai passes them, so the caller sees what the vendor sent.
    """

    def _chunk(self, sse: ServerSentEvent, payload: str) -> ChatCompletionChunk:
        data = self._load(payload)
        if type(data) is dict:
            kind = data.get("type")
            if data.get("error") and kind != "response.failed" and kind != "error":
                raise _stream_error(data["error"], self.request)  # openai raises on it too
            if not self.tokens and kind == "error":
                raise _stream_error(data, self.request)
            if not self.tokens and kind == "response.failed":
                failed = data.get("response")
                raise _stream_error(
                    failed.get("error") if type(failed) is dict else None, self.request
                )
        return cast(ChatCompletionChunk, construct_type(type_=ResponseStreamEvent, value=data))

    _usage: dict[str, Any] | None = None

    @property
    def vendor_usage(self) -> dict[str, Any] | None:
        """The usage of the event that ended the response, in chat completions' shape
        (:func:`responses_usage`); ``None`` before it."""
        return self._usage

    def _track(self, chunk: ChatCompletionChunk) -> None:
        kind = getattr(chunk, "type", None)
        if type(kind) is not str:
            return
        if kind.endswith(".delta"):
            self.tokens += 1
            text = response_text_delta(chunk)
            if text:
                self._text.append(text)
        elif kind in _RESPONSE_ENDS:
            self.finished = self.done = True
            self._usage = responses_usage(getattr(getattr(chunk, "response", None), "usage", None))
        elif kind == "error":
            # The caller gets the event, as from openai; then the stream fails (its answer is
            # not whole), so it is never taken for a complete one.
            self._error = _stream_error(chunk.model_dump(), self.request)


# The adapter.


def rename_limit(body: dict[str, Any], name: str) -> None:
    """Send the caller's answer limit under ``name``, the one field the vendor takes: the
    smaller of ``max_tokens`` and ``max_completion_tokens`` when both are given."""
    limits = [
        body.pop(key)
        for key in ("max_tokens", "max_completion_tokens")
        if key in body and body[key] is not None
    ]
    if limits:
        body[name] = min(limits) if all(isinstance(v, int) for v in limits) else limits[0]


class OpenAIAdapter(ProtocolAdapter):
    """OpenAI's APIs (chat completions, Responses, completions, embeddings) and every vendor
    that speaks them: bodies sent as written, the key as a bearer token."""

    name = "openai"
    speaks_openai = True
    stream_usage = True
    usage_fields = UsageFields(
        prompt="prompt_tokens",
        prompt_includes_cache=True,
        cache_read="prompt_tokens_details.cached_tokens",
        completion="completion_tokens",
        reasoning="completion_tokens_details.reasoning_tokens",
    )

    def serves(self, kind: str) -> bool:
        return True

    def headers(
        self, api_key: str | None, *, user_agent: str, configured: Mapping[str, str]
    ) -> dict[str, str]:
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": user_agent,
            **configured,
        }
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    def models_request(self, api_key: str) -> tuple[dict[str, str], dict[str, Any]]:
        return {"authorization": f"Bearer {api_key}"}, {}

    def wire_request(
        self, path: str, body: Mapping[str, Any], *, target: str
    ) -> tuple[str, Mapping[str, Any]]:
        return path, body

    def send_limit_as(self, body: dict[str, Any], field: str) -> None:
        rename_limit(body, field)

    def stream_decoder(
        self,
        kind: str,
        *,
        request: httpx.Request,
        target: str,
        body: Mapping[str, Any],
        include_usage: bool,
    ) -> ChatStreamDecoder:
        if kind == "responses":
            return ResponsesStreamDecoder(request=request, target=target)
        if kind == "completions":
            return CompletionStreamDecoder(request=request, target=target)
        return ChatStreamDecoder(request=request, target=target)

    def parse_answer(
        self, kind: str, response: httpx.Response, *, target: str, body: Mapping[str, Any]
    ) -> Any:
        parse = parse_response if kind == "responses" else parse_chat_completion
        return parse(response.content, request=response.request, target=target, response=response)

    def request_id(self, headers: Mapping[str, str]) -> str | None:
        return headers.get(REQUEST_ID_HEADER)

    def answer_usage(self, kind: str, completion: Any, response: httpx.Response) -> Any:
        usage = getattr(completion, "usage", None) if completion is not None else None
        if completion is None:  # legacy completions and embeddings: openai parses the body
            usage = _body_usage(response)
        return responses_usage(usage) if kind == "responses" and usage is not None else usage


def _body_usage(response: httpx.Response) -> dict[str, Any] | None:
    """The ``usage`` object of a JSON answer's body; ``None`` when it has none."""
    try:
        data = json.loads(response.content)
    except ValueError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None


OPENAI = OpenAIAdapter()
"""The OpenAI protocol's adapter."""
