"""A ``/v1`` request's checks before it takes a slot: the body names a model and the fields
its endpoint needs, valid; the key may use that model (and a tier it forces); its token
limit holds (or the key's default one is put in); its latency goal defaults to the key's.
Each refusal is OpenAI's error for it, counted by ``reject(reason)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._timeouts import TimeoutHeaderError, request_timeouts
from ..config import Config
from ..routing.goal import TTFT_TARGET_HEADER
from ._calls import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from ._errors import Refused, error_body, invalid_field, missing, model_not_found
from ._tenants import Tenant
from ._validate import InvalidField, check, shown

__all__ = [
    "KINDS",
    "POSTS",
    "checked_model",
    "default_goal",
    "key_max_tokens",
    "permit",
    "total_timeout",
    "usable",
]

Reject = Callable[[str], None]

POSTS = {CHAT: "messages", COMPLETIONS: "prompt", EMBEDDINGS: "input", RESPONSES: "input"}
"""The API's POST paths and the field each needs beside ``model``."""
KINDS = {CHAT: "chat", COMPLETIONS: "completions", EMBEDDINGS: "embeddings", RESPONSES: "responses"}
_LIMIT_FIELDS = {
    CHAT: ("max_completion_tokens", "max_tokens"),
    COMPLETIONS: ("max_tokens",),
    RESPONSES: ("max_output_tokens",),
}
"""The fields that limit an answer's tokens; a key's ``default_max_tokens`` goes in the last."""


def usable(routes: Iterable[str], tenant: Tenant) -> list[str]:
    """The routes ``tenant`` may use: the only names its 404 may suggest (a key limited to
    some models is never told the name of another)."""
    return [name for name in routes if tenant.may_use(name)]


def checked_model(path: str, body: Mapping[str, Any], reject: Reject) -> str:
    """The body's model, once the body has what ``path`` needs, each field valid."""
    model = body.get("model")
    if "model" not in body:
        raise missing("model")
    if not isinstance(model, str) or not model:
        raise invalid_field(
            InvalidField(
                "model",
                "Invalid 'model': expected a model name (a non-empty string).",
                "invalid_type",
            )
        )
    if POSTS[path] not in body:
        raise missing(POSTS[path])
    try:
        check(KINDS[path], body)
    except InvalidField as invalid:
        reject("invalid_request")
        raise invalid_field(invalid) from None
    return model


def permit(
    config: Config,
    routes: Iterable[str],
    tenant: Tenant,
    model: str,
    body: Mapping[str, Any],
    reject: Reject,
) -> None:
    """404 for a model name the key may not use, as if it did not exist; also for a tier
    forced with ``llmroute.tier`` whose route the key may not use."""
    if tenant.settings.models is None:
        return
    if not tenant.may_use(model):
        reject("model")
        raise model_not_found(model, usable(routes, tenant))
    options = body.get("llmroute")
    forced = options.get("tier") if isinstance(options, Mapping) else None
    tiered = config.tiered.get(model)
    if isinstance(forced, str) and tiered is not None:
        route = tiered.tiers.get(forced, forced)
        if route in config.models and not tenant.may_use(route):
            reject("model")
            raise model_not_found(route)


def key_max_tokens(tenant: Tenant, path: str, body: dict[str, Any], reject: Reject) -> None:
    """The key's ``max_tokens``: a request asking for more is refused (400, naming the
    field); one naming no limit gets the key's ``default_max_tokens``."""
    if path == EMBEDDINGS:
        return
    settings = tenant.settings
    fields = _LIMIT_FIELDS[path]
    named = [f for f in fields if f in body and body[f] is not None]
    if settings.max_tokens is not None:
        for field_name in named:
            value = body[field_name]
            if isinstance(value, int) and value > settings.max_tokens:
                reject("max_tokens")
                raise Refused(
                    400,
                    error_body(
                        f"Invalid '{field_name}': {shown(value)} is above this key's limit of "
                        f"{settings.max_tokens} tokens.",
                        "invalid_request_error",
                        "invalid_value",
                        field_name,
                    ),
                )
    if not named and settings.default_max_tokens is not None:
        body[fields[-1]] = settings.default_max_tokens


def default_goal(body: dict[str, Any], headers: Mapping[str, str], ttft_ms: float) -> None:
    """The key's ``ttft_target_ms`` as the request's own, unless it gives one."""
    if TTFT_TARGET_HEADER in headers:
        return
    options = body.get("llmroute")
    if options is None:
        body["llmroute"] = {"ttft_target_ms": ttft_ms}
    elif isinstance(options, dict) and "ttft_target_ms" not in options:
        options["ttft_target_ms"] = ttft_ms


def total_timeout(
    config: Config, headers: Mapping[str, str], model: str, reject: Reject
) -> float | None:
    """The request's total timeout: its ``x-llmroute-timeout-total`` (its timeout headers
    checked, 400 naming the one at fault), else its route's ``total_timeout``."""
    try:
        own = request_timeouts(headers)
    except TimeoutHeaderError as exc:
        reject("invalid_request")
        raise Refused(
            400, error_body(str(exc), "invalid_request_error", "invalid_value", exc.header)
        ) from None
    total = own.total
    if total is None and (model in config.models or model in config.tiered):
        tiered = config.tiered.get(model)  # a tiered name: its default tier's
        total = config.models[tiered.default if tiered else model].total_timeout
    return total
