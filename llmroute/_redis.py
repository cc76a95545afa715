"""The Redis connection the cache and the shared routing stats use, and its secret-safe name.

Both use redis-py's synchronous client from worker threads (its asyncio client does not run on
trio). A Redis URL may carry a password, in its user part or a ``password=`` query: it never
appears in a description, a log line or an error message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["RedisCaller", "RedisConnection", "redact_url"]


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
            import redis.exceptions
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            from ._install import install_hint

            raise ImportError(
                f"{purpose} needs the redis package: {install_hint('redis')}"
            ) from exc
        self.url = redact_url(url)
        self.raw_url = url  # for another client of the same server; never shown
        self.timeout = timeout
        parts = urlsplit(url)
        passwords = [parts.password, *(v for k, v in parse_qsl(parts.query) if k == "password")]
        self._secrets = {form for p in passwords if p for form in (p, unquote(p))}
        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)
        # Of those, the ones that say the server cannot be used now (an outage); any other
        # (a script's error, a wrong argument) is an answer from a working server.
        self.unreachable: tuple[type[BaseException], ...] = (
            redis.ConnectionError,
            redis.TimeoutError,
            redis.exceptions.InvalidResponse,
            redis.exceptions.ReadOnlyError,
            redis.exceptions.OutOfMemoryError,
            redis.exceptions.ClusterDownError,
            OSError,
            TimeoutError,
        )
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


class RedisCaller:
    """Runs commands of async code on ``connection``'s server: on asyncio with redis-py's
    asyncio client (no thread hop: a worker thread's hand-off costs more CPU than the command;
    benchmarks/gateway_limits.py), elsewhere (trio) with the synchronous client in a worker
    thread. ``scripts`` (name -> Lua) are registered on both.

    An operation is a function of ``(client, scripts)`` calling redis-py's methods: on the
    asyncio client they return awaitables, and :meth:`run` awaits them.
    """

    def __init__(self, connection: RedisConnection, scripts: Mapping[str, str]) -> None:
        self.connection = connection
        self._sources = dict(scripts)
        self._scripts = {name: connection.client.register_script(s) for name, s in scripts.items()}
        self._async: tuple[object, Any, dict[str, Any]] | None = None  # (loop, client, scripts)
        self._url = connection.raw_url
        self._timeout = connection.timeout

    def _on_asyncio(self) -> tuple[Any, dict[str, Any]]:
        import asyncio

        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:  # a client belongs to one loop
            client = redis.asyncio.Redis.from_url(
                self._url,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 1),
            )
            scripts = {name: client.register_script(s) for name, s in self._sources.items()}
            self._async = (loop, client, scripts)
        return self._async[1], self._async[2]

    async def run(self, operation: Callable[[Any, Mapping[str, Any]], Any]) -> Any:
        """``operation``'s result; ``connection.errors`` when the server cannot be reached."""
        import sniffio

        if sniffio.current_async_library() == "asyncio":
            client, scripts = self._on_asyncio()
            return await operation(client, scripts)
        import anyio.to_thread

        return await anyio.to_thread.run_sync(operation, self.connection.client, self._scripts)

    async def aclose(self) -> None:
        held, self._async = self._async, None
        if held is not None:
            try:
                await held[1].aclose()
            except Exception:  # another loop's client, or a server gone: nothing to keep
                pass
        self.connection.close()
