"""Serving the gateway with hypercorn: in the foreground (the CLI) or from a thread."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..config import Config, GatewaySettings
from ._app import GatewayApp

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig

__all__ = ["LOOPS", "Gateway", "listen", "loop_factory", "serve"]

LOOPS = ("asyncio", "uvloop")
"""The event loops the gateway serves on (``llmroute serve --loop``, ``Gateway(loop=...)``)."""

_LOG = logging.getLogger("llmroute.server")
_GRACE = 5.0  # seconds hypercorn waits for connections to finish after shutdown begins


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the event loop ``name`` (one of :data:`LOOPS`): asyncio's own, or uvloop's
    (``pip install uvloop``: sockets, TLS and scheduling in C; see docs/benchmarks.md for what
    it changed here). ``ValueError`` naming an unknown loop, ``ImportError`` saying what to
    install."""
    if name == "asyncio":
        return asyncio.new_event_loop
    if name != "uvloop":
        raise ValueError(f"loop: expected one of {', '.join(LOOPS)}, got {name[:40]!r}")
    try:
        import uvloop  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise ImportError("the uvloop event loop needs uvloop: pip install uvloop") from None
    return uvloop.new_event_loop


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: any free one), ready to hand to :func:`serve`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=1024)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def base_url(sock: socket.socket, *, tls: bool) -> str:
    """The ``.../v1`` URL a client of the gateway listening on ``sock`` uses."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/v1"


def _hypercorn_config(
    settings: GatewaySettings, sock: socket.socket, certfile: str | None, keyfile: str | None
) -> HypercornConfig:
    """hypercorn's settings for the gateway on ``sock`` (which it takes over), with
    llmroute's HTTP/2 fixes installed."""
    from hypercorn.config import Config as HypercornConfig

    from ._h2 import CONFIG_FLAG, LIMITS_ATTRIBUTE, H2Limits, install

    # hypercorn 0.18's HTTP/2 buffers a response to a client that does not read without bound;
    # this server's streams get bounded buffers (docs/gateway.md, "HTTP/2 back-pressure").
    # Its early answers (401, 413, 429 before the body is read) no longer drop the connection,
    # and one connection's resets and control frames are bounded (docs/gateway.md, "HTTP/2").
    install()
    config = HypercornConfig()
    setattr(config, CONFIG_FLAG, True)
    setattr(
        config,
        LIMITS_ATTRIBUTE,
        H2Limits(resets=settings.h2_max_resets, frames=settings.h2_max_control_frames),
    )
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = _LOG
    config.backlog = 1024
    config.graceful_timeout = _GRACE
    config.keep_alive_timeout = settings.idle_timeout
    config.ssl_handshake_timeout = settings.handshake_timeout
    # Streams are bounded by h2_max_concurrent_streams and the reset budget, not by a count of
    # requests (hypercorn cannot finish a connection's streams in flight when it reaches one).
    config.keep_alive_max_requests = 10_000_000
    config.h2_max_concurrent_streams = settings.h2_max_concurrent_streams
    if certfile is not None and keyfile is not None:
        config.certfile, config.keyfile = certfile, keyfile
        config.alpn_protocols = ["h2", "http/1.1"]
    return config


async def serve(
    app: GatewayApp,
    sock: socket.socket,
    *,
    certfile: str | None = None,
    keyfile: str | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]],
    drain: float = 0.0,
    cut_trigger: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Serve ``app`` with hypercorn on ``sock`` (which it takes over) until ``shutdown_trigger``
    returns: HTTPS with HTTP/2 and HTTP/1.1 by ALPN when ``certfile`` and ``keyfile`` are given,
    else HTTP/1.1 and h2c. When the trigger fires, new requests are refused (503) and those in
    flight get up to ``drain`` seconds to finish (less if ``cut_trigger`` returns first); the
    rest are ended with an error event."""
    from hypercorn.asyncio import serve as hypercorn_serve

    config = _hypercorn_config(app.settings, sock, certfile, keyfile)

    async def trigger() -> None:
        await shutdown_trigger()
        if drain > 0 and app.in_flight:
            _LOG.info(
                "draining %d requests in flight (up to %gs; a second signal ends them now)",
                app.in_flight,
                drain,
            )
        left = await app.drain(drain, cut_trigger)
        if left:
            _LOG.warning("ending %d requests still in flight", left)
        app.begin_shutdown()

    await hypercorn_serve(app, config, shutdown_trigger=trigger)  # type: ignore[arg-type]


class Gateway:
    """The gateway served from a background thread on 127.0.0.1, for tests and benchmarks::

        with Gateway(config, verify=ctx) as gateway:
            client = openai.OpenAI(base_url=gateway.base_url, api_key=key)

    ``config`` and ``client_options`` are :class:`GatewayApp`'s; ``port`` 0 picks a free port;
    ``loop`` is the event loop of its thread (:data:`LOOPS`).
    ``base_url`` (ending in ``/v1``) is ready on entry; leaving ends the streams in flight and
    closes the client.
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        certfile: str | None = None,
        keyfile: str | None = None,
        environ: Mapping[str, str] = os.environ,
        loop: str = "asyncio",
        **client_options: Any,
    ) -> None:
        self._loop_factory = loop_factory(loop)
        self.app = GatewayApp(config, environ=environ, **client_options)
        self.host, self.port = host, port
        self.certfile, self.keyfile = certfile, keyfile
        self.base_url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._drain = 0.0
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    def start(self) -> Gateway:
        """Listen and serve; returns once the gateway answers (``RuntimeError`` if it cannot)."""
        if self._thread is not None:
            raise RuntimeError("gateway already started")
        if self.tls:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                self.certfile or "", self.keyfile
            )
        sock = listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.base_url = base_url(sock, tls=self.tls)
        self._thread = threading.Thread(
            target=self._run, args=(sock,), name=f"llmroute-gateway-{self.port}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            self.stop()
            raise RuntimeError("the gateway failed to start") from self._error
        return self

    def _run(self, sock: socket.socket) -> None:
        try:
            with asyncio.Runner(loop_factory=self._loop_factory) as runner:
                runner.run(self._main(sock))
        except BaseException as exc:
            self._error = exc
            _LOG.error("the gateway stopped on an error: %s", type(exc).__name__)
        finally:
            sock.close()
            self._ready.set()

    async def _main(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown = asyncio.Event()
        self._loop.call_soon(self._ready.set)
        await serve(
            self.app,
            sock,
            certfile=self.certfile,
            keyfile=self.keyfile,
            shutdown_trigger=self._stopped,
        )

    async def _stopped(self) -> None:
        assert self._shutdown is not None
        await self._shutdown.wait()
        await self.app.drain(self._drain)

    def stop(self, drain: float = 0.0) -> None:
        """Stop serving and close the client (bounded in time): the streams in flight get up to
        ``drain`` seconds to finish, the rest are ended."""
        self._drain = drain
        thread, loop, shutdown = self._thread, self._loop, self._shutdown
        if thread is None:
            return
        if loop is not None and shutdown is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(shutdown.set)
            except RuntimeError:
                pass  # the loop just closed
        thread.join(drain + _GRACE + 10)
        self._thread = None

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
