"""The gateway's raw ASGI app: OpenAI's HTTP API in front of one routed ``AsyncOpenAI``.

:class:`GatewayApp` routes a request by its URL and runs its phases, each in a module of its
own: the exchange (``_exchange.py``: the body read, the answer written back, whole or
streamed), the key (``_keys.py``, ``_tenants.py``), the request's checks (``_checks.py``),
admission and accounting (``_gate.py``: slots, limits, usage), the client's call
(``_calls.py``: the public hand-off to the routing) and the errors (``_errors.py``: OpenAI's
error bodies). The phases read one :class:`~._exchange.Request`, built as the request comes in,
and, for an API call once its checks passed, one :class:`~._calls.ApiCall`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from .._client import AsyncOpenAI
from .._secrets import provider_secrets
from .._types import RouteReport
from .._upstream import no_cookies, to_timeout
from ..config import Config, ConfigError, GatewaySettings, load_config
from ._admin import KeysAdmin
from ._admission import Admission
from ._alerts import SoftLimits
from ._auth import KeyRing
from ._calls import ROUTABLE, ApiCall, upstream_headers
from ._checks import (
    KINDS,
    POSTS,
    BodyChecks,
    Reject,
    default_goal,
    key_max_tokens,
    permit,
    total_timeout,
    usable,
)
from ._errors import (
    ErrorAnswers,
    Refused,
    error_body,
    model_not_found,
    not_allowed,
    unknown_url,
)
from ._exchange import (
    Exchange,
    Receive,
    Request,
    Scope,
    Send,
    Stalled,
    dump_json,
    read_body,
)
from ._gate import Door, Gate
from ._keys import LiveKeys
from ._keystore import KeyStore
from ._live import LIVE_FILES, LiveView
from ._metrics import GatewayMetrics
from ._operators import (
    ADMIN_KEYS,
    ADMIN_KEYS_UNDER,
    ADMIN_TEAMS,
    ADMIN_USAGE,
    LIVE_DATA,
    Operators,
)
from ._relay import InFlight, Relay
from ._slo import Objective, SloTracker
from ._spend import Prices, money_problem
from ._tally import Tally
from ._tenants import Tenant, Tenants
from ._usage import usage_report

__all__ = ["GatewayApp", "dump_json"]

log = logging.getLogger("llmroute.server")

_MODELS = "/v1/models"
_LOG_UNSAFE = re.compile(r"[^\w.:/+=-]")  # a vendor's request id, as the access log shows it


class GatewayApp:
    """An ASGI app serving OpenAI's API (``/v1/chat/completions`` streamed or not,
    ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``) plus ``/health`` and ``/metrics``,
    with one :class:`llmroute.AsyncOpenAI` built from ``config`` behind it, so every request
    gets the routing and the cache.

    ``/v1/*`` (and ``/metrics`` unless ``metrics_public``) need one of the gateway's keys as
    ``Authorization: Bearer <key>``; that header is never sent upstream, and the upstream keys
    never appear in a response or a log line. ``client_options`` go to ``AsyncOpenAI`` (e.g.
    ``verify``, ``max_retries``, ``timeout``). Raises :class:`~llmroute.ConfigError` when the
    config or a gateway key is missing.
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | None,
        *,
        environ: Mapping[str, str] = os.environ,
        **client_options: Any,
    ) -> None:
        loaded = load_config(config)
        if loaded is None:
            raise ConfigError(
                "the gateway needs a config with routes: pass --config or set LLMROUTE_CONFIG "
                "(llmroute serve --simulator serves simulated providers without one)"
            )
        self.config = loaded
        self.settings = loaded.gateway or GatewaySettings()
        self.metrics = GatewayMetrics()
        self._keys = LiveKeys(loaded, environ, self.metrics, self._cut_revoked)
        self.client = AsyncOpenAI(config=loaded, **client_options)  # its simulators start
        self.prices = Prices(loaded, self.client._llmroute.resolved.providers)  # money budgets
        if (problem := money_problem(loaded, self._keys.tenants, self.prices)) is not None:
            raise ConfigError(problem)
        # The upstream keys and the values of the providers' credential headers (api-key, ...).
        secrets = provider_secrets(self.client._llmroute.resolved.providers.values())
        self.errors = ErrorAnswers(secrets, self.settings.max_retry_after)
        _refuse_cookies(self.client)
        self._timeout = to_timeout(self.client.timeout)  # every routed call's, as the seam's
        self.slo = SloTracker(self.metrics.registry)
        self.routes = [*loaded.models, *loaded.tiered]
        self._created = int(time.time())
        self.clock: Callable[[], float] = time.time
        """When keys expire and rotated values stop (Unix seconds; a test may replace it)."""
        self._closing = False
        self._assemble(loaded)

    def _assemble(self, loaded: Config) -> None:
        """The request's parts: admission, the call's relay, the operators' paths."""
        self.admission = Admission(self.settings, loaded.redis)
        self.bodies = BodyChecks()
        """Each ``/v1`` body's parse and checks, off the event loop for a large one."""
        self.soft_limits = SoftLimits(self.settings.soft_limit_webhook, self.metrics)
        slos = {r: Objective(o.ttft_ms, o.percentile) for r, o in self.settings.slos.items()}
        self.gate = Gate(
            self.admission, self.metrics, self.slo, self.soft_limits, slos, self.prices
        )
        keys = self._keys
        self.keys_admin = KeysAdmin(
            loaded, keys.store, lambda: keys.tenants, lambda: self.clock(), keys.apply_managed
        )
        self._in_flight = InFlight()
        self.relay = Relay(
            self.client, self._timeout, self.metrics, keys, self.gate, self._in_flight, self.errors
        )
        self.door = Door(lambda: keys.tenants, lambda: self.clock(), self.metrics)
        self.live: LiveView | None = None
        """The live page's samples (``live_page = true``), else None."""
        if self.settings.live_page:
            self.live = LiveView(
                loaded, self.client.stats, self.client.metrics, self.usage, self.slo.snapshot
            )
        self.operators = Operators(
            self.settings,
            self.door,
            self.errors,
            self.metrics,
            self.client.metrics,
            self.admission,
            self.keys_admin,
            self.usage,
            self.live,
        )

    # -- keys that change ---------------------------------------------------------------------

    @property
    def keys(self) -> KeyRing:
        """The keys accepted now (replaced on a reload)."""
        return self._keys.tenants.ring

    @property
    def tenants(self) -> Tenants:
        """The keys accepted now, with their settings, teams and scopes."""
        return self._keys.tenants

    @property
    def _store(self) -> KeyStore | None:
        return self._keys.store

    def reload(self) -> bool:
        """Read the keys again (``keys_file`` and the environment): new keys are accepted, the
        settings of known ones replaced, and revoked keys refused from now on; their streams in
        flight finish or are cut (``revoked_streams``). On a mistake the keys stay as they were
        and the mistake is logged as a sentence. Call it from the server's event loop.
        Returns whether the keys were replaced."""
        return self._keys.reload()

    def _cut_revoked(self, revoked: set[str]) -> None:
        for name in revoked:
            self.slo.forget(name)
        if self.settings.revoked_streams == "cut":
            self._in_flight.cut(revoked)

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests being answered now (a stream counts until it ends)."""
        return len(self._in_flight)

    async def drain(
        self, timeout: float, cut: Callable[[], Awaitable[object]] | None = None
    ) -> int:
        """Refuse new requests (503) and wait, up to ``timeout`` seconds or until ``cut``
        returns, for the requests in flight to end. Returns how many are still in flight (the
        caller then ends them with :meth:`begin_shutdown`)."""
        self._closing = True
        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as tg:
                if cut is not None:

                    async def cut_short() -> None:
                        await cut()
                        tg.cancel_scope.cancel()

                    tg.start_soon(cut_short)
                await self._in_flight.idle()
                tg.cancel_scope.cancel()
        return len(self._in_flight)

    def begin_shutdown(self) -> None:
        """Refuse new requests and end the streams in flight (their clients get an error event,
        their upstream streams are cancelled). Call it from the server's event loop."""
        self._closing = True
        self._in_flight.cut()

    async def aclose(self) -> None:
        """End what is in flight and close the client (its connections and cache)."""
        self.begin_shutdown()
        await self.client.close()
        await self.admission.aclose()
        self.soft_limits.close()
        if self._store is not None:
            await self._store.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    with anyio.move_on_after(10):
                        try:
                            await self.client.warmup()
                        except Exception as exc:  # serving goes on; routing handles dead targets
                            log.warning(
                                "warmup: no target could be reached: %s", self._scrub(str(exc))
                            )
                    tg.start_soon(self._keys.watch_file)
                    tg.start_soon(self._keys.watch_store)
                    tg.start_soon(self.soft_limits.run)
                    tg.start_soon(self.admission.run)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    tg.cancel_scope.cancel()  # the keys' watch
                    break
        await self.aclose()
        await send({"type": "lifespan.shutdown.complete"})

    # -- dispatch -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        label = _label(path)
        exchange = Exchange(send, label, self.settings.write_timeout)
        exchange.query = scope.get("query_string", b"")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request = Request(path, method, headers, exchange, receive)
        began = time.monotonic()
        try:
            try:
                await self._route(request)
            except Refused as refused:
                await self._refuse(exchange, refused)
            except Stalled:
                raise
            except Exception as exc:  # a bug: a 500 with a sentence, logged as one
                log.error(
                    "unexpected error answering %s %s: %s",
                    method,
                    label,
                    self._scrub(f"{type(exc).__name__}: {exc}"),
                )
                failed = error_body("The gateway failed to answer.", "server_error")
                await self._refuse(exchange, Refused(500, failed))
        except Stalled:
            pass  # the response is cut; the server resets the stream or closes the connection
        finally:
            self._log(method, exchange, time.monotonic() - began)

    def _log(self, method: str, exchange: Exchange, elapsed: float) -> None:
        """The request in the metrics, its key's usage (unless its answer counted it) and the
        access log."""
        label = exchange.label
        status = str(exchange.status or 499)
        self.metrics.requests.labels(exchange.key, label, status).inc()
        if label.startswith("/v1/") and not exchange.counted:
            self.gate.count_call(exchange)
        self.metrics.duration.labels(label).observe(elapsed)
        log.info(
            "%s %s %s key=%s %.3fs %s%s%s",
            method,
            label,
            status,
            exchange.key,
            elapsed,
            exchange.request_id,
            _trace_ids(exchange.report),
            " (client went away)" if exchange.gone else "",
        )

    async def _route(self, request: Request) -> None:
        path = request.path
        if path == "/health":
            not_allowed(request.method, "GET")
            await request.exchange.whole(200, json.dumps(self._health()).encode())
            return
        if self.operators.serves(path):
            await self.operators.answer(request)
            return
        if not path.startswith("/v1/"):
            raise unknown_url(path)
        self.door.authenticate(request)
        if self._closing:
            raise Refused(503, error_body("The gateway is shutting down.", "server_error"))
        await self._v1(request)

    # -- the API ------------------------------------------------------------------------------

    async def _v1(self, request: Request) -> None:
        path, method, exchange = request.path, request.method, request.exchange
        tenant = exchange.tenant
        assert tenant is not None
        if path == _MODELS or path.startswith(_MODELS + "/"):
            not_allowed(method, "GET")
            await self._models(path, tenant, exchange)
            return
        if path not in POSTS:
            raise unknown_url(f"{method} {path}")
        not_allowed(method, "POST")
        # The body is read (within body_timeout) before the key's slot is taken: a client
        # trickling its body holds no slot.
        reject = self.metrics.rejecter(exchange.key)
        data = await read_body(request, self.settings, reject)
        body, model, tokens = await self.bodies.checked(path, data, reject)
        call = self._checked(request, tenant, model, body, reject, (len(data), tokens))

        async def work() -> None:
            tally = Tally(call.body, call.kind, call.prompt_tokens)
            admitted = time.monotonic()
            try:
                await self.relay.answer(call, tally)
            finally:
                self.gate.objectives(call, admitted)
                await self.gate.settle(exchange, tally)

        await self.gate.enter(call, work)

    def _checked(
        self,
        request: Request,
        tenant: Tenant,
        model: str,
        body: dict[str, Any],
        reject: Reject,
        counted: tuple[int, int],
    ) -> ApiCall:
        """The checks of the key's use of ``model`` with ``body`` (``_checks.py``; ``counted``:
        its bytes as received and its prompt's tokens), and the call they leave: its headers
        sent on, its total timeout."""
        path, headers, exchange = request.path, request.headers, request.exchange
        if model not in self.routes and self.config.default_provider is None:
            raise model_not_found(model, usable(self.routes, tenant))
        permit(self.config, self.routes, tenant, model, body, reject)
        key_max_tokens(tenant, path, body, reject)
        if tenant.settings.ttft_target_ms is not None and path in ROUTABLE:
            default_goal(body, headers, tenant.settings.ttft_target_ms)
        total = total_timeout(self.config, headers, model, reject)
        routed = path in ROUTABLE and model in self.routes  # its id on its report and span
        namespace = self._keys.namespaces.get(exchange.key)
        upstream = upstream_headers(headers, namespace, exchange.request_id if routed else None)
        return ApiCall(request, tenant, model, KINDS[path], body, upstream, total, *counted)

    async def _models(self, path: str, tenant: Tenant, exchange: Exchange) -> None:
        """``/v1/models`` (the routes the key may use) and ``/v1/models/{model}``."""
        if path == _MODELS:
            data = [self._model(name) for name in usable(self.routes, tenant)]
            await exchange.whole(200, json.dumps({"object": "list", "data": data}).encode())
            return
        name = path[len(_MODELS) + 1 :]
        if name not in self.routes or not tenant.may_use(name):
            raise model_not_found(name, usable(self.routes, tenant))
        await exchange.whole(200, json.dumps(self._model(name)).encode())

    async def usage(self, scope: str = "fleet") -> dict[str, Any]:
        """Every key's and team's usage (requests, errors, tokens, cache hits) — the fleet's
        with Redis (``scope="fleet"``), else this replica's — and their limits' counters now:
        ``GET /admin/usage``."""
        return await usage_report(
            self.tenants, self.gate.usage, self.admission, self._created, scope
        )

    # -- the routed call ------------------------------------------------------------------------

    async def _call(self, path: str, body: dict[str, Any], extra_headers: dict[str, str]) -> object:
        """The client's call for ``path``: the hand-off ``benchmarks/gateway_call.py`` times."""
        return await self.relay.call(path, body, extra_headers)

    # -- answers ------------------------------------------------------------------------------

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self._created, "owned_by": "llmroute"}

    def _health(self) -> dict[str, Any]:
        targets = {
            name: {
                "n": snap.n,
                "ttft_p50": snap.ttft_p50,
                "ttft_p95": snap.ttft_p95,
                "error_rate": snap.error_rate,
                "in_flight": snap.in_flight,
                "breaker": snap.breaker,
            }
            for name, snap in self.client.stats().items()
        }
        status = "shutting_down" if self._closing else "ok"
        return {"status": status, "routes": self.routes, "targets": targets}

    async def _refuse(self, exchange: Exchange, refused: Refused) -> None:
        if exchange.gone or exchange.status:
            exchange.status = exchange.status or refused.status
            return
        data = self._error_bytes(refused.body)
        await exchange.whole(refused.status, data, headers=refused.headers)

    def _scrub(self, text: str) -> str:
        return self.errors.scrub(text)

    def _error_bytes(self, body: Any) -> bytes:
        return self.errors.error_bytes(body)

    def _map_error(self, exc: Exception) -> Refused:
        """An exception of the routed call as the OpenAI-shaped error a client should see."""
        return self.errors.map_error(exc)


def _refuse_cookies(client: object) -> None:
    """Give the client's HTTP client a cookie jar that keeps nothing: an upstream's Set-Cookie
    for one tenant's request must not ride on the next tenant's."""
    http_client = getattr(client, "_client", None)
    if http_client is not None and hasattr(http_client, "cookies"):
        http_client.cookies = no_cookies()  # routed calls keep none already


def _trace_ids(report: RouteReport | None) -> str:
    """The access log's ids of a routed request: its trace and the vendors' request ids."""
    if report is None:
        return ""
    ids = [_LOG_UNSAFE.sub("?", a.request_id[:128]) for a in report.attempts if a.request_id]
    text = f" trace={report.trace_id}" if report.trace_id else ""
    return text + (f" upstream={','.join(ids)}" if ids else "")


_LABELS = frozenset((*POSTS, _MODELS, "/health", "/metrics", ADMIN_USAGE)) | {
    LIVE_DATA,
    *LIVE_FILES,
    ADMIN_KEYS,
    ADMIN_TEAMS,
}


def _label(path: str) -> str:
    """The path as the access log and the metrics name it: one of the gateway's own (an
    admin read included, so it can be audited), else a bounded stand-in."""
    if path in _LABELS:
        return path
    if path.startswith(_MODELS + "/"):
        return _MODELS + "/{model}"
    if path.startswith(ADMIN_KEYS_UNDER):  # who changed which keys is audited by path
        rotate = "/rotate" if path.endswith("/rotate") else ""
        return path[: path.index("/", len("/admin/")) + 1] + "{name}" + rotate
    return "other"
