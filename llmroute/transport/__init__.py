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

__all__ = [
    "Transport",
    "body_receiver",
    "bound_wait",
    "close_quietly",
    "make_ssl_context",
    "replay_head",
    "response_timings",
]
