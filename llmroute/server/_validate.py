"""A request body checked against OpenAI's schema before anything goes upstream.

Only the fields OpenAI defines are checked (types, ranges, finite numbers); fields it does not
know (a vendor's own parameters) pass as they are. :func:`check` raises :class:`InvalidField`,
which names the field the way OpenAI's own 400s do (``messages[2].role``).

Numbers from JSON are unbounded: :func:`load` reads ``NaN``, ``Infinity``, ``1e400`` and an
integer of any length without failing, then refuses each one no JSON encoder could send on,
naming its field; a number is range-checked before it is ever formatted (:func:`shown`). Strings
are not always text either: JSON's ``\\ud800`` escape reads as a lone UTF-16 surrogate, which no
UTF-8 encoder writes (a cache key, a price estimate, an error echoing a model name would fail on
it); :func:`load` refuses it too, naming its field."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["InvalidField", "check", "clipped", "load", "shown"]


class InvalidField(ValueError):
    """A field of the request body that OpenAI's API would refuse."""

    def __init__(self, param: str, message: str, code: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A ``\\uD800``-``\\uDFFF`` escape: only a body with one can hold a lone surrogate (raw
surrogate bytes are not UTF-8, and the body is refused before it is read as JSON)."""


class _Unsendable(float):
    """A number of the body that JSON cannot carry on (``NaN``, ``Infinity``, ``1e400``, an
    integer too long for Python to read), kept as its text until :func:`load` refuses it."""

    text: str


def _unsendable(value: float, text: str) -> _Unsendable:
    number = _Unsendable(value)
    number.text = text if len(text) <= 40 else f"an integer of {len(text.lstrip('-'))} digits"
    return number


def load(data: bytes) -> Any:
    """The JSON document ``data``. Raises :class:`json.JSONDecodeError` (or
    ``UnicodeDecodeError``, ``RecursionError``) for text that is not JSON, and
    :class:`InvalidField` naming the first number JSON cannot carry on (``NaN``,
    ``Infinity``, one beyond a double such as ``1e400``, an integer of thousands of digits)."""
    seen: list[_Unsendable] = []

    def odd(value: float, text: str) -> float:
        seen.append(_unsendable(value, text))
        return seen[-1]

    def read_float(text: str) -> float:
        value = float(text)
        return value if math.isfinite(value) else odd(value, text)

    def read_constant(text: str) -> float:
        return odd(float(text), text)  # NaN, Infinity, -Infinity

    def read_int(text: str) -> int | float:
        try:
            return int(text)
        except ValueError:  # more digits than sys.get_int_max_str_digits()
            return odd(-math.inf if text.startswith("-") else math.inf, text)

    try:
        body = json.loads(data, parse_float=read_float, parse_constant=read_constant)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:  # an integer longer than Python reads: read again, hooked
        body = json.loads(
            data, parse_float=read_float, parse_constant=read_constant, parse_int=read_int
        )
    if seen:
        param, number = _first_unsendable(body)
        raise InvalidField(
            param,
            f"Invalid '{param}': {number.text} is not a number JSON can carry (NaN, Infinity and "
            "numbers beyond a 64-bit float are refused).",
            "invalid_value",
        )
    if _SURROGATE_ESCAPE.search(data) is not None:
        where = _first_lone_surrogate(body)
        if where is not None:
            raise InvalidField(
                where,
                f"Invalid '{where}': it holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                "escape without its pair), which is not text.",
                "invalid_value",
            )
    return body


def _first_lone_surrogate(body: Any) -> str | None:
    """Where the first string (or object key) holding a lone surrogate is in ``body``
    (``messages[0].content``; ``body`` for the document itself), if one does."""
    for trail, value in _walk(body):
        if isinstance(value, str):
            if not _is_text(value):
                return _where(trail)
        elif isinstance(value, dict):
            for key in value:
                if not _is_text(key):
                    return _where((trail, key))
    return None


_Trail = tuple[Any, "str | int"] | None
"""Where a value is in a body: ``None`` for the body, else its parent's trail and its key or
index. A path is spelled out only for the value an error names: building one string per
value would copy a client's long key once per item under it (a 1 MB key over a million items:
a terabyte)."""


def _walk(body: Any) -> Iterator[tuple[_Trail, Any]]:
    """Every value of ``body``, depth first in document order, with its trail; without
    recursion, in work linear in the body."""
    stack: list[tuple[_Trail, Any]] = [(None, body)]
    while stack:
        trail, value = stack.pop()
        yield trail, value
        if isinstance(value, dict):
            stack.extend(reversed([((trail, k), v) for k, v in value.items()]))
        elif isinstance(value, list):
            stack.extend(reversed([((trail, i), v) for i, v in enumerate(value)]))


_SHOWN_KEY = 40  # characters of a client's object key an error shows
_SHOWN_PATH = 200  # characters of a path an error shows


def clipped(text: str, limit: int) -> str:
    """``text`` as an error shows what a client sent: at most ``limit`` characters, a cut
    one ending in ``...``; a lone surrogate escaped (an error is UTF-8 when it leaves)."""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode()


def _where(trail: _Trail) -> str:
    """A trail as an error names it (``messages[0].content``), bounded: each key shown up
    to 40 characters, the path up to 200 (its end kept, where the value is)."""
    steps: list[str] = []
    while trail is not None:
        trail, step = trail
        steps.append(f"[{step}]" if isinstance(step, int) else f".{clipped(step, _SHOWN_KEY)}")
    path = "".join(reversed(steps)).removeprefix(".")
    if not path:
        return "body"
    return path if len(path) <= _SHOWN_PATH else "..." + path[3 - _SHOWN_PATH :]


def _is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _first_unsendable(body: Any) -> tuple[str, _Unsendable]:
    """The first unsendable number in ``body`` (there is one) and where it is
    (``messages[0].content``), walked without recursion."""
    for trail, value in _walk(body):
        if isinstance(value, _Unsendable):
            return _where(trail), value
    raise AssertionError("no unsendable number in the body")


def shown(value: object) -> str:
    """A number as a message shows it, whatever its size: never an ``OverflowError``
    (formatting ``10**400`` with ``:g`` raises one), never thousands of digits."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        digits = int(math.log10(abs(value))) + 1  # log10 takes an int of any size
        sign = "a negative" if value < 0 else "an"
        return f"{sign} integer of about {digits} digits"
    return str(value)


_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _kind(value: object) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def _wrong_type(param: str, expected: str, value: object) -> InvalidField:
    return InvalidField(
        param,
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
        "invalid_type",
    )


def _boolean(param: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _wrong_type(param, "a boolean", value)


def _string(param: str, value: object) -> None:
    if not isinstance(value, str):
        raise _wrong_type(param, "a string", value)


def _object(param: str, value: object) -> None:
    if not isinstance(value, dict):
        raise _wrong_type(param, "an object", value)


def _number(low: float | None, high: float | None, *, integer: bool = False) -> Callable[..., None]:
    word = "integer" if integer else "decimal"

    def check(param: str, value: object) -> None:
        # Type, then range (comparisons are exact for an int of any size), formatting last.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _wrong_type(param, "an integer" if integer else "a number", value)
        if integer and not isinstance(value, int):
            raise _wrong_type(param, "an integer", value)
        if isinstance(value, float) and math.isnan(value):
            raise InvalidField(
                param,
                f"Invalid '{param}': expected a number, but got NaN instead.",
                "invalid_value",
            )
        if low is not None and value < low:
            raise InvalidField(
                param,
                f"Invalid '{param}': {word} below minimum value. "
                f"Expected a value >= {low:g}, but got {shown(value)} instead.",
                f"{word}_below_min_value",
            )
        if high is not None and value > high:
            raise InvalidField(
                param,
                f"Invalid '{param}': {word} above maximum value. "
                f"Expected a value <= {high:g}, but got {shown(value)} instead.",
                f"{word}_above_max_value",
            )

    return check


def _stop(param: str, value: object) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _wrong_type(param, "a string or an array of strings", value)
    _at_most(param, value, 4)
    for i, item in enumerate(value):
        _string(f"{param}[{i}]", item)


def _at_most(param: str, value: list[Any], limit: int) -> None:
    if len(value) > limit:
        raise InvalidField(
            param,
            f"Invalid '{param}': array too long. Expected at most {limit} items, "
            f"but got {len(value)} instead.",
            "array_above_max_length",
        )


def _list_of_objects(param: str, value: object) -> None:
    if not isinstance(value, list):
        raise _wrong_type(param, "an array", value)
    if all(type(item) is dict for item in value):  # one quick pass; names only for a fault
        return
    for i, item in enumerate(value):
        _object(f"{param}[{i}]", item)


def _string_or_object(param: str, value: object) -> None:
    if not isinstance(value, str | dict):
        raise _wrong_type(param, "a string or an object", value)


def _logit_bias(param: str, value: object) -> None:
    _object(param, value)
    bias = _number(-100, 100)
    for token, weight in value.items():  # type: ignore[union-attr]
        bias(f"{param}.{clipped(token, _SHOWN_KEY)}", weight)


def _stream_options(param: str, value: object) -> None:
    _object(param, value)
    include = value.get("include_usage")  # type: ignore[union-attr]
    if include is not None:
        _boolean(f"{param}.include_usage", include)


def _non_empty(param: str, value: list[Any]) -> None:
    if not value:
        raise InvalidField(
            param,
            f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "empty_array",
        )


def _messages(param: str, value: object) -> None:
    if not isinstance(value, list):
        raise _wrong_type(param, "an array", value)
    _non_empty(param, value)
    start = 0
    while (i := _first_odd_message(value, start)) is not None:
        _message(f"{param}[{i}]", value[i])  # raises, unless a subclass of JSON's types
        start = i + 1


def _first_odd_message(messages: list[Any], start: int) -> int | None:
    """The index of the first chat message from ``start`` whose checked fields do not all have
    JSON's own types, found without building a name for each (the names cost more than the
    checks over 100,000 parts): :func:`_message` then finds what is wrong and names it."""
    for i in range(start, len(messages)):
        message = messages[i]
        if type(message) is not dict or type(message.get("role")) is not str:
            return i
        content = message.get("content")
        if content is not None and type(content) is not str:
            if type(content) is not list:
                return i
            for part in content:
                if type(part) is not dict:
                    return i
        name = message.get("name")
        if name is not None and type(name) is not str:
            return i
    return None


def _message(where: str, message: object) -> None:
    """Raise :class:`InvalidField` for the first field of a chat message OpenAI would refuse."""
    if not isinstance(message, dict):
        raise _wrong_type(where, "an object", message)
    if "role" not in message:
        raise InvalidField(
            f"{where}.role",
            f"Missing required parameter: '{where}.role'.",
            "missing_required_parameter",
        )
    _string(f"{where}.role", message["role"])
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            raise _wrong_type(f"{where}.content", "a string or an array of objects", content)
        for j, part in enumerate(content):
            _object(f"{where}.content[{j}]", part)
    name = message.get("name")
    if name is not None:
        _string(f"{where}.name", name)


def _prompt_like(param: str, value: object) -> None:
    """A string, an array of strings, an array of token ids or an array of such arrays."""
    if isinstance(value, str):
        return
    expected = "a string, an array of strings or an array of token arrays"
    if not isinstance(value, list) or not value:
        raise _wrong_type(param, expected, value)
    if all(type(item) is int for item in value):  # token ids (bool is not int): one quick pass
        return
    for i, item in enumerate(value):
        if isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool)):
            continue
        if isinstance(item, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in item
        ):
            continue
        raise _wrong_type(f"{param}[{i}]", expected, item)


_EMBEDDING_INPUTS = 2048
"""OpenAI's bound on the inputs of one embeddings request: beyond it, turning a request's
inputs into openai's types and back holds the gateway's event loop for seconds (100,000 inputs,
a 500 KB body: about 3 s, every other request waiting)."""


def _embedding_input(param: str, value: object) -> None:
    _prompt_like(param, value)
    if isinstance(value, list):
        _at_most(param, value, _EMBEDDING_INPUTS)


def _encoding_format(param: str, value: object) -> None:
    if value not in ("float", "base64"):
        raise InvalidField(
            param,
            f"Invalid '{param}': expected one of 'float' or 'base64'.",
            "invalid_value",
        )


_SAMPLING: dict[str, Callable[[str, object], None]] = {
    "stream": _boolean,
    "stream_options": _stream_options,
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "n": _number(1, 128, integer=True),
    "max_tokens": _number(1, None, integer=True),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "logprobs": _boolean,
    "seed": _number(None, None, integer=True),
    "stop": _stop,
    "user": _string,
    "logit_bias": _logit_bias,
}


def _response_input(param: str, value: object) -> None:
    """A Responses API ``input``: a string, or a non-empty array of items (objects)."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _wrong_type(param, "a string or an array of input items", value)
    _non_empty(param, value)
    _list_of_objects(param, value)


def _string_list(param: str, value: object) -> None:
    if not isinstance(value, list):
        raise _wrong_type(param, "an array of strings", value)
    for i, item in enumerate(value):
        _string(f"{param}[{i}]", item)


_FIELDS: Mapping[str, Mapping[str, Callable[[str, object], None]]] = {
    "chat": {
        **_SAMPLING,
        "messages": _messages,
        "max_completion_tokens": _number(1, None, integer=True),
        "top_logprobs": _number(0, 20, integer=True),
        "tools": _list_of_objects,
        "tool_choice": _string_or_object,
        "parallel_tool_calls": _boolean,
        "response_format": _object,
    },
    "completions": {
        **_SAMPLING,
        "prompt": _prompt_like,
        "logprobs": _number(0, 5, integer=True),
        "echo": _boolean,
        "best_of": _number(1, 20, integer=True),
        "suffix": _string,
    },
    "responses": {
        "input": _response_input,
        "instructions": _string,
        "stream": _boolean,
        "temperature": _number(0, 2),
        "top_p": _number(0, 1),
        "max_output_tokens": _number(1, None, integer=True),
        "top_logprobs": _number(0, 20, integer=True),
        "tools": _list_of_objects,
        "tool_choice": _string_or_object,
        "parallel_tool_calls": _boolean,
        "text": _object,
        "reasoning": _object,
        "previous_response_id": _string,
        "store": _boolean,
        "background": _boolean,
        "metadata": _object,
        "user": _string,
        "include": _string_list,
        "truncation": _string,
    },
    "embeddings": {
        "input": _embedding_input,
        "encoding_format": _encoding_format,
        "dimensions": _number(1, None, integer=True),
        "user": _string,
    },
}


def check(kind: str, body: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidField` for the first field of ``body`` (a ``kind`` request:
    ``chat``, ``completions``, ``embeddings`` or ``responses``) OpenAI would refuse. ``null``
    is accepted for every optional field, as OpenAI does, but not for the required one."""
    fields = _FIELDS[kind]
    for name, value in body.items():
        checker = fields.get(name)
        if checker is None:
            continue
        if value is None and name not in ("messages", "prompt", "input"):
            continue
        checker(name, value)
