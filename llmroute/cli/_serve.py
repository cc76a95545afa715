"""``llmroute serve``: an OpenAI-compatible gateway with the routing and cache behind it."""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from typing import TYPE_CHECKING, Any

from ._parser import examples, port

if TYPE_CHECKING:
    from ..server import GatewayApp

__all__ = ["register"]

_UPSTREAM_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2")
"""The HTTP clients' loggers, whose INFO lines repeat each request the gateway logs itself."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "serve",
        help="an OpenAI-compatible gateway with the routing and cache behind it",
        epilog=examples(
            "llmroute serve --simulator",
            "llmroute serve --config llmroute.toml --port 8000",
            "llmroute serve --config llmroute.toml --certfile cert.pem --keyfile key.pem",
        ),
        description=(
            "Serve OpenAI's API (/v1/chat/completions, /v1/completions, /v1/embeddings, "
            "/v1/models) plus /health and /metrics, with the config's routes and cache behind "
            "it. Clients authenticate with a gateway key ([gateway] keys, default "
            "$LLMROUTE_GATEWAY_KEY). See docs/gateway.md."
        ),
    )
    parser.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    parser.add_argument(
        "--simulator",
        action="store_true",
        help="serve the demo's three simulated providers behind the route 'chat', with a "
        "gateway key generated for this run (printed); no config, no API key",
    )
    parser.add_argument(
        "--host", help="the address to listen on (default: [gateway] host, else 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=port, help="the port (default: [gateway] port, else 8000; 0: any free one)"
    )
    parser.add_argument("--certfile", help="a PEM certificate: HTTPS, HTTP/2 by ALPN")
    parser.add_argument("--keyfile", help="the certificate's PEM private key")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument(
        "--drain",
        type=_seconds,
        metavar="DURATION",
        help="on SIGTERM/SIGINT, how long requests in flight may take to finish before they "
        "are ended (e.g. 20s; default: [gateway] drain_timeout, else 10s; 0: end them at once); "
        "a second signal ends them at once",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes serving one listening socket (default 1); with more than one, share "
        'per-key limits, stats and cache through Redis (limits_backend = "redis", ...)',
    )
    parser.add_argument(
        "--loop",
        default="asyncio",
        choices=["asyncio", "uvloop"],
        help="the event loop (default asyncio); uvloop needs pip install uvloop (see "
        "docs/benchmarks.md for what it changes)",
    )
    parser.set_defaults(run=_run)


def _seconds(text: str) -> float:
    from ..config import parse_duration

    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 20s or 0, got {text[:40]!r}"
        ) from None


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import importlib.util

    if importlib.util.find_spec("hypercorn") is None:
        from .._install import install_hint

        sys.stderr.write(f"llmroute serve: hypercorn is missing; {install_hint('server')}\n")
        return 2
    if (args.certfile is None) != (args.keyfile is None):
        sys.stderr.write("llmroute serve: --certfile and --keyfile go together\n")
        return 2
    from ..server import loop_factory

    try:
        args.loop_factory = loop_factory(args.loop)
    except ImportError as exc:
        sys.stderr.write(f"llmroute serve: {exc}\n")
        return 2
    if args.simulator:
        mistake = (
            "--config"
            if args.config
            else "--workers"
            if args.workers > 1
            else "--certfile"
            if args.certfile
            else None
        )
        if mistake is not None:
            hint = (
                ' (in a config, a provider with kind = "simulator" is a simulated one that '
                "starts with the gateway: docs/simulator.md)"
                if mistake == "--config"
                else ""
            )
            sys.stderr.write(
                f"llmroute serve: --simulator and {mistake} do not go together{hint}\n"
            )
            return 2
        from .._install import install_hint

        if importlib.util.find_spec("trustme") is None:
            sys.stderr.write(f"llmroute serve: trustme is missing; {install_hint('testing')}\n")
            return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # hpack logs every header it encodes or decodes at DEBUG, upstream keys included.
    hpack = logging.getLogger("hpack")
    level = hpack.level
    hpack.setLevel(max(logging.INFO, logging.getLogger().level))
    # httpx and httpcore log each upstream request at INFO: one request would be logged twice
    # (theirs and the gateway's own access line). Their lines stay at --log-level debug.
    quieted = {name: logging.getLogger(name) for name in _UPSTREAM_LOGGERS}
    levels = {name: logger.level for name, logger in quieted.items()}
    if logging.getLogger().level > logging.DEBUG:
        for logger in quieted.values():
            logger.setLevel(logging.WARNING)
    try:
        if args.workers > 1:
            return _serve_workers(args)
        if args.simulator:
            from ._demo import demo_simulators

            with demo_simulators() as sims, asyncio.Runner(loop_factory=args.loop_factory) as r:
                return r.run(_serve(args, simulated=sims))
        with asyncio.Runner(loop_factory=args.loop_factory) as runner:
            return runner.run(_serve(args))
    finally:
        hpack.setLevel(level)  # main() may run inside another program (or a test)
        for name, logger in quieted.items():
            logger.setLevel(levels[name])


def _serve_workers(args: argparse.Namespace) -> int:
    """``--workers N``: the listening socket is made here, then N forked processes each serve
    it with their own event loop and gateway; SIGTERM/SIGINT here stop them all."""
    import asyncio
    import os
    import signal

    from ..config import ConfigError, GatewaySettings, load_config
    from ..server import listen

    if not hasattr(os, "fork"):
        sys.stderr.write("llmroute serve: --workers needs fork (Linux, macOS)\n")
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"llmroute serve: {exc}\n")
        return 2
    settings = (config.gateway if config is not None else None) or GatewaySettings()
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    if settings.limits_backend != "redis":
        logging.getLogger("llmroute.server").warning(
            "%d workers count max_concurrency_per_key each on their own (a key may have %d x "
            'the limit in flight); set limits_backend = "redis" to share it',
            args.workers,
            args.workers,
        )
    try:
        sock = listen(host, port)
    except OSError as exc:
        sys.stderr.write(f"llmroute serve: {_cannot_listen(host, port, exc)}\n")
        return 1
    children: list[int] = []
    for index in range(args.workers):
        pid = os.fork()
        if pid == 0:  # a worker: serve until SIGTERM
            code = 1
            try:
                with asyncio.Runner(loop_factory=args.loop_factory) as runner:
                    code = runner.run(_serve(args, sock, quiet=index > 0))
            finally:
                os._exit(code)
        children.append(pid)
    sock.close()

    def forward(signum: int, frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signal.SIGTERM if signum == signal.SIGINT else signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, forward)  # each worker reads its keys again
    worst = 0
    for child in children:
        _, status = os.waitpid(child, 0)
        worst = max(worst, os.waitstatus_to_exitcode(status))
    return worst


async def _serve(
    args: argparse.Namespace,
    sock: socket.socket | None = None,
    *,
    quiet: bool = False,
    simulated: dict[str, Any] | None = None,
) -> int:
    import asyncio
    import signal
    import ssl

    from ..config import ConfigError, GatewaySettings
    from ..server import base_url, listen, serve

    try:
        app, key = _gateway_app(args, simulated)
    except ConfigError as exc:
        sys.stderr.write(f"llmroute serve: {exc}\n")
        return 2
    settings = app.config.gateway or GatewaySettings()
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    certfile, keyfile = args.certfile, args.keyfile
    if certfile is None:
        certfile, keyfile = settings.certfile, settings.keyfile
    if certfile is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            await app.aclose()
            sys.stderr.write(f"llmroute serve: cannot use {certfile} and {keyfile}: {exc}\n")
            return 2
    if sock is None:
        try:
            sock = listen(host, port)
        except OSError as exc:
            await app.aclose()
            sys.stderr.write(f"llmroute serve: {_cannot_listen(host, port, exc)}\n")
            return 1
    loop = asyncio.get_running_loop()
    shutdown, cut = asyncio.Event(), asyncio.Event()

    def stop() -> None:  # the first signal drains, a second ends what is left
        (cut if shutdown.is_set() else shutdown).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGHUP, app.reload)  # the keys, read again
    url = base_url(sock, tls=certfile is not None)
    if not quiet:
        sys.stdout.write(_banner(app, url, certfile is not None, args.workers))
        if key is not None:
            sys.stdout.write(_try_it(url, key, simulated or {}))
        sys.stdout.flush()
    drain = settings.drain_timeout if args.drain is None else args.drain
    await serve(
        app,
        sock,
        certfile=certfile,
        keyfile=keyfile,
        shutdown_trigger=shutdown.wait,
        drain=drain,
        cut_trigger=cut.wait,
    )
    if not quiet:
        sys.stdout.write("llmroute gateway stopped\n")
        sys.stdout.flush()
    return 0


def _gateway_app(
    args: argparse.Namespace, simulated: dict[str, Any] | None
) -> tuple[GatewayApp, str | None]:
    """The gateway of ``args.config`` (built in the loop that serves it), or with ``simulated``
    the demo's route over its simulators and the key made for this run (ConfigError)."""
    from ..server import GatewayApp

    if simulated is None:
        return GatewayApp(args.config), None
    import os
    import secrets

    from ._demo import simulated_setup

    setup = simulated_setup(simulated)
    key = "gw-" + secrets.token_urlsafe(24)
    environ = {**os.environ, "LLMROUTE_GATEWAY_KEY": key}
    return GatewayApp(setup.config, environ=environ, verify=setup.verify), key


def _banner(app: GatewayApp, url: str, tls: bool, workers: int) -> str:
    """The line saying where the gateway listens, how, and what it serves to whom."""
    protocols = "HTTP/2 and HTTP/1.1 over TLS" if tls else "HTTP/1.1 and h2c"
    more = f"; {workers} workers" if workers > 1 else ""
    return (
        f"llmroute gateway listening on {url} ({protocols}); "
        f"routes: {', '.join(app.routes) or 'none'}; keys: {', '.join(app.keys.names)}"
        f"{more}\n"
    )


def _try_it(url: str, key: str, simulated: dict[str, Any]) -> str:
    """``serve --simulator``'s lines after the banner: what the gateway serves, the base URL and
    key to use (a key made for this run, valid while it runs), and a request to try."""
    import shlex

    from ._demo import ROUTE

    body = f'{{"model": "{ROUTE}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    python = (
        "from openai import OpenAI; "
        f"c = OpenAI(base_url='{url}', api_key='{key}'); "
        f"r = c.chat.completions.with_raw_response.create(model='{ROUTE}', "
        "messages=[{'role': 'user', 'content': 'Hello!'}]); "
        "print(r.parse().choices[0].message.content, '->', r.headers['x-llmroute-target'])"
    )
    return (
        f"route {ROUTE!r}: hedge over {', '.join(simulated)} "
        "(simulated providers on 127.0.0.1, TLS + HTTP/2)\n"
        f"base URL: {url}\n"
        f"key:      {key}  (made for this run)\n"
        f"try:      curl -s {url}/chat/completions -H 'Authorization: Bearer {key}' "
        f"-H 'Content-Type: application/json' -d '{body}'\n"
        f'or:       {shlex.quote(sys.executable)} -c "{python}"\n'
        "Ctrl-C stops it.\n"
    )


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    """Why the gateway cannot listen, and for a port in use what to pass instead."""
    text = f"cannot listen on {host}:{port}: {exc.strerror}"
    if exc.errno == errno.EADDRINUSE:
        text += " (another process has it: pass another --port, or --port 0 for any free one)"
    return text
