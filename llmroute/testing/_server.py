"""Serving the simulator with hypercorn: TLS, HTTP/2 stream resets, a thread or a subprocess."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import functools
import json
import logging
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h2.errors
import h2.exceptions
import hypercorn.protocol
import trustme
from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.protocol.events import Body, EndBody, EndData, StreamClosed, Trailers
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h2 import H2Protocol
from priority.priority import PriorityTree

from ._app import SimApp
from ._profile import Profile, check_fields

try:
    from ..server._h2 import BoundedH2Protocol as _BaseH2Protocol
except ImportError:  # the SGLang stand-in loads this module without the llmroute package
    _BaseH2Protocol = H2Protocol  # (without the back-pressure fix)

_LOG = logging.getLogger("llmroute.testing.server")
_HOST_NAMES = ("127.0.0.1", "localhost")
_ABORT_AFTER = 0.5  # seconds from shutdown until connections still open are aborted


# -- certificates (one CA per run) ------------------------------------------------------------
CA_ENV = "LLMROUTE_SIMULATOR_CA"
"""A folder holding ``ca.pem`` and ``ca.key``: the CA a simulator process signs with. A
:class:`SimulatorProcess` passes its parent's, so every simulator of a run, in the process or
in its children, has one CA, and one ``verify`` trusts them all."""


@functools.cache
def _certs() -> tuple[trustme.CA, trustme.LeafCert, str]:
    shared = os.environ.get(CA_ENV)
    if shared:  # the parent's CA (a SimulatorProcess's child): the parent removes the folder
        path = os.path.join(shared, "ca.pem")
        with open(path, "rb") as cert, open(os.path.join(shared, "ca.key"), "rb") as key:
            ca = trustme.CA.from_pem(cert_bytes=cert.read(), private_key_bytes=key.read())
    else:
        ca = trustme.CA()
        folder = tempfile.mkdtemp(prefix="llmroute-sim-")  # mode 0700
        atexit.register(shutil.rmtree, folder, True)
        path = os.path.join(folder, "ca.pem")
        ca.cert_pem.write_to_path(path)
        key = os.path.join(folder, "ca.key")
        os.close(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        ca.private_key_pem.write_to_path(key)
    return ca, ca.issue_cert(*_HOST_NAMES), path


def ca_pem_path() -> str:
    """Path of a PEM file with the CA certificate of every simulator of this run (this
    process's, and its :class:`SimulatorProcess` children's)."""
    return _certs()[2]


def client_ssl_context() -> ssl.SSLContext:
    """A client context that trusts this process's simulator CA (ALPN not set)."""
    ctx = ssl.create_default_context()
    _certs()[0].configure_trust(ctx)
    return ctx


@functools.cache
def _server_ssl_context(http2: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    _certs()[1].configure_cert(ctx)
    ctx.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return ctx


# -- HTTP/2: reset a stream the app left unfinished -------------------------------------------
class _ResettingH2Protocol(_BaseH2Protocol):  # type: ignore[misc,valid-type]
    """hypercorn's H2Protocol, but a stream whose app returned before the end of the body is
    reset (RST_STREAM INTERNAL_ERROR) instead of being left open. hypercorn 0.18 leaves it
    open, so a client would hang on a simulated dropped stream. Only servers whose config has
    `reset_unfinished_streams = True` (the simulator's) behave differently. Its base class
    bounds the send buffers of servers whose config sets `h2_bounded_stream_buffers` (the
    simulator's and the gateway's; see llmroute/server/_h2.py).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # hypercorn's priority tree refuses its 1,001st stream (priority's default limit) with an
        # exception that stalls the whole connection: size it to the streams the server allows.
        limit = int(getattr(self.config, "h2_max_concurrent_streams", 0) or 0)
        if limit > 500:
            self.priority = PriorityTree(maximum_streams=2 * limit)

    async def stream_send(self, event: StreamEvent) -> None:
        if getattr(self.config, "reset_unfinished_streams", False):
            ended: set[int] = self.__dict__.setdefault("_sim_ended", set())
            if isinstance(event, EndBody | EndData | Trailers):
                ended.add(event.stream_id)
            elif isinstance(event, StreamClosed):
                if event.stream_id not in ended and event.stream_id in self.streams:
                    await self._reset_unfinished(event.stream_id)
                ended.discard(event.stream_id)
        app = getattr(self.config, "sim_app", None)
        if app is not None and app.profile.frame_per_event and isinstance(event, Body):
            if await self._send_frame(event):
                return
        await super().stream_send(event)

    async def _send_frame(self, event: Body) -> bool:
        """Send a body event at once as one DATA frame (one TLS record); False when it must
        wait in the stream's buffer (earlier bytes queued, or no flow-control window)."""
        stream_id = event.stream_id
        buffer = self.stream_buffers.get(stream_id)
        if buffer is None or buffer.buffer or not event.data:
            return False
        try:
            window = min(
                self.connection.local_flow_control_window(stream_id),
                self.connection.max_outbound_frame_size,
            )
            if len(event.data) > window:
                return False
            self.connection.send_data(stream_id, event.data)
        except (h2.exceptions.ProtocolError, KeyError):
            return False
        await self._flush()
        return True

    async def _reset_unfinished(self, stream_id: int) -> None:
        buffer = self.stream_buffers.get(stream_id)
        if buffer is not None and buffer.buffer:
            try:  # let the bytes the app already sent reach the client first
                async with asyncio.timeout(2.0):
                    await buffer.drain()
            except TimeoutError:
                pass
        try:
            self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        except h2.exceptions.ProtocolError:
            return  # already closed
        await self._flush()
        if stream_id in self.stream_buffers:
            # Completing the buffer makes the send task hit the closed stream and drop it.
            self.stream_buffers[stream_id].set_complete()
            try:
                self.priority.unblock(stream_id)
            except Exception:  # priority.MissingStreamError
                pass
            await self.has_data.set()


def _install_h2_reset() -> None:
    # ProtocolWrapper looks the class up in hypercorn.protocol when a connection starts.
    if hypercorn.protocol.H2Protocol is not _ResettingH2Protocol:  # type: ignore[attr-defined]
        hypercorn.protocol.H2Protocol = _ResettingH2Protocol  # type: ignore[misc]


class _SimConfig(Config):
    reset_unfinished_streams = True
    h2_bounded_stream_buffers = True  # hypercorn 0.18's HTTP/2 back-pressure fixed (server/_h2)
    sim_app: SimApp | None = None  # whose profile's frame_per_event the protocol follows

    def __init__(self, ssl_context: ssl.SSLContext | None) -> None:
        super().__init__()
        self._sim_ssl = ssl_context

    @property
    def ssl_enabled(self) -> bool:
        return self._sim_ssl is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._sim_ssl


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), backlog=1024)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def _serve(
    app: SimApp,
    sock: socket.socket,
    *,
    tls: bool,
    http2: bool,
    shutdown: asyncio.Event,
    keep_alive_timeout: float = 75.0,
) -> None:
    """Serve `app` on the listening socket (hypercorn takes it over) until `shutdown`."""
    _install_h2_reset()
    config = _SimConfig(_server_ssl_context(http2) if tls else None)
    profile = getattr(app, "profile", None)  # the SGLang stand-in serves an app of its own
    config.sim_app = app if isinstance(profile, Profile) else None
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = _LOG
    config.backlog = 1024
    config.graceful_timeout = 2.0
    config.keep_alive_timeout = keep_alive_timeout
    # hypercorn ends a connection after this many requests, and its h2 cannot finish the
    # streams in flight then; long benchmarks must not see that as faults.
    config.keep_alive_max_requests = 10_000_000
    config.h2_max_concurrent_streams = (
        profile.max_streams if isinstance(profile, Profile) else Profile.max_streams
    )
    await serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]


def _begin_shutdown(app: SimApp, shutdown: asyncio.Event | None) -> None:
    """End handlers now, start hypercorn's shutdown, and abort connections left open after a
    short grace (a client that neither reads nor answers TLS close_notify would otherwise hold
    the shutdown for 30 s)."""
    app.close()
    if shutdown is not None:
        shutdown.set()
    loop = asyncio.get_running_loop()
    loop.call_later(_ABORT_AFTER, _abort_connections, loop)


def _abort_connections(loop: asyncio.AbstractEventLoop) -> None:
    # The selector loop's registry of its socket transports (there is no public one).
    transports = getattr(loop, "_transports", None) or {}
    for transport in list(transports.values()):
        if transport is not None:
            transport.abort()


async def _call(function: Callable[[], Any]) -> Any:
    return function()


def _base_url(tls: bool, port: int) -> str:
    return f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1"


# -- in-process server on a background thread -------------------------------------------------
class Simulator:
    """A simulated OpenAI-compatible provider served on 127.0.0.1 from a background thread.

    Use as `with Simulator(profile=Profile(...)) as sim:`; `sim.base_url` is ready on entry.
    """

    def __init__(
        self,
        profile: Profile | None = None,
        *,
        tls: bool = True,
        http2: bool = True,
        seed: int | None = None,
        port: int = 0,
        history: int = 64,
        keep_alive_timeout: float = 75.0,
        phases: Sequence[tuple[float, Mapping[str, Any]]] = (),
    ) -> None:
        self.profile = profile or Profile()
        self.phases = sorted(phases, key=lambda phase: phase[0])
        """``(seconds after the start, profile fields)``: each phase's fields replace the
        profile's then (a provider that slows, fails or recovers mid-run)."""
        self.keep_alive_timeout = keep_alive_timeout
        self.tls = tls
        self.http2 = http2
        self.app = SimApp(self.profile, seed=seed, history=history)
        self.port = port
        self.startup_seconds: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._shutdown_hooks: list[Callable[[], object]] = []

    @property
    def base_url(self) -> str:
        return _base_url(self.tls, self.port)

    @property
    def ca_pem_path(self) -> str:
        return ca_pem_path()

    def ssl_context(self) -> ssl.SSLContext:
        return client_ssl_context()

    def stats(self) -> dict[str, Any]:
        return self.app.stats()

    def reset_stats(self) -> None:
        self.app.reset_stats()

    def release(self) -> int:
        """Let the streams held before their first token go on (``Profile.hold_first_token``);
        returns how many were held."""
        loop = self._loop
        if loop is None:
            return 0
        return asyncio.run_coroutine_threadsafe(_call(self.app.release), loop).result(10)

    @property
    def last_requests(self) -> list[dict[str, Any]]:
        """Recent requests (oldest first): method, path, http_version, headers, query, json."""
        return list(self.app.last_requests)

    def start(self) -> Simulator:
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        began = time.perf_counter()
        if self.tls:
            _certs()
        sock = _listen("127.0.0.1", self.port)
        self.port = sock.getsockname()[1]
        self.app.on_startup = self._ready.set
        self._thread = threading.Thread(
            target=self._run, args=(sock,), name=f"llmroute-sim-{self.port}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            self.stop()
            raise RuntimeError("simulator failed to start") from self._error
        self.startup_seconds = time.perf_counter() - began
        return self

    def _run(self, sock: socket.socket) -> None:
        try:
            asyncio.run(self._main(sock))
        except BaseException as exc:
            self._error = exc
            _LOG.exception("simulator server failed")
        finally:
            sock.close()  # no-op once hypercorn took the descriptor over
            self._ready.set()

    async def _main(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown = asyncio.Event()
        if self.phases:
            phases = asyncio.get_running_loop().create_task(self._run_phases())
            self._shutdown_hooks.append(phases.cancel)
        await _serve(
            self.app,
            sock,
            tls=self.tls,
            http2=self.http2,
            shutdown=self._shutdown,
            keep_alive_timeout=self.keep_alive_timeout,
        )

    async def _run_phases(self) -> None:
        began = time.monotonic()
        for after, fields in self.phases:
            await asyncio.sleep(max(0.0, began + after - time.monotonic()))
            self._change(dict(fields))

    def _change(self, fields: dict[str, Any]) -> None:
        self.app.profile = Profile.from_dict({**dataclasses.asdict(self.app.profile), **fields})

    def change_profile(self, **fields: Any) -> None:
        """Replace some :class:`Profile` fields now (as ``POST /_sim/profile`` does)."""
        check_fields(fields, "change_profile")
        loop = self._loop
        if loop is None or loop.is_closed():
            self._change(fields)
            return
        asyncio.run_coroutine_threadsafe(_call(lambda: self._change(fields)), loop).result(10)

    def _begin_shutdown(self) -> None:
        for hook in self._shutdown_hooks:
            hook()
        _begin_shutdown(self.app, self._shutdown)

    def stop(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None:
            return
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._begin_shutdown)
            except RuntimeError:
                pass  # the loop just closed
        thread.join(10)
        self._thread = None

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- subprocess mode --------------------------------------------------------------------------
async def serve_process(
    profile: Profile,
    *,
    host: str,
    port: int,
    tls: bool,
    http2: bool,
    seed: int | None,
    announce: Callable[[dict[str, Any]], None],
) -> None:
    """Serve until SIGTERM/SIGINT; `announce` gets base_url etc. once the server is ready."""
    loop = asyncio.get_running_loop()
    shutdown = asyncio.Event()
    app = SimApp(profile, seed=seed)

    def stop() -> None:
        _begin_shutdown(app, shutdown)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    sock = _listen(host, port)
    info = {
        "base_url": _base_url(tls, sock.getsockname()[1]),
        "port": sock.getsockname()[1],
        "ca_pem_path": ca_pem_path() if tls else None,
        "pid": os.getpid(),
    }
    app.on_startup = lambda: announce(info)
    await _serve(app, sock, tls=tls, http2=http2, shutdown=shutdown)


class SimulatorProcess:
    """The simulator in a child process (`python -m llmroute.testing serve`), so a benchmark
    can measure the client's CPU apart from the server's."""

    def __init__(
        self,
        profile: Profile | None = None,
        *,
        tls: bool = True,
        http2: bool = True,
        seed: int | None = None,
        port: int = 0,
        startup_timeout: float = 30.0,
    ) -> None:
        self.profile = profile or Profile()
        self.tls = tls
        self.http2 = http2
        self.seed = seed
        self.port = port
        self.startup_timeout = startup_timeout
        self.base_url = ""
        self.ca_pem_path: str | None = None
        self.pid: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> SimulatorProcess:
        cmd = [sys.executable, "-m", "llmroute.testing", "serve", "--port", str(self.port)]
        cmd += ["--tls" if self.tls else "--no-tls", "--http2" if self.http2 else "--no-http2"]
        cmd += ["--profile-json", self.profile.to_json()]
        if self.seed is not None:
            cmd += ["--seed", str(self.seed)]
        env = dict(os.environ)
        if self.tls:  # the child signs with this process's CA: one verify trusts both
            env[CA_ENV] = os.path.dirname(ca_pem_path())
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            info = self._read_announcement(self._proc)
        except BaseException:
            self.stop()
            raise
        self.base_url, self.port = info["base_url"], info["port"]
        self.ca_pem_path, self.pid = info["ca_pem_path"], info["pid"]
        return self

    def _read_announcement(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([proc.stdout], [], [], left)
            if not readable:
                break
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"simulator process exited ({proc.wait()})")
            if line.startswith("{"):
                return json.loads(line)
        raise TimeoutError("simulator process did not start in time")

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting the child's CA (ALPN not set)."""
        return ssl.create_default_context(cafile=self.ca_pem_path)

    def stats(self) -> dict[str, Any]:
        """The child's counters, read over HTTP from /_sim/stats."""
        url = self.base_url.removesuffix("/v1") + "/_sim/stats"
        ctx = self.ssl_context() if self.tls else None
        with urllib.request.urlopen(url, context=ctx, timeout=10) as response:
            return json.loads(response.read())

    def release(self) -> int:
        """Let the streams held before their first token go on (``Profile.hold_first_token``,
        ``POST /_sim/release``); returns how many were held."""
        url = self.base_url.removesuffix("/v1") + "/_sim/release"
        ctx = self.ssl_context() if self.tls else None
        request = urllib.request.Request(url, data=b"", method="POST")
        with urllib.request.urlopen(request, context=ctx, timeout=30) as response:
            return int(json.loads(response.read())["released"])

    def change_profile(self, **fields: Any) -> None:
        """Replace some of the child's :class:`Profile` fields now (``POST /_sim/profile``):
        a provider that gets slow, fails or recovers in the middle of a run."""
        url = self.base_url.removesuffix("/v1") + "/_sim/profile"
        ctx = self.ssl_context() if self.tls else None
        data = json.dumps(fields).encode()
        request = urllib.request.Request(url, data=data, method="POST")
        with urllib.request.urlopen(request, context=ctx, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
