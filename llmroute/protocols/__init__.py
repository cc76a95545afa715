"""Wire protocols, one module each (openai, anthropic): decode a target's responses into openai's
types, and one adapter per protocol (:class:`ProtocolAdapter`) holding everything llmroute knows
of it: the request's path, body and headers, the stream decoder, the whole answer's parser, the
request id, usage and continuation rules. :func:`adapter_for` finds a protocol's adapter by the
name the catalog gives it; a new protocol is a module with its adapter, listed here.

Protocols know nothing of routing or sockets.
"""

from __future__ import annotations

from ._adapter import ProtocolAdapter
from .anthropic import ANTHROPIC
from .openai import OPENAI

__all__ = ["PROTOCOLS", "ProtocolAdapter", "adapter_for"]

PROTOCOLS: dict[str, ProtocolAdapter] = {adapter.name: adapter for adapter in (OPENAI, ANTHROPIC)}
"""Every protocol's adapter, by its name in the catalog."""


def adapter_for(protocol: str) -> ProtocolAdapter:
    """The adapter of the wire protocol named ``protocol`` (``"openai"``, ``"anthropic"``)."""
    try:
        return PROTOCOLS[protocol]
    except KeyError:
        raise ValueError(
            f"unknown wire protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}"
        ) from None
