"""Transport: per-target connection pools (HTTP/2 over TLS on h2, HTTP/1.1 keep-alive otherwise)."""

from ._pool import (
    Transport,
    body_receiver,
    bound_wait,
    close_quietly,
    make_ssl_context,
    replay_head,
    response_timings,
)
from ._sse import ServerSentEvent, SSEDecodeError, SSEDecoder

__all__ = [
    "SSEDecodeError",
    "SSEDecoder",
    "ServerSentEvent",
    "Transport",
    "body_receiver",
    "bound_wait",
    "close_quietly",
    "make_ssl_context",
    "replay_head",
    "response_timings",
]
