"""A config's mistakes in words: the error, dotted keys, values shown safely, pydantic's errors
and TOML's retold as one sentence each, naming the file and the key."""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
from openai import OpenAIError
from pydantic_core import ErrorDetails, PydanticCustomError

from .._catalog import format_validation_error

__all__ = [
    "DEFAULT_SOURCE",
    "ConfigError",
    "describe",
    "dotted",
    "invalid",
    "read_toml",
    "show",
    "suggest",
    "unknown_provider",
    "unknown_route",
]

DEFAULT_SOURCE = "config"
_ERROR_TYPE = "llmroute_config"

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


class ConfigError(OpenAIError, ValueError):
    """A config that cannot be used: the message names the source, the dotted key and the fault."""


def invalid(message: str, *key: str | int) -> PydanticCustomError:
    return PydanticCustomError(_ERROR_TYPE, "{message}", {"message": message, "key": dotted(key)})


def dotted(parts: Iterable[str | int]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
            out = f"{out}.{text}" if out else text
    return out


def _join(key: str, more: str) -> str:
    if not key or not more:
        return key or more
    return key + more if more.startswith("[") else f"{key}.{more}"


def show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def suggest(word: object, choices: Iterable[str]) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_route(name: str, routes: Iterable[str]) -> str:
    return f"{name!r} is not a route (a [models] table with targets){suggest(name, routes)}"


def unknown_provider(name: str, known: Sequence[str]) -> str:
    return f"unknown provider {name!r}: not in [providers] nor the catalog{suggest(name, known)}"


_EXPECTED = {
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "list_type": "expected an array",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def describe(
    exc: pydantic.ValidationError,
    source: str,
    fields_at: Callable[[Sequence[str | int]], list[str]] | None = None,
) -> str:
    """Pydantic's errors in the words of a config file; inputs under ``api_key`` never shown.
    ``fields_at`` names the keys a table at a location may have, for "did you mean" hints."""
    errors = exc.errors()
    base = format_validation_error(exc, source=source).split("\n")
    lines = []
    for index, err in enumerate(errors):
        given = err["loc"]
        loc = ("models", *given[1:]) if given[:1] == ("tiered",) else given  # as written
        if "[key]" in loc and loc[:2] in (("gateway", "keys"), ("gateway", "tenants")):
            # A gateway key's name that is no name may be the key itself: never echoed.
            lines.append(
                f"{source}: {dotted(loc[:2])}: a key's name is letters, digits, '.', '_' and '-' "
                "(at most 64); one is not (it is not shown: it may be a key)"
            )
            continue
        key = dotted(loc)
        if err["type"] == _ERROR_TYPE:
            key = _join(key, str((err.get("ctx") or {}).get("key", "")))
        what = _fault(err, loc, fields_at)
        if what is None:  # pydantic's own words, where they show no secret
            written = ".".join(str(part) for part in loc if part != "")
            prefix = f"{source}: {written or '(top level)'}: "
            line = base[index] if len(base) == len(errors) else ""
            safe = not _secret(loc) and not isinstance(err.get("input"), Mapping | list)
            what = line.removeprefix(prefix) if safe and line.startswith(prefix) else err["msg"]
        lines.append(f"{source}: {key or '(top level)'}: {what}")
    return "\n".join(lines)


def _secret(loc: Sequence[str | int]) -> bool:
    """A key pasted in the wrong place must not be echoed: inputs under api_key, api_key_env,
    headers, sha256 or env, and whole provider entries, are never shown."""
    return (
        "api_key" in loc
        or "api_key_env" in loc
        or "api_key_env_fallbacks" in loc
        or "headers" in loc
        or "sha256" in loc
        or "env" in loc
        or (len(loc) == 2 and loc[0] == "providers")
    )


def _fault(
    err: ErrorDetails,
    loc: Sequence[str | int],
    fields_at: Callable[[Sequence[str | int]], list[str]] | None,
) -> str | None:
    """One error's fault in a config's words; ``None`` for a kind without words of ours."""
    kind = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    secret = _secret(loc)
    got = "" if secret else f", got {show(err.get('input'))}"
    if kind == _ERROR_TYPE:
        return str(ctx.get("message", err["msg"]))
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        hint = "" if secret else suggest(err.get("input"), re.findall(r"'([^']*)'", expected))
        return f"expected {expected}{got}{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        known = fields_at(err["loc"][:-1]) if fields_at is not None else []
        return "unknown key" + suggest(loc[-1], known)
    if kind in _EXPECTED:
        return _EXPECTED[kind] + got
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        bound = ctx.get(name)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"expected a number {words} {bound}{got}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    return None


def read_toml(path: str, *, missing: str) -> dict[str, Any]:
    """The TOML file at ``path``; :class:`ConfigError` saying where it is not valid TOML."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(missing) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the path
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        position = _TOML_POSITION.search(text)
        where = ""
        if position is not None:
            text = text[: position.start()]
            where = f"line {position[1]}, column {position[2]}: "
        text = text.replace(" (at end of document)", "")
        if text[:1].isupper() and text[1:2].islower():
            text = text[0].lower() + text[1:]
        raise ConfigError(f"{path}: {where}not valid TOML: {text}") from None
    return data
