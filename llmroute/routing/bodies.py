"""What a request's run sends each target (:class:`TargetBodies`): the caller's body with the
target's model, the usage its stream is asked for, its limit's field and, for a continuation,
the answer so far; and the targets whose protocol cannot express the request at all."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from openai import BadRequestError

from ..protocols import adapter_for
from .accounts import TokenAccount
from .continuation import continuation_body
from .route import Route, RouteTarget

__all__ = ["TargetBodies"]


class TargetBodies:
    """The bodies of one request, one per target (and per continuation)."""

    def __init__(
        self, body: dict[str, Any], kind: str, stream: bool, account: TokenAccount
    ) -> None:
        self.body = body
        self.kind = kind
        self.stream = stream
        self.account = account
        self.raw = False
        """The caller reads the vendor's body itself: usage it did not ask for is not asked
        (it would be in that body; the count falls back on one token per delta)."""

    def refuse_unservable(
        self, route: Route, refused: set[str], unservable: Iterable[str] = ()
    ) -> None:
        """Leave out (add to ``refused``) the targets the caller named as unable to serve the
        call, and those whose protocol cannot express this request (an Anthropic target asked
        for ``n > 1``, say); raise the first refusal if no target is left."""
        refused.update(unservable)
        first: BadRequestError | None = None
        for target in route.targets:
            adapter = adapter_for(target.protocol)
            if not adapter.translates or self.kind != "chat":
                continue
            try:
                adapter.wire_request(
                    "chat/completions", self.body_for(target, None), target=target.name
                )
            except BadRequestError as exc:
                refused.add(target.name)
                first = first or exc
        if first is not None and len(refused) == len(route.targets):
            raise first

    def body_for(self, target: RouteTarget, prefix: str | None) -> dict[str, Any]:
        body = dict(self.body)
        body["model"] = target.model
        if self.kind != "chat":
            return body
        if not target.stream_usage:
            body.pop("stream_options", None)
        elif self.asks_usage(target):
            # The vendor's count of its tokens: at the end of a completed answer (it calibrates
            # the target's estimate, :mod:`.tokens`), or on every chunk where it can.
            options = dict(cast(Mapping[str, Any], body.get("stream_options") or {}))
            options["include_usage"] = True
            if target.stream_usage_continuous:
                options["continuous_usage_stats"] = True
            body["stream_options"] = options
        if target.max_tokens_field is not None:
            adapter_for(target.protocol).send_limit_as(body, target.max_tokens_field)
        if prefix is not None:
            continuation_body(body, target, prefix, self.account.delivered)
        return body

    def asks_usage(self, target: RouteTarget) -> bool:
        """Whether :meth:`body_for` asks ``target`` for usage in the stream."""
        return (
            self.stream
            and not self.raw
            and self.kind == "chat"
            and target.stream_usage
            and adapter_for(target.protocol).stream_usage
            and isinstance(self.body.get("stream_options") or {}, Mapping)
        )
