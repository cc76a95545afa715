"""A ``/v1`` request's checks before it takes a slot: the body is a JSON object naming a model
and the fields its endpoint needs, valid (:class:`BodyChecks`: off the event loop for a large
body); the key may use that model (and a tier it forces); its token limit holds (or the key's
default one is put in); its latency goal defaults to the key's. Each refusal is OpenAI's error
for it, counted by ``reject(reason)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.to_thread

from .._timeouts import TimeoutHeaderError, request_timeouts
from ..config import Config
from ..routing.estimate import prompt_tokens
from ..routing.goal import TTFT_TARGET_HEADER
from ._calls import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from ._errors import Refused, error_body, invalid_field, missing, model_not_found
from ._exchange import parse_json
from ._tenants import Tenant
from ._validate import InvalidField, check, shown

__all__ = [
    "KINDS",
    "OFF_LOOP_BYTES",
    "OFF_LOOP_THREADS",
    "POSTS",
    "BodyChecks",
    "Reject",
    "checked_body",
    "checked_model",
    "default_goal",
    "key_max_tokens",
    "permit",
    "total_timeout",
    "usable",
]

Reject = Callable[[str], None]
"""Counts a refusal of the request by its reason."""

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


OFF_LOOP_BYTES = 64 * 1024
"""A body of at least this many bytes is parsed and checked in a worker thread. Its parse and
checks take about 1 ms of CPU at this size, on the event loop less than a thread's hand-off
costs; at ``max_body_bytes`` (4 MiB) 50 to 90 ms, every other key's stream waiting that long
(several times that on a loaded machine)."""
OFF_LOOP_THREADS = 2
"""Worker threads parsing large bodies at once: more only contend for the GIL, and many large
bodies at once cannot take every worker thread of the loop (anyio's 40) from other work."""


class BodyChecks:
    """A ``/v1`` body parsed and checked (:func:`checked_body`): on the event loop when it is
    small, in one of ``threads`` worker threads when it has at least ``off_loop_bytes`` (the
    parse and the checks are linear passes over the body; on the loop they held every other
    key's stream for their whole length). The answer, body or refusal, is the same either way."""

    def __init__(
        self, off_loop_bytes: int = OFF_LOOP_BYTES, threads: int = OFF_LOOP_THREADS
    ) -> None:
        self.off_loop_bytes = off_loop_bytes
        self.limiter = anyio.CapacityLimiter(threads)

    async def checked(
        self, path: str, data: bytes, reject: Reject
    ) -> tuple[dict[str, Any], str, int]:
        """``data`` as ``path``'s checked body, the model it names and its prompt's tokens
        (:func:`~llmroute.routing.estimate_request`'s, the limits' and the routing's, counted
        here once: another pass over the body), or a ``Refused``."""
        if len(data) < self.off_loop_bytes:
            return _checked_and_counted(path, data, reject)
        return await anyio.to_thread.run_sync(
            _checked_and_counted, path, data, reject, limiter=self.limiter
        )


def _checked_and_counted(path: str, data: bytes, reject: Reject) -> tuple[dict[str, Any], str, int]:
    body, model = checked_body(path, data, reject)
    return body, model, prompt_tokens(body, KINDS[path])


def checked_body(path: str, data: bytes, reject: Reject) -> tuple[dict[str, Any], str]:
    """``data`` parsed as a JSON object and checked for ``path`` (:func:`checked_model`), with
    the model it names; a ``Refused`` (400) naming what is wrong. ``reject`` may be called
    from a worker thread (the gateway's counts are thread-safe)."""
    body = parse_json(data, reject)
    return body, checked_model(path, body, reject)


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
