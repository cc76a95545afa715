"""Deterministic JSON instances of a JSON schema (the simulator's structured outputs).

:func:`instance` answers a ``json_schema`` response format, a function's ``parameters`` and a
schema found in a ``json_object`` prompt with a value that validates against the schema, the
way pydantic emits schemas: objects (every property; past :data:`MAX_DEPTH` only the required
ones), ``additionalProperties`` maps, strings (``format``, length bounds), integers and numbers
(bounds, ``multipleOf``), booleans, null, arrays (``minItems``/``maxItems``, ``prefixItems``),
``enum``, ``const``, ``$ref`` into ``$defs``/``definitions`` (recursive models end where an
``anyOf`` allows null or an array may be empty), ``anyOf``/``oneOf`` (the first non-null branch),
``allOf`` (merged) and type lists. ``pattern`` is not honoured.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

__all__ = ["MAX_DEPTH", "find_schema", "instance"]

MAX_DEPTH = 6
_WORDS = ("fast", "token", "route", "cache", "warm", "edge", "model", "reply", "vendor", "pool")
_FORMATS = {
    "date-time": "2024-05-01T12:00:00Z",
    "date": "2024-05-01",
    "time": "12:00:00",
    "duration": "PT1H",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}


def instance(schema: Any, seed: int) -> Any:
    """A value that fits ``schema``, the same for the same schema and seed."""
    root = schema if isinstance(schema, dict) else {}
    return _Builder(root, random.Random(seed)).value(root, 0)


def find_schema(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that looks like a JSON schema (a ``json_object``
    prompt that spells out its schema, as instructor's JSON mode does), else None."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and ("properties" in obj or "$defs" in obj):
            return obj
    return None


class _Builder:
    def __init__(self, root: dict[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while "$ref" in schema and seen < 32:
            ref = schema["$ref"]
            target: Any = self.root
            if isinstance(ref, str) and ref.startswith("#"):
                for part in filter(None, ref[1:].split("/")):
                    target = target.get(part, {}) if isinstance(target, dict) else {}
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**(target if isinstance(target, dict) else {}), **rest}
            seen += 1
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if isinstance(part, dict):
                    part = self.resolve(part)
                    props = {**merged.get("properties", {}), **part.get("properties", {})}
                    required = [*merged.get("required", []), *part.get("required", [])]
                    merged = {**part, **merged}
                    if props:
                        merged["properties"] = props
                    if required:
                        merged["required"] = required
            schema = merged
        return schema

    def value(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict):
            return self.string({})
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            branches = [b for b in schema.get(key) or [] if isinstance(b, dict)]
            if branches:
                real = [b for b in branches if self.resolve(b).get("type") != "null"]
                if not real or (depth >= MAX_DEPTH and len(real) < len(branches)):
                    return None
                return self.value(real[0], depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            if not kinds or (depth >= MAX_DEPTH and "null" in kind):
                return None
            kind = kinds[0]
        if kind is None:
            if "properties" in schema or "additionalProperties" in schema:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
            else:
                kind = "string"
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return self.number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self.string(schema)

    def object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if depth < MAX_DEPTH or name in required:
                out[name] = self.value(sub, depth + 1)
        extra = schema.get("additionalProperties")
        if not props and isinstance(extra, dict) and depth < MAX_DEPTH:
            out[self.rng.choice(_WORDS)] = self.value(extra, depth + 1)
        least = schema.get("minProperties") or 0
        while len(out) < least:
            out[f"key{len(out)}"] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
        return out

    def array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = [s for s in schema.get("prefixItems") or [] if isinstance(s, dict)]
        if prefix:
            return [self.value(s, depth + 1) for s in prefix]
        low = int(schema.get("minItems") or 0)
        high = schema.get("maxItems")
        count = low if depth >= MAX_DEPTH else max(low, 2 if depth < 2 else 1)
        if isinstance(high, int):
            count = min(count, high)
        items = schema.get("items")
        return [
            self.value(items if isinstance(items, dict) else {}, depth + 1) for _ in range(count)
        ]

    def integer(self, schema: dict[str, Any]) -> int:
        low, high = _bounds(schema, 0, 100)
        low_i, high_i = _ceil(low), int(high // 1)
        if "exclusiveMinimum" in schema and low_i <= schema["exclusiveMinimum"]:
            low_i += 1
        if "exclusiveMaximum" in schema and high_i >= schema["exclusiveMaximum"]:
            high_i -= 1
        value = self.rng.randint(low_i, max(low_i, high_i))
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            value = _ceil(low_i / step) * step
        return value

    def number(self, schema: dict[str, Any]) -> float:
        low, high = _bounds(schema, 0.0, 100.0)
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and step > 0:
            return float(_ceil(low / step) * step)
        value = low + (high - low) * self.rng.uniform(0.25, 0.75)
        rounded = round(value, 2)
        return rounded if low < rounded < high or low == high else value

    def string(self, schema: dict[str, Any]) -> str:
        fmt = schema.get("format")
        text = _FORMATS.get(fmt, "") if isinstance(fmt, str) else ""
        if not text:
            text = " ".join(self.rng.choices(_WORDS, k=2))
        low = int(schema.get("minLength") or 0)
        high = schema.get("maxLength")
        while len(text) < low:
            text += " " + self.rng.choice(_WORDS)
        if isinstance(high, int):
            text = text[:high]
        return text


def _bounds(schema: dict[str, Any], low: float, high: float) -> tuple[float, float]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    if isinstance(lo, int | float):
        low = float(lo)
        high = max(high, low + 100)
    if isinstance(hi, int | float):
        high = float(hi)
        if lo is None:
            low = min(low, high - 100)
    return low, high


def _ceil(x: float) -> int:
    return -int(-x // 1)
