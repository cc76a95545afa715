"""The contract of a wire protocol's adapter: what llmroute knows of one protocol, in one place.

Every layer that needs to know a vendor's wire format asks the target's adapter
(:func:`llmroute.protocols.adapter_for`) instead of testing the protocol's name: the upstream
request (path, body, headers), the engine (body shaping, the stream decoder, the whole
answer's parser, the request id), the seam (which endpoints it serves) and the command line
(whether openai's own client speaks it). A vendor's own settings (base URL, key variable,
continuation, length field...) stay data in the catalog (``providers/*.toml``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from .._prices import UsageFields

__all__ = ["ProtocolAdapter"]


class ProtocolAdapter:
    """One wire protocol: how a chat call is sent in it and how its answers are read.

    ``kind`` names the API of a call: ``"chat"`` (chat completions, the shape llmroute routes
    in), ``"responses"``, ``"completions"`` or ``"embeddings"``.
    """

    name: ClassVar[str]
    """The protocol's name in the catalog (``protocol = "..."``)."""
    speaks_openai: ClassVar[bool] = False
    """openai's own client can talk to a provider of this protocol as it is."""
    translates: ClassVar[bool] = False
    """A chat body is translated for the wire (:meth:`wire_request`); a request the protocol
    cannot express is refused there, before anything is sent."""
    stream_usage: ClassVar[bool] = False
    """The protocol takes ``stream_options.include_usage`` (a usage chunk ending a stream)."""
    usage_fields: ClassVar[UsageFields]
    """Where the protocol's ``usage`` object reports each class of tokens billed (a catalog
    entry's own ``[usage]`` table overrides it)."""

    def serves(self, kind: str) -> bool:
        """Whether the protocol has the API ``kind`` at all (a provider may still lack it)."""
        raise NotImplementedError

    def headers(
        self, api_key: str | None, *, user_agent: str, configured: Mapping[str, str]
    ) -> dict[str, str]:
        """The headers of every request to a provider: its key, the protocol's own headers
        and the ones ``configured`` for the provider."""
        raise NotImplementedError

    def models_request(self, api_key: str) -> tuple[dict[str, str], dict[str, Any]]:
        """The key header and query of a ``GET {base_url}/models`` listing every model."""
        raise NotImplementedError

    def wire_request(
        self, path: str, body: Mapping[str, Any], *, target: str
    ) -> tuple[str, Mapping[str, Any]]:
        """The path (relative to the base URL) and body sent for a call to ``path`` with
        ``body`` (openai's shape); ``openai.BadRequestError`` naming ``target`` and the
        parameter for what the protocol cannot express."""
        raise NotImplementedError

    def send_limit_as(self, body: dict[str, Any], field: str) -> None:
        """Send a chat body's answer limit under ``field`` (the catalog's
        ``max_tokens_field``), where the protocol leaves the choice to the vendor."""
        raise NotImplementedError

    def stream_decoder(
        self,
        kind: str,
        *,
        request: httpx.Request,
        target: str,
        body: Mapping[str, Any],
        include_usage: bool,
    ) -> Any:
        """The decoder of a streamed answer to ``body`` (as sent, before :meth:`wire_request`):
        a :class:`~llmroute.protocols.openai.ChatStreamDecoder` or a subclass (named here as
        ``Any``: this interface sits below the protocols that implement it);
        ``include_usage``: the caller asked for a usage chunk."""
        raise NotImplementedError

    def parse_answer(
        self, kind: str, response: httpx.Response, *, target: str, body: Mapping[str, Any]
    ) -> Any:
        """openai's object for the whole (not streamed) answer in ``response`` to ``body``."""
        raise NotImplementedError

    def request_id(self, headers: Mapping[str, str]) -> str | None:
        """The vendor's id of a request, from its response's headers."""
        raise NotImplementedError

    def answer_usage(self, kind: str, completion: Any, response: httpx.Response) -> Any:
        """The vendor's own ``usage`` of a whole answer to a ``kind`` call, in the shape
        :attr:`usage_fields` read (the priced one; ``None`` when it sent none): openai's
        object as the vendor sent it, or from ``response``'s body where ``completion`` is
        ``None`` (an answer openai's machinery parses: legacy completions, embeddings)."""
        return getattr(completion, "usage", None)
