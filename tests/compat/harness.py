"""Make the reference (openai) and llmroute clients, sync and async, for the same simulator."""

from __future__ import annotations

import json
from typing import Any

import openai

import llmroute
from llmroute.testing import Simulator

from ..conftest import KEY

LIBS = ["openai", "llmroute"]
VOLATILE = {"id", "created", "system_fingerprint"}
DEFAULT = object()


def normalize(value: Any) -> Any:
    """A dump without the per-request ids and timestamps."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def normalize_line(line: str) -> Any:
    """An SSE or JSON body line, with a JSON payload normalized."""
    prefix = "data: " if line.startswith("data: ") else ""
    payload = line[len(prefix) :]
    try:
        return prefix, normalize(json.loads(payload))
    except ValueError:
        return prefix, payload


def error(exc: openai.OpenAIError) -> tuple[Any, ...]:
    """What application code sees of an error: its type, status, body and message."""
    status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
    body = exc.body if isinstance(exc, openai.APIError) else None
    return type(exc).__name__, status, body, str(exc)


def make_sync(lib: str, sim: Simulator, api_key: Any = DEFAULT, **kwargs: Any) -> Any:
    kwargs["api_key"] = KEY if api_key is DEFAULT else api_key
    kwargs.setdefault("base_url", sim.base_url)
    if lib == "openai":
        http = openai.DefaultHttpxClient(verify=sim.ssl_context())
        return openai.OpenAI(http_client=http, **kwargs)
    return llmroute.OpenAI(verify=sim.ssl_context(), **kwargs)


def make_async(lib: str, sim: Simulator, api_key: Any = DEFAULT, **kwargs: Any) -> Any:
    kwargs["api_key"] = KEY if api_key is DEFAULT else api_key
    kwargs.setdefault("base_url", sim.base_url)
    if lib == "openai":
        http = openai.DefaultAsyncHttpxClient(verify=sim.ssl_context())
        return openai.AsyncOpenAI(http_client=http, **kwargs)
    return llmroute.AsyncOpenAI(verify=sim.ssl_context(), **kwargs)
