"""Routing: live per-target stats, policies (fastest, hedge, race, failover, prefix), backoff."""
