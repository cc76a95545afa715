"""The values a config's fields take: durations, sizes, targets, paths, environment variables'
names, and the validators that read them (errors via :func:`invalid`)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator

from ._messages import invalid, show, suggest

__all__ = [
    "CACHE_DIR_ENV",
    "Duration",
    "Size",
    "Target",
    "default_cache_dir",
    "parse_duration",
    "parse_size",
]

_PERCENTILES = ("p50", "p90", "p95", "p99")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_HINT = "expected a duration such as '5m', '300s' or 300"
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(b|kb|kib|mb|mib|gb|gib)?", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
}


def parse_duration(value: float | str) -> float:
    """Seconds from a number of seconds or a string such as ``"250ms"``, ``"1.5s"``, ``"5m"``,
    ``"1h"`` or ``"2 s"``; raises :class:`ValueError` for anything else, negative or not finite.
    """
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is not None:
            seconds = float(match[1]) * _UNITS[(match[2] or "s").lower()]
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{_DURATION_HINT}, got {show(value)}")
    return seconds


def parse_size(value: int | str) -> int:
    """Bytes from a number or a string such as ``"64MiB"``, ``"500kb"`` or ``"1 GB"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if match is not None:
            size = float(match[1]) * _SIZE_UNITS[(match[2] or "b").lower()]
            if math.isfinite(size):
                return int(size)
    raise ValueError(f"expected a size such as '256MiB', '500kB' or 1048576, got {show(value)}")


@dataclass(frozen=True, slots=True)
class Target:
    """One place a route may send a request: a provider and the model name it knows."""

    provider: str
    model: str

    @property
    def name(self) -> str:
        """``"provider:model"``, as written in a route's ``targets``."""
        return f"{self.provider}:{self.model}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """Split ``"provider:model"`` on the first colon (model names may contain colons)."""
        provider, sep, model = text.partition(":")
        if not sep or not provider or not model:
            raise ValueError(f"{text!r} is not 'provider:model'")
        if provider != provider.strip() or model != model.strip():
            raise ValueError(f"{text!r} is not 'provider:model' (no spaces around ':')")
        return cls(provider, model)

    def __str__(self) -> str:
        return self.name


def _duration_input(value: Any) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise invalid(str(exc)) from None


def word_or_duration(value: Any, words: tuple[str, ...], example: str) -> str | float:
    """One of ``words`` (any case, returned lower-case) or a duration in seconds; an error
    listing the words and ``example`` (with a did-you-mean for a near word) otherwise."""
    if isinstance(value, str) and value.strip().lower() in words:
        return value.strip().lower()
    try:
        return parse_duration(value)
    except ValueError:
        hint = suggest(value, words) if isinstance(value, str) else ""
        listed = ", ".join(repr(word) for word in words)
        raise invalid(
            f"expected {listed} or a duration such as {example!r}, got {show(value)}{hint}"
        ) from None


def stall_input(value: Any) -> str | float:
    seconds = word_or_duration(value, ("auto", "off"), "5s")
    if isinstance(seconds, str):
        return seconds
    if not seconds > 0:
        raise invalid(f"expected a positive duration, got {show(value)}")
    return seconds


def _size_input(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise invalid(str(exc)) from None


def hedge_after_input(value: Any) -> str | float:
    return word_or_duration(value, _PERCENTILES, "400ms")


def target_input(value: Any) -> str:
    if isinstance(value, Target):
        return value.name
    if not isinstance(value, str):
        raise invalid(f"expected a 'provider:model' string, got {show(value)}")
    try:
        Target.parse(value)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    return value


def empty_is_none(value: Any) -> Any:
    return None if value == "" else value


def verify_input(value: Any) -> bool | str | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        path = os.path.expanduser(value.strip())
        if not os.path.exists(path):
            raise invalid(f"{value!r}: no such CA file or directory")
        return path
    raise invalid(f"expected true, false or the path of a CA file (PEM), got {show(value)}")


Duration = Annotated[float, BeforeValidator(_duration_input)]


Size = Annotated[int, BeforeValidator(_size_input)]


CACHE_DIR_ENV = "LLMROUTE_CACHE_DIR"
"""Where llmroute keeps what it can rebuild (the disk cache's default ``path``, fitted tier
classifiers); default ``$XDG_CACHE_HOME/llmroute``, else ``~/.cache/llmroute``."""


def default_cache_dir() -> str:
    """``$LLMROUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/llmroute``, else ``~/.cache/llmroute``."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return os.path.expanduser(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llmroute")


ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
KEY_NAME = r"^[A-Za-z0-9._-]{1,64}$"


def env_var_input(value: Any) -> str:
    if not isinstance(value, str) or not ENV_VAR_NAME.fullmatch(value) or value.startswith("sk-"):
        # Never echo the input: it may be a key pasted where its variable's name belongs.
        raise invalid("expected the name of an environment variable (A-Z, 0-9, _), not a key")
    return value


def path_input(value: Any) -> Any:
    if isinstance(value, str) and value:
        return os.path.expanduser(value)
    return empty_is_none(value)
