"""The Redis connection the cache and the shared routing stats use, and its secret-safe name.

Both use redis-py's synchronous client from worker threads (its asyncio client does not run on
trio). A Redis URL may carry a password, in its user part or a ``password=`` query: it never
appears in a description, a log line or an error message.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["RedisConnection", "redact_url"]


def redact_url(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` query) shown as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, True)]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


class RedisConnection:
    """A redis-py client for ``url`` whose every command gives up after ``timeout`` seconds."""

    def __init__(self, url: str, *, timeout: float, purpose: str) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            from ._install import install_hint

            raise ImportError(
                f"{purpose} needs the redis package: {install_hint('redis')}"
            ) from exc
        self.url = redact_url(url)
        parts = urlsplit(url)
        passwords = [parts.password, *(v for k, v in parse_qsl(parts.query) if k == "password")]
        self._secrets = {form for p in passwords if p for form in (p, unquote(p))}
        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # One immediate retry on a fresh connection (a pooled one may have gone stale); no
        # backoff, so an unreachable server fails within about two timeouts.
        self.client: Any = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
        )

    def reason(self, exc: BaseException) -> str:
        """``exc`` as one line, with any password in it replaced by ``***``."""
        text = f"{type(exc).__name__}: {exc}"
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def close(self) -> None:
        self.client.close()
