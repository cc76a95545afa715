"""``llmroute serve``: an OpenAI-compatible gateway, so any language's OpenAI client gets the
routing, hedging, failover and cache of one :class:`llmroute.AsyncOpenAI`.

:class:`GatewayApp` is a raw ASGI app (no web framework); :func:`serve` runs it with hypercorn
(the ``server`` extra), and :class:`Gateway` runs it from a background thread on an ephemeral
port, for tests and benchmarks::

    with Gateway({"providers": ..., "models": ..., "gateway": {"keys": {"app": "GW_KEY"}}}) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key=os.environ["GW_KEY"])

See docs/gateway.md for the ``[gateway]`` table, the error and streaming semantics and metrics.
"""

from __future__ import annotations

from ._app import GatewayApp, dump_json
from ._auth import KeyRing
from ._metrics import GatewayMetrics
from ._run import LOOPS, Gateway, base_url, listen, loop_factory, serve

__all__ = [
    "LOOPS",
    "Gateway",
    "GatewayApp",
    "GatewayMetrics",
    "KeyRing",
    "base_url",
    "dump_json",
    "listen",
    "loop_factory",
    "serve",
]
