"""Labelled examples: a request body (or a text) and its class, read from JSONL."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ExamplesError

__all__ = ["Example", "examples_from", "read_examples"]


@dataclass(frozen=True, slots=True)
class Example:
    """One labelled request: ``body`` is a chat (or Responses) request body, ``label`` its class."""

    body: Mapping[str, Any]
    label: str


def example_from(obj: object, where: str) -> Example:
    """An :class:`Example` from one JSON object: ``{"text"|"messages"|"input"|"body", "label"}``.

    ``where`` names the object in an error (``"FILE line 3"``).
    """
    if not isinstance(obj, Mapping):
        raise ExamplesError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    label = obj.get("label")
    if not isinstance(label, str) or not label.strip():
        raise ExamplesError(f"{where}: 'label' must be a non-empty string")
    given = [key for key in ("text", "messages", "input", "body") if key in obj]
    if len(given) != 1:
        raise ExamplesError(
            f"{where}: give exactly one of 'text', 'messages', 'input' or 'body' "
            f"(found {', '.join(repr(k) for k in given) or 'none'})"
        )
    key = given[0]
    value = obj[key]
    if key == "text":
        if not isinstance(value, str):
            raise ExamplesError(f"{where}: 'text' must be a string")
        body: Mapping[str, Any] = {"messages": [{"role": "user", "content": value}]}
    elif key == "messages":
        if not isinstance(value, list) or not value:
            raise ExamplesError(f"{where}: 'messages' must be a non-empty list of messages")
        for index, message in enumerate(value):
            if not isinstance(message, Mapping) or "role" not in message:
                raise ExamplesError(f"{where}: messages[{index}] must be an object with a 'role'")
        body = {"messages": value}
    elif key == "input":
        if not isinstance(value, (str, list)):
            raise ExamplesError(f"{where}: 'input' must be a string or a list of input items")
        body = {"input": value}
    else:
        if not isinstance(value, Mapping) or not ("messages" in value or "input" in value):
            raise ExamplesError(f"{where}: 'body' must be a request body with messages or input")
        body = value
    return Example(body=body, label=label.strip())


def read_examples(path: str | Path) -> list[Example]:
    """Every example of a JSONL file (one object a line; blank lines skipped).

    Raises :class:`ExamplesError` naming the file and line of the first bad line, or the file
    when it cannot be read or holds no example.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExamplesError(f"{path}: cannot read the examples file: {exc}") from None
    examples: list[Example] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ExamplesError(f"{where}: not valid JSON ({exc.msg})") from None
        examples.append(example_from(obj, where))
    if not examples:
        raise ExamplesError(f"{path}: no examples (expected one JSON object a line)")
    return examples


def examples_from(items: Iterable[object], source: str = "examples") -> list[Example]:
    """Examples from in-memory objects of the JSONL shape (errors name ``source[index]``)."""
    return [example_from(obj, f"{source}[{index}]") for index, obj in enumerate(items)]
