"""Cache keys: a canonical hash of what changes an answer, in a tenant's namespace.

Pure functions, no I/O. A request body is reduced to the fields that can change the answer
(the model or route name, messages, tools, response_format, sampling parameters, seed, and any
parameter this module does not know, to be safe); the stream flag and the fields that only
label or bill a request are left out, and timeouts and headers are never in a body.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from .._errors import RequestBodyError

__all__ = [
    "NAMESPACE_PATTERN",
    "canonical_request",
    "check_namespace",
    "is_deterministic",
    "request_key",
    "tenant_namespace",
]

# Fields that never change the answer's content: how it is delivered, who asked, how it is billed.
_IGNORED = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
    }
)

NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


_PLAIN = (str, int, bool, type(None))


def _normal(value: Any) -> Any:
    """``value`` with integral floats as ints (``0.0`` and ``0`` are the same temperature)."""
    kind = type(value)
    if kind in _PLAIN:  # the exact JSON types first: no abstract-class checks on the hot path
        return value
    if kind is dict:
        return {str(k): _normal(v) for k, v in value.items()}
    if kind is list:
        return [_normal(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def canonical_request(body: Mapping[str, Any], *, model: str) -> bytes:
    """The bytes two requests share exactly when they ask for the same answer.

    ``model`` is what the application asked for (a route's name for a routed request). A body
    JSON cannot encode (nested too deeply, a circular reference) raises
    :class:`~llmroute._errors.RequestBodyError`.
    """
    fields = {k: v for k, v in body.items() if k not in _IGNORED}
    fields["model"] = model
    try:
        text = json.dumps(
            _normal(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
    except RecursionError:
        raise RequestBodyError("The request body is nested too deeply to encode as JSON") from None
    except ValueError as exc:  # an int of more than 4300 digits, a circular reference
        raise RequestBodyError(f"The request body cannot be encoded as JSON: {exc}") from None
    return text.encode()


def request_key(body: Mapping[str, Any], *, model: str, namespace: str) -> str:
    """``"<namespace>/<sha256 of the canonical request>"``."""
    return f"{namespace}/{hashlib.sha256(canonical_request(body, model=model)).hexdigest()}"


@functools.lru_cache(maxsize=1024)
def tenant_namespace(*secrets: str | None) -> str:
    """A namespace derived from the API keys in use, so tenants never share answers.

    A one-way hash (the keys cannot be recovered from it): ``"t-"`` and 24 hex digits.
    Remembered for the last 1,024 tenants (in memory only, where the keys already are): it
    was a tenth of a cache hit's time.
    """
    digest = hashlib.sha256(b"llmroute cache tenant v1")
    for secret in secrets:
        digest.update(b"\0" + (secret or "").encode())
    return "t-" + digest.hexdigest()[:24]


def check_namespace(name: str, *, field: str) -> str:
    """``name`` if it is a valid namespace, else ``ValueError`` naming ``field``."""
    if not NAMESPACE_PATTERN.fullmatch(name):
        raise ValueError(
            f"{field}: a cache namespace is 1 to 64 letters, digits, '.', '_' or '-', "
            f"got {name[:80]!r}"
        )
    return name


def is_deterministic(body: Mapping[str, Any]) -> bool:
    """Whether the request asks for a repeatable answer: temperature 0, or a seed."""
    return body.get("temperature") == 0 or body.get("seed") is not None
