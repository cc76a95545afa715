"""The OpenAI wire protocol (chat completions): decode streamed and whole responses.

Chunks and completions are the ``openai`` package's own classes, built without validation exactly
as ``openai.AsyncStream`` builds them (``construct_type``), so they compare equal to openai's,
nested objects included, and keep the unknown fields vendors add. The common shapes take a fast
path that reproduces openai's construction for the values it recognises and hands anything
else to openai's own ``construct_type``. This module knows nothing of routing or sockets.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias, cast

import httpx
import pydantic
import pydantic_core
from openai import APIError, APIResponseValidationError
from openai._models import construct_type
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from .._errors import MalformedStreamError, quote
from .._prices import UsageFields
from ..transport import ServerSentEvent, SSEDecodeError, SSEDecoder
from ._adapter import ProtocolAdapter

try:
    from jiter import from_json as _jiter_loads
except ImportError:  # pragma: no cover - jiter is a dependency of openai
    _jiter_loads = None

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

_STREAM_ERROR = "An error occurred during streaming"

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


def is_token_chunk(chunk: ChatCompletionChunk) -> bool:
    """Whether a chunk carries generated output: content, refusal, tool or function call, reasoning.

    Reasoning is the ``reasoning_content`` or ``reasoning`` delta field some vendors send.
    A role-only, finish or usage chunk is not a token chunk.
    """
    try:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content or delta.tool_calls or delta.refusal or delta.function_call:
                return True
            extra = delta.__pydantic_extra__
            if extra and (extra.get("reasoning_content") or extra.get("reasoning")):
                return True
    except (AttributeError, TypeError):
        return False
    return False


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


class ChatStreamDecoder:
    """Turn the bytes of a streamed chat completion into ``ChatCompletionChunk`` objects.

    Follows ``openai.AsyncStream``: an event whose data starts with ``[DONE]`` ends the stream
    (later bytes are ignored); a JSON object with a truthy ``error`` member raises
    ``openai.APIError`` with openai's message and ``body``; events named ``thread.*`` are wrapped
    as ``{"data": ..., "event": ...}``. Data that is not JSON raises ``MalformedStreamError``.
    When an event fails, the chunks decoded before it in the same :meth:`feed` are returned and the
    error is raised by the next :meth:`feed` or :meth:`close`, so no chunk is lost; after an error
    the decoder is done.

    Unlike openai, an event without a ``data`` line (``event: ping``) is ignored, as the SSE spec
    says, rather than failing to parse as JSON.
    """

    __slots__ = (
        "_error",
        "_sse",
        "_text",
        "_unfinished",
        "done",
        "finished",
        "request",
        "target",
        "tokens",
    )

    def __init__(
        self, *, request: httpx.Request, target: str, max_event_bytes: int = 8 * 1024 * 1024
    ) -> None:
        self.request = request
        self.target = target
        self._sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self._error: BaseException | None = None
        self._text: list[str] = []
        self.done = False
        """True once ``data: [DONE]`` arrived."""
        self.finished = False
        """True once every choice seen so far carried a ``finish_reason``."""
        self._unfinished: set[int] = set()
        self.tokens = 0
        """How many token chunks (see :func:`is_token_chunk`) were decoded."""

    @property
    def vendor_usage(self) -> Any:
        """The vendor's own usage object so far, where the protocol's chunks do not carry it
        as the vendor sent it (Anthropic's); ``None`` here: a chunk's ``usage`` is the vendor's."""
        return None

    @property
    def text(self) -> str:
        """The content of choice 0 decoded so far."""
        if len(self._text) > 1:
            self._text[:] = ["".join(self._text)]
        return self._text[0] if self._text else ""

    def feed(self, data: bytes) -> list[ChatCompletionChunk]:
        """Decode bytes from the response body; return the chunks they complete, in order."""
        if self._error is not None:
            self._raise()
        if self.done:
            return []
        try:
            events = self._sse.feed(data)
        except SSEDecodeError as exc:
            self.done = True
            raise MalformedStreamError(
                str(exc), self.request, target=self.target, line=data.decode("utf-8", "replace")
            ) from exc
        return self._chunks(events) if events else []

    def close(self) -> list[ChatCompletionChunk]:
        """End of the response body: raise a pending error, else return any last chunks."""
        if self._error is not None:
            self._raise()
        if self.done:
            return []
        try:
            events = self._sse.close()
        except SSEDecodeError as exc:  # deferred by the last feed, after the events before it
            self.done = True
            raise MalformedStreamError(str(exc), self.request, target=self.target, line="") from exc
        return self._chunks(events)

    def _raise(self) -> typing.NoReturn:
        error, self._error = self._error, None
        self.done = True
        raise cast(BaseException, error)

    def _chunks(self, events: list[ServerSentEvent]) -> list[ChatCompletionChunk]:
        chunks: list[ChatCompletionChunk] = []
        for sse in events:
            if self.done:
                break  # the stream ended (a subclass's end event): later bytes are ignored
            payload = sse.data
            if payload.startswith("[DONE]"):
                self.done = True
                break
            try:
                chunk = self._chunk(sse, payload)
            except Exception as exc:
                if not chunks:
                    self.done = True
                    raise
                self._error = exc
                break
            chunks.append(chunk)
            self._track(chunk)
        return chunks

    def _load(self, payload: str) -> Any:
        try:
            return _loads(payload)
        except (ValueError, RecursionError) as exc:
            message = "Stream event data is not valid JSON"
            target = self.target
            raise MalformedStreamError(message, self.request, target=target, line=payload) from exc

    def _chunk(self, sse: ServerSentEvent, payload: str) -> ChatCompletionChunk:
        data = self._load(payload)
        event = sse.event
        if event is not None and event.startswith("thread."):
            value: object = {"data": data, "event": event}
        else:
            if type(data) is dict and data.get("error"):  # JSON objects are dicts
                raise _stream_error(data["error"], self.request)
            if data is None:
                return cast(ChatCompletionChunk, None)
            value = data
        return build_chunk(value)

    def _track(self, chunk: ChatCompletionChunk) -> None:
        if type(chunk) is not ChatCompletionChunk:
            return
        try:
            token = False
            for choice in chunk.choices:
                delta = choice.delta
                if choice.finish_reason is not None:
                    self._unfinished.discard(choice.index)
                    self.finished = not self._unfinished
                elif choice.index not in self._unfinished:
                    self._unfinished.add(choice.index)  # with n > 1, each choice ends apart
                    self.finished = False
                content = delta.content
                if content:
                    token = True
                    if choice.index == 0 and type(content) is str:
                        self._text.append(content)
        except (AttributeError, TypeError):
            return
        if not token:
            token = is_token_chunk(chunk)
        if token:
            self.tokens += 1


def _stream_error(error: object, request: httpx.Request) -> APIError:
    """The ``openai.APIError`` for an error object a vendor sent in a stream, as openai makes it:
    the object's ``message`` when it is a non-empty string, else openai's generic one; the object
    as ``body``."""
    message = error.get("message") if isinstance(error, Mapping) else None
    if not isinstance(message, str) or not message:
        message = _STREAM_ERROR
    return APIError(message=message, request=request, body=error)  # type: ignore[arg-type]


def _loads(payload: str) -> Any:
    if _jiter_loads is not None:
        try:
            return _jiter_loads(payload.encode())
        except ValueError:
            pass  # jiter is stricter in corners (lone surrogates): json decides
    return json.loads(payload)


def build_chunk(data: object) -> ChatCompletionChunk:
    """Build a chunk from decoded JSON exactly as openai's ``construct_type`` would, only faster."""
    if type(data) is dict:
        try:
            return cast(ChatCompletionChunk, _CHUNK.construct(data))
        except _Slow:
            pass
    return cast(ChatCompletionChunk, construct_type(type_=ChatCompletionChunk, value=data))


# Fast construction.
#
# openai's ``BaseModel.construct`` keeps each field's value as is, except: a model field is
# constructed recursively from a dict, a list of models from a list of dicts, and an Optional
# (union) field is first *validated* by pydantic, falling back to construction. The shapes below
# reproduce that without pydantic for values whose outcome is certain (a str for Optional[str], a
# dict that would pass validation for Optional[Model], ...) and raise _Slow otherwise, so the
# field (or whole object) goes to openai's own code.


_MAX_PLANS = 64  # key layouts remembered per model class


class _Slow(Exception):
    """The fast path cannot vouch for this value; openai's construct_type decides."""


_Convert: TypeAlias = Callable[[Any], Any]
_Field: TypeAlias = pydantic.fields.FieldInfo

# How openai's construct treats a field's value (None always gives the field's default).
_AS_IS = 0  # kept as is whatever it is: str, int, bool, Literal
_TYPED = 1  # Optional[str | int | float | bool | Literal[str...]]: as is when of that exact type
_MODEL = 2  # a model, constructed from a dict
_LIST = 3  # a list of models, each constructed from a dict
_VALIDATED = 4  # other Optional: pydantic validation first, then construction
_GENERAL = 5  # anything else

_new = object.__new__
_slots = pydantic.BaseModel.__dict__
_set_dict = _slots["__dict__"].__set__
_set_private = _slots["__pydantic_private__"].__set__
_set_extra = _slots["__pydantic_extra__"].__set__
_set_fields_set = _slots["__pydantic_fields_set__"].__set__


class _Shape:
    """A model class's fields, classified once, and the two ways openai may build it."""

    __slots__ = ("checks", "cls", "defaults", "fix", "names", "plans", "required", "supported")

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        self.cls = cls
        self.supported = _supported(cls)
        fields = cls.model_fields
        self.names = frozenset(fields)
        self.required = frozenset(name for name, f in fields.items() if f.is_required())
        self.defaults: dict[str, Any] = {}
        self.fix: dict[str, tuple[int, Any, _Field, Any]] = {}
        self.checks: dict[str, _Convert] = {}
        # A compiled construct for each key layout seen twice (a stream repeats the same
        # layouts; compiling one seen once, such as a stream's role chunk's, would cost a
        # process's first answer more than it saves). None: seen once.
        self.plans: dict[tuple[str, ...], Callable[[dict[str, Any]], Any] | None] = {}
        for name, field in fields.items():
            default = field.get_default()
            default = None if default is pydantic_core.PydanticUndefined else default
            self.defaults[name] = default
            kind, arg = _construct_kind(field)
            if kind != _AS_IS or default is not None:
                self.fix[name] = (kind, arg, field, default)
            self.checks[name] = _validator(field.annotation, field.metadata)

    def _make(self, values: dict[str, Any], fields_set: set[str], extra: dict[str, Any]) -> Any:
        m = _new(self.cls)
        _set_dict(m, values)
        _set_private(m, None)
        _set_extra(m, extra)
        _set_fields_set(m, fields_set)
        return m

    def construct(self, data: object) -> Any:
        """What ``cls.construct(**data)`` returns, or _Slow."""
        if type(data) is not dict or not self.supported:
            raise _Slow
        layout = tuple(data)
        build = self.plans.get(layout)
        if build is not None:  # the common case: known fields only, in a layout seen before
            return build(data)
        values = self.defaults.copy()
        extra: dict[str, Any] = {}
        if data.keys() <= self.names:
            if layout in self.plans:
                build = self.plans[layout] = self._compile(layout)
                return build(data)
            if len(self.plans) < _MAX_PLANS:
                self.plans[layout] = None
            values.update(data)
            fields_set = set(data)
        else:
            fields_set = set()
            for key, value in data.items():
                if key in self.names:
                    values[key] = value
                    fields_set.add(key)
                elif key == "_fields_set":
                    raise _Slow
                else:
                    extra[key] = value
        plan = [(k, *self.fix[k]) for k in data if k in self.fix]
        return self._make(self._fixed(values, data, plan), fields_set, extra)

    def _compile(self, layout: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
        """A straight-line ``construct`` for dicts with exactly these keys in this order (known
        fields only): what ``_fixed`` does, without its loop and dispatch on each field's kind."""
        env: dict[str, Any] = {
            "Slow": _Slow,
            "general": _general,
            "new": _new,
            "cls": self.cls,
            "defaults": self.defaults,
            "set_dict": _set_dict,
            "set_private": _set_private,
            "set_extra": _set_extra,
            "set_fields_set": _set_fields_set,
            "layout": frozenset(layout),
        }
        body = ["def build(data):", "    values = defaults.copy()", "    values.update(data)"]
        for i, key in enumerate(layout):
            if key not in self.fix:
                continue
            kind, arg, field, default = self.fix[key]
            k = repr(key)
            env[f"d{i}"], env[f"f{i}"] = default, field
            body += [f"    v = data[{k}]", "    if v is None:", f"        values[{k}] = d{i}"]
            if kind == _TYPED:
                env[f"t{i}"] = arg
                body += [f"    elif type(v) is not t{i}:"]
                body += [f"        values[{k}] = general(v, f{i})"]
                continue
            if kind == _LIST:
                env[f"c{i}"] = (arg.shape or arg.load()).construct
                call = f"list(map(c{i}, v)) if type(v) is list else general(v, f{i})"
            elif kind == _MODEL:
                env[f"c{i}"] = (arg.shape or arg.load()).construct
                call = f"c{i}(v)"
            elif kind == _VALIDATED:
                env[f"c{i}"] = arg
                call = f"c{i}(v)"
            else:
                call = f"general(v, f{i})"
            body += [
                "    else:",
                "        try:",
                f"            values[{k}] = {call}",
                "        except Slow:",
                f"            values[{k}] = general(v, f{i})",
            ]
        body += [
            "    m = new(cls)",
            "    set_dict(m, values)",
            "    set_private(m, None)",
            "    set_extra(m, {})",
            "    set_fields_set(m, set(layout))",
            "    return m",
        ]
        exec("\n".join(body), env)
        return cast(Callable[[dict[str, Any]], Any], env["build"])

    @staticmethod
    def _fixed(
        values: dict[str, Any],
        data: dict[str, Any],
        plan: list[tuple[str, int, Any, _Field, Any]],
    ) -> dict[str, Any]:
        for key, kind, arg, field, default in plan:
            value = data[key]
            if value is None:
                values[key] = default
            elif kind == _TYPED:
                if type(value) is not arg:
                    values[key] = _general(value, field)
            elif kind == _LIST:
                try:
                    build = (arg.shape or arg.load()).construct
                    values[key] = [build(item) for item in _list(value)]
                except _Slow:
                    values[key] = _general(value, field)
            elif kind == _MODEL:
                try:
                    values[key] = (arg.shape or arg.load()).construct(value)
                except _Slow:
                    values[key] = _general(value, field)
            elif kind == _VALIDATED:
                try:
                    values[key] = arg(value)
                except _Slow:
                    values[key] = _general(value, field)
            elif kind == _GENERAL:
                values[key] = _general(value, field)
        return values

    def validate(self, data: object) -> Any:
        """What pydantic validation of ``data`` as ``cls`` returns, or _Slow if not certain."""
        if type(data) is not dict or not self.supported:
            raise _Slow
        values = self.defaults.copy()
        fields_set: set[str] = set()
        extra: dict[str, Any] = {}
        checks = self.checks
        for key, value in data.items():
            check = checks.get(key)
            if check is None:
                if key[:1] == "_":
                    raise _Slow
                extra[key] = value
            else:
                values[key] = check(value)
            fields_set.add(key)  # validation counts extras as set, construction does not
        if not self.required <= fields_set:
            raise _Slow
        return self._make(values, fields_set, extra)


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type[pydantic.BaseModel]) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = _Shape(cls)
    return shape


class _Lazy:
    """A nested model's shape, classified on first use (models may refer to each other)."""

    __slots__ = ("cls", "shape")

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        self.cls = cls
        self.shape: _Shape | None = None

    def load(self) -> _Shape:
        self.shape = _shape(self.cls)
        return self.shape

    def validate(self, data: object) -> Any:
        return (self.shape or self.load()).validate(data)


def _supported(cls: type[pydantic.BaseModel]) -> bool:
    if cls.__private_attributes__ or cls.model_config.get("extra") != "allow":
        return False
    for name, field in cls.model_fields.items():
        if field.alias not in (None, name) or field.validation_alias is not None:
            return False
        if field.default_factory is not None:
            return False
    if not _annotates_extras(cls):
        return True  # extras are kept as given: no need to build a deferred model's schema
    core = cls.__pydantic_core_schema__
    fields = core.get("schema", {}) if core.get("type") == "model" else {}
    return not (fields.get("type") == "model-fields" and fields.get("extras_schema"))


def _annotates_extras(cls: type[pydantic.BaseModel]) -> bool:
    """Whether ``cls`` or a base of it below pydantic's ``BaseModel`` annotates
    ``__pydantic_extra__`` (only then may its extras have a type that validation checks).
    Read from the classes' annotations: asking for ``__pydantic_core_schema__`` builds the
    schema of a model that openai defers (``defer_build``), most of a process's first cache
    hit."""
    for base in cls.__mro__:
        if base is pydantic.BaseModel:
            return False
        try:
            annotations = inspect.get_annotations(base)
        except Exception:  # annotations that cannot be evaluated: ask pydantic
            return True
        if "__pydantic_extra__" in annotations:
            return True
    return False


def _general(value: object, field: _Field) -> Any:
    return construct_type(value=value, type_=field.annotation, metadata=field.metadata)


def _list(value: object) -> list[Any]:
    if type(value) is not list:
        raise _Slow
    return cast(list[Any], value)


def _is_model(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _optional_arg(tp: object) -> object | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if len(args) == 2 and type(None) in args:
            return args[0] if args[1] is type(None) else args[1]
    return None


def _construct_kind(field: _Field) -> tuple[int, Any]:
    tp = field.annotation
    if field.metadata:
        return _GENERAL, None
    if tp in (str, int, bool) or typing.get_origin(tp) is Literal:
        return _AS_IS, None
    if _is_model(tp):
        return _MODEL, _Lazy(cast(type, tp))
    if typing.get_origin(tp) is list:
        args = typing.get_args(tp)
        if len(args) == 1 and _is_model(args[0]):
            return _LIST, _Lazy(args[0])
    inner = _optional_arg(tp)
    if inner in (str, int, float, bool):
        return _TYPED, inner
    if typing.get_origin(inner) is Literal and all(type(a) is str for a in typing.get_args(inner)):
        return _TYPED, str  # validated or not, a str comes back as is
    if inner is not None:
        return _VALIDATED, _validator(tp)
    return _GENERAL, None


def _slow(value: object) -> Any:
    raise _Slow


def _exact(tp: type) -> _Convert:
    def check(value: object) -> Any:
        if type(value) is not tp:
            raise _Slow
        return value

    return check


def _validator(tp: object, metadata: list[Any] | None = None) -> _Convert:
    """A function giving what lax pydantic validation of a value as ``tp`` gives, or raising _Slow.

    It vouches only for certain outcomes: exact JSON types, known literals, and models and lists
    of them built from dicts and lists that would validate.
    """
    if metadata:
        return _slow
    inner = _optional_arg(tp)
    if inner is not None:
        check = _validator(inner)

        def optional(value: object) -> Any:
            return None if value is None else check(value)

        return optional
    if tp in (str, int, float, bool):
        return _exact(cast(type, tp))
    if typing.get_origin(tp) is Literal:
        allowed = typing.get_args(tp)
        if not all(type(a) is str for a in allowed):
            return _slow
        names = frozenset(allowed)

        def literal(value: object) -> Any:
            if type(value) is not str or value not in names:
                raise _Slow
            return value

        return literal
    if _is_model(tp):
        return _Lazy(cast(type, tp)).validate
    if typing.get_origin(tp) is list and len(typing.get_args(tp)) == 1:
        item = _validator(typing.get_args(tp)[0])

        def items(value: object) -> Any:
            return [item(v) for v in _list(value)]

        return items
    return _slow


_CHUNK = _shape(ChatCompletionChunk)


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
