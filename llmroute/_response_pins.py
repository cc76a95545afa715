"""Where the Responses API's responses are kept: each response id this client made, pinned to
the target that holds it, so a call that continues it (``previous_response_id``) is planned
over that target only, and one no target can continue is refused before anything is sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from ._call import Call, bad_request, serves
from .config import ResolvedProvider
from .routing.route import Route

__all__ = ["ResponsePins"]


class ResponsePins:
    """The targets that hold this client's Responses API responses, by response id."""

    def __init__(self, providers: Mapping[str, ResolvedProvider]) -> None:
        self.providers = providers
        """The client's providers (the dispatch's own dict: providers added later count)."""
        self.pins: dict[str, str] = {}
        """Responses API ids by the target that holds them (``previous_response_id``)."""

    def holder(self, response_id: str) -> str | None:
        """The target that holds ``response_id``, if this client made it there."""
        return self.pins.get(response_id)

    def pin(self, response_id: str, target: str) -> None:
        """Remember that ``target`` holds the Responses API response ``response_id``, where its
        vendor keeps the responses it issued (``responses_stored``): a follow-up of a response
        no vendor kept gets llmroute's own error before anything is sent (:meth:`unservable`),
        not a stateless vendor's 400."""
        provider = self.providers.get(target.partition(":")[0])
        if provider is not None and not provider.spec.responses_stored:
            return
        pins = self.pins
        pins[response_id] = target
        if len(pins) > 10_000:
            for key in list(pins)[:1_000]:
                del pins[key]

    # -- the client's own methods ----------------------------------------------------------

    def note_event(self, event: Any, target: str | None) -> None:
        """Remember the target of a Responses stream whose ``response.created`` event this is."""
        if target is not None and getattr(event, "type", None) == "response.created":
            rid = getattr(getattr(event, "response", None), "id", None)
            if isinstance(rid, str):
                self.pin(rid, target)

    def unservable(self, call: Call, route: Route) -> set[str]:
        """The route's targets that cannot serve ``call``: those whose vendor lacks its API,
        and for a Responses call that continues an earlier response (``previous_response_id``)
        every target but the one that holds it (when this client made it), else those that do
        not keep responses. Raises ``BadRequestError`` if none is left."""
        if call.kind == "chat":
            return set()
        providers = self.providers
        out = {t.name for t in route.targets if not serves(providers[t.provider], call.kind)}
        previous = call.body.get("previous_response_id")
        if call.kind == "responses" and isinstance(previous, str):
            pinned = self.pins.get(previous)
            out.update(
                t.name
                for t in route.targets
                if (t.name != pinned if pinned else not providers[t.provider].spec.responses_stored)
            )
            if len(out) >= len(route.targets):
                raise bad_request(
                    f"route {route.name!r}: no target keeps responses, so none can continue "
                    f"previous_response_id {previous[:64]!r} (see `responses_stored` in the "
                    "catalog)",
                    param="previous_response_id",
                )
        return out

    async def pinning(self, events: AsyncIterator[Any], target: str | None) -> AsyncIterator[Any]:
        """A routed Responses stream's events, remembering the target that holds its response."""
        try:
            async for event in events:
                self.note_event(event, target)
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]  # resets an unfinished stream
