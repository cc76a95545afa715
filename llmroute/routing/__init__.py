"""Routing: live per-target stats, policies (fastest, hedge, race, failover, prefix), backoff.

Public here: :func:`estimate_request`, a request's tokens estimated from its JSON body before
it is sent (what a gateway counts against a key's limits at admission).
"""

from .estimate import RequestEstimate, estimate_request

__all__ = ["RequestEstimate", "estimate_request"]
