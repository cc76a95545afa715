"""``llmroute top``: the routing at a glance in a terminal, from llmroute's Prometheus metrics.

It reads any page that exposes them: the gateway's ``/metrics`` (with a key) or an application
serving ``client.metrics``; ``--simulator`` starts the demo's simulated providers and a traffic
loop in this process and reads its client's metrics directly. Each frame compares two scrapes:
percentiles come from the histogram buckets' growth over the interval (Prometheus's
``histogram_quantile`` estimate, so a Grafana panel shows the same), counts are counter deltas;
the first frame covers everything since the process started.

Reading, the figures and the drawing are pure functions of exposition text, in ``_topframe.py``
(tested with recorded text); this module scrapes, loops and draws. Plain ANSI codes (the
alternate screen, redrawn in place), no dependency beyond llmroute's own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from ._format import MissingExtra, add_tls_options, http_url, require, tls_verify
from ._parser import examples
from ._topframe import SORTS, Exposition, Frame, NotMetrics, build_frame, render

if TYPE_CHECKING:
    from .. import AsyncOpenAI

__all__ = ["KEY_ENV", "TopError", "metrics_url", "register"]

KEY_ENV = "LLMROUTE_GATEWAY_KEY"
"""The variable a gateway key is read from when ``--key`` is not given."""

ONCE_REQUESTS = 20
"""``--simulator --once``: requests that end before the table is printed."""
SLOW_PHASE = (20.0, 10.0)
"""``--simulator``: every 20 s the fast target is slow for 10 s, so traffic visibly moves."""


class TopError(Exception):
    """A scrape that failed, as a sentence; ``status`` is the command's exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# -- where the text comes from -------------------------------------------------------------------


def metrics_url(url: str) -> str:
    """``url`` with a scheme and a path: a bare host:port or a gateway's base URL (``.../v1``)
    means its ``/metrics``; :class:`TopError` (status 2) when it is not an http(s) URL."""
    try:
        parsed = http_url(url, "http://127.0.0.1:8000/metrics")
    except ValueError as exc:
        raise TopError(str(exc), 2) from None
    path = parsed.path.rstrip("/")
    if path in ("", "/v1"):
        parsed = parsed.copy_with(path="/metrics")
    return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))


class _Scraper:
    """GETs a metrics page; every failure is a :class:`TopError` sentence (never the key)."""

    def __init__(self, url: str, key: str | None, verify: bool | str, timeout: float) -> None:
        import httpx

        self.url = url
        self._key_given = key is not None
        headers = {"authorization": f"Bearer {key}"} if key else {}
        context: ssl.SSLContext | bool = verify if isinstance(verify, bool) else _ca(verify)
        self._client = httpx.AsyncClient(headers=headers, verify=context, timeout=timeout)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __call__(self) -> Exposition:
        import httpx

        url = self.url
        try:
            response = await self._client.get(url)
        except httpx.ConnectError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise TopError(
                    f"{url}: its TLS certificate is not trusted; --ca FILE trusts a private CA "
                    "(--insecure trusts any, for a test server only)",
                    2,
                ) from None
            raise TopError(
                f"cannot reach {url}: {_reason(exc)} (is the gateway or application running, "
                "and is this its address?)"
            ) from None
        except httpx.TimeoutException:
            raise TopError(f"{url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise TopError(f"cannot read {url}: {_reason(exc)}") from None
        status = response.status_code
        if status in (401, 403):
            raise TopError(_refusal(url, status, self._key_given), 2)
        if status == 404:
            raise TopError(
                f"{url}: no page there (404); the gateway serves /metrics, an application the "
                "path it serves client.metrics on",
                2,
            )
        if status >= 400:
            raise TopError(f"{url} answered {status} {response.reason_phrase}".rstrip())
        try:
            return Exposition.parse(response.text)
        except NotMetrics as exc:
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            raise TopError(f"{url} is not a metrics page: {exc}; it answered {kind}", 2) from None


def _refusal(url: str, status: int, key_given: bool) -> str:
    """Why the page refused, in the live page's words: no key, a key the gateway does not hold
    (401), or a team's key where an admin key is needed (403)."""
    if status == 403:
        return (
            f"{url} refused the key given (403): that key is not an admin key; give an admin "
            f"key (admin = true) with --key or ${KEY_ENV}"
        )
    if key_given:
        return (
            f"{url} refused the key given (401): that is not a key of this gateway; give one "
            f"of its keys with --key or ${KEY_ENV}"
        )
    return (
        f"{url} needs a key (401); give one of the gateway's keys (its admin key, if it has "
        f"one) with --key or ${KEY_ENV}"
    )


def _ca(path: str) -> ssl.SSLContext:
    if os.path.isdir(path):
        return ssl.create_default_context(capath=path)
    return ssl.create_default_context(cafile=path)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# -- the command --------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "top",
        help="the routing at a glance: per-target TTFT, share, hedges, errors, breakers, live",
        epilog=examples(
            "llmroute top http://127.0.0.1:8000",
            "llmroute top --once --json https://gw.internal:8443/v1 --ca ca.pem",
            "llmroute top --simulator",
        ),
        description=(
            "Show what the routing does from llmroute's Prometheus metrics: the gateway's "
            "/metrics, or an application's page of client.metrics. Refreshes in place; --once "
            "prints one table. --simulator runs the demo's simulated providers and traffic in "
            "this process and shows them."
        ),
    )
    parser.add_argument(
        "url",
        nargs="?",
        help=(
            "the metrics page, e.g. http://127.0.0.1:8000/metrics (a bare host:port or a "
            "gateway's .../v1 means its /metrics)"
        ),
    )
    parser.add_argument(
        "--key",
        help=f"a gateway key for /metrics (default: ${KEY_ENV}; prefer the variable: a flag "
        "shows in the process list)",
    )
    parser.add_argument(
        "--simulator",
        action="store_true",
        help="start the demo's three simulated providers and a traffic loop here, and watch them",
    )
    parser.add_argument(
        "--once", action="store_true", help="print one table and exit (no ANSI codes in a pipe)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one frame's figures as one JSON document and exit (as --once does)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="S",
        help=(
            "seconds between refreshes (2); with --once, take two scrapes this far apart and "
            "show the figures between them"
        ),
    )
    parser.add_argument(
        "--sort", choices=SORTS, default="share", help="order of the targets (share: most answers)"
    )
    parser.add_argument(
        "--rows",
        type=int,
        metavar="N",
        help="at most this many targets (default: what fits the terminal)",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="seconds one scrape may take (10)"
    )
    add_tls_options(parser)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    err = sys.stderr
    interval = 2.0 if args.interval is None else args.interval
    if not (interval > 0 and math.isfinite(interval)) or not args.timeout > 0:
        err.write("llmroute top: --interval and --timeout must be numbers of seconds above 0\n")
        return 2
    if args.rows is not None and args.rows < 1:
        err.write("llmroute top: --rows must be at least 1\n")
        return 2
    if args.simulator == bool(args.url):
        err.write(
            "llmroute top: give the URL of a metrics page (e.g. http://127.0.0.1:8000/metrics) "
            "or --simulator, one of the two\n"
        )
        return 2
    try:
        verify = tls_verify(args, "llmroute top")
        if args.simulator:
            require("hypercorn", "cli")
            require("trustme", "cli")
            url = ""
        else:
            url = metrics_url(args.url)
    except MissingExtra as exc:
        err.write(f"llmroute top: {exc}\n")
        return 2
    except (ValueError, TopError) as exc:
        err.write(f"{exc}\n" if isinstance(exc, ValueError) else f"llmroute top: {exc}\n")
        return 2 if isinstance(exc, ValueError) else exc.status
    once = args.once or args.json
    view = _Screen(
        out=sys.stdout,
        interval=interval,
        once=once,
        as_json=args.json,
        two_scrapes=once and args.interval is not None,
        sort=args.sort,
        rows=args.rows,
    )
    try:
        if args.simulator:
            return anyio.run(_simulated, view)
        key = args.key or os.environ.get(KEY_ENV) or None
        return anyio.run(_remote, view, url, key, verify, args.timeout)
    except KeyboardInterrupt:
        view.leave()
        return 0 if not once else 130


async def _remote(
    view: _Screen, url: str, key: str | None, verify: bool | str, timeout: float
) -> int:
    scraper = _Scraper(url, key, verify, timeout)
    try:
        return await view.watch(scraper, url)
    finally:
        with anyio.CancelScope(shield=True):
            await scraper.aclose()


@dataclass
class _Screen:
    """The loop: scrape, build a frame against the scrape before, draw; bounded by ``frames``
    when given (tests), else by the user (Ctrl-C)."""

    out: TextIO
    interval: float
    once: bool
    as_json: bool = False
    two_scrapes: bool = False
    sort: str = "share"
    rows: int | None = None
    frames: int | None = None
    note: Callable[[], str | None] = lambda: None
    _live: bool = False
    _keys: int | None = None
    """The terminal ``q`` is read from while the view is live (None: not a terminal)."""
    _saved: list[Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.out.isatty()

    def enter(self) -> None:
        if self.terminal and not self.once and not self._live:
            self._live = True
            self.out.write("\x1b[?1049h\x1b[?25l")  # the alternate screen, no cursor
            self._keys = _keyboard()
            if self._keys is not None:  # keys one by one, not echoed, nothing typed dropped
                import termios
                import tty

                self._saved = termios.tcgetattr(self._keys)
                tty.setcbreak(self._keys, termios.TCSANOW)

    def leave(self) -> None:
        if self._live:
            self._live = False
            if self._keys is not None and self._saved is not None:
                import termios

                termios.tcsetattr(self._keys, termios.TCSADRAIN, self._saved)
                self._saved = None
            self.out.write("\x1b[?25h\x1b[?1049l")
            self.out.flush()

    async def watch(self, scrape: Callable[[], Awaitable[Exposition]], source: str) -> int:
        err = sys.stderr
        try:
            first = await scrape()
        except TopError as exc:
            err.write(f"llmroute top: {exc}\n")
            return exc.status
        before: Exposition | None = None
        now, taken = first, time.monotonic()
        if self.once and self.two_scrapes:
            await anyio.sleep(self.interval)
            try:
                before, now = first, await scrape()
            except TopError as exc:
                err.write(f"llmroute top: {exc}\n")
                return exc.status
            seconds: float | None = time.monotonic() - taken
        else:
            seconds = None
        self.enter()
        try:
            async with anyio.create_task_group() as tg:
                if self._keys is not None:
                    tg.start_soon(_quit_on_q, self._keys, tg.cancel_scope)
                await self._loop(scrape, source, now, before, seconds, taken)
                tg.cancel_scope.cancel()
            return 0
        finally:
            self.leave()

    async def _loop(
        self,
        scrape: Callable[[], Awaitable[Exposition]],
        source: str,
        now: Exposition,
        before: Exposition | None,
        seconds: float | None,
        taken: float,
    ) -> None:
        failure: str | None = None
        drawn = 0
        while True:
            frame = build_frame(now, before, seconds)
            self._draw(frame, source, failure)
            drawn += 1
            if self.once or (self.frames is not None and drawn >= self.frames):
                return
            await anyio.sleep(self.interval)
            try:
                fresh = await scrape()
            except TopError as exc:
                failure = f"the last scrape failed: {exc}; trying again every {self.interval:g} s"
                continue
            failure = None
            stamp = time.monotonic()
            before, now, seconds, taken = now, fresh, stamp - taken, stamp

    def _draw(self, frame: Frame, source: str, failure: str | None) -> None:
        if self.as_json:
            document = {"source": source, "time": time.time(), **dataclasses.asdict(frame)}
            self.out.write(json.dumps(document) + "\n")
            self.out.flush()
            return
        terminal = self.terminal
        size = shutil.get_terminal_size() if terminal else None
        color = terminal and not os.environ.get("NO_COLOR")
        note = failure or self.note()
        # One line short of the screen: a newline after its last line would scroll it.
        height = size.lines - 1 if size is not None and not self.once else None
        lines = render(
            frame,
            source=source,
            interval=None if self.once else self.interval,
            width=size.columns if size is not None else None,
            height=height,
            sort=self.sort,
            rows=self.rows,
            color=color,
            note=note,
        )
        if self._live:
            self.out.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in lines) + "\x1b[J")
        else:
            self.out.write("\n".join(lines) + "\n")
            if not self.once:
                self.out.write("\n")
        self.out.flush()


async def _quit_on_q(fd: int, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when ``q`` is typed on the terminal ``fd`` (put in cbreak mode by
    :meth:`_Screen.enter`: keys arrive one by one, Ctrl-C is still SIGINT)."""
    while True:
        await anyio.wait_readable(fd)
        typed = os.read(fd, 64)
        if not typed or b"q" in typed.lower():
            scope.cancel()
            return


def _keyboard() -> int | None:
    """stdin's descriptor when it is a terminal (the live view reads ``q`` from it)."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's captured stdin has no descriptor
        return None
    return fd if os.isatty(fd) else None


# -- --simulator -------------------------------------------------------------------------------


async def _simulated(view: _Screen) -> int:
    from .. import AsyncOpenAI
    from ..testing import Simulator
    from ._demo import ROUTE, _demo_profiles, simulated_setup

    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(Simulator(profile=profile, tls=True))
            for name, profile in _demo_profiles().items()
        }
        setup = simulated_setup(sims)
        slowed = _Weather(sims["fast-but-spiky"])
        view.note = slowed.note
        client = AsyncOpenAI(config=setup.config, verify=setup.verify)
        status = 1
        async with client, anyio.create_task_group() as tg:
            traffic = _Traffic(client)
            tg.start_soon(traffic.run)
            tg.start_soon(slowed.run)
            if view.once:  # something to show: an interval of traffic, 20 requests at least
                if not view.two_scrapes:
                    await anyio.sleep(view.interval)
                await traffic.wait_for(ONCE_REQUESTS, 60.0)

            async def scrape() -> Exposition:
                return Exposition.parse(client.metrics.exposition().decode())

            source = f"{len(sims)} simulated providers in this process (route {ROUTE!r}, hedge)"
            status = await view.watch(scrape, source)
            tg.cancel_scope.cancel()
        return status


@dataclass
class _Weather:
    """Makes the demo's fast target slow for ``SLOW_PHASE[1]`` s every ``SLOW_PHASE[0]`` s."""

    sim: Any
    slow: bool = False

    def note(self) -> str | None:
        period, length = SLOW_PHASE
        if self.slow:
            return f"now: fast-but-spiky is slowed to a 600 ms first token for {length:g} s"
        return f"fast-but-spiky slows down for {length:g} s every {period:g} s: watch traffic move"

    async def run(self) -> None:
        period, length = SLOW_PHASE
        app = self.sim.app
        normal = app.profile
        slow = dataclasses.replace(normal, ttft_median=0.6, stall_prob=0.0)
        try:
            while True:
                await anyio.sleep(period - length)
                app.profile, self.slow = slow, True
                await anyio.sleep(length)
                app.profile, self.slow = normal, False
        finally:
            app.profile, self.slow = normal, False


@dataclass
class _Traffic:
    """The demo's workload in a loop, ``concurrency`` at a time, until cancelled; ``done``
    counts the answers (and errors) so far."""

    client: AsyncOpenAI
    concurrency: int = 4
    done: int = 0

    async def run(self) -> None:
        from ._demo import ROUTE, ask_once, workload

        asks = workload(200, 0.3, 7)

        async def worker(offset: int) -> None:
            index = offset
            while True:
                await ask_once(self.client, ROUTE, asks[index % len(asks)], 16)
                self.done += 1
                index += self.concurrency

        async with anyio.create_task_group() as tg:
            for offset in range(self.concurrency):
                tg.start_soon(worker, offset)

    async def wait_for(self, count: int, seconds: float) -> None:
        """Until ``count`` requests ended (a slow machine's first ones take a while), for at
        most ``seconds``."""
        with anyio.move_on_after(seconds):
            while self.done < count:  # noqa: ASYNC110 - a counter, no event to wait on
                await anyio.sleep(0.05)
