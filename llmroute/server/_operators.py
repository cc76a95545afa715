"""The operators' paths: ``/metrics`` (every key's figures: an admin key's, or any key's when
no key is an admin's, unless ``metrics_public``), ``/admin/usage``, the admin API for keys and
teams (``/admin/keys``, ``/admin/teams``: :class:`~._admin.KeysAdmin`) and the live page
(``/admin/live``). Every ``/admin/`` answer, a refusal too, has ``cache-control: no-store``."""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import GatewaySettings
from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..metrics import ClientMetrics
from ._admin import AdminError, KeysAdmin
from ._admission import Admission
from ._errors import ErrorAnswers, Refused, error_body, not_allowed, unknown_url
from ._exchange import Request, read_json
from ._gate import Door
from ._keystore import StoreConflict, StoreUnavailable
from ._live import PAGE_HEADERS, LivePage, LiveView, since_of
from ._metrics import GatewayMetrics
from ._usage import fleet_exposition

__all__ = ["ADMIN_KEYS", "ADMIN_KEYS_UNDER", "ADMIN_TEAMS", "ADMIN_USAGE", "LIVE_DATA", "Operators"]

log = logging.getLogger("llmroute.server")

ADMIN_USAGE = "/admin/usage"
ADMIN_KEYS = "/admin/keys"
ADMIN_KEYS_UNDER = ("/admin/keys/", "/admin/teams/")
ADMIN_TEAMS = "/admin/teams"
_LIVE = "/admin/live"
LIVE_DATA = "/admin/live/data"
_SINCE_HEADER = "x-llmroute-live-since"


@dataclass(eq=False, repr=False)
class Operators:
    """Answers the operators' paths (see the module's docstring)."""

    settings: GatewaySettings
    door: Door
    errors: ErrorAnswers
    metrics: GatewayMetrics
    client_metrics: ClientMetrics
    admission: Admission
    keys_admin: KeysAdmin
    usage: Callable[[str], Awaitable[dict[str, Any]]]
    live: LiveView | None
    live_page: LivePage | None = field(init=False)

    def __post_init__(self) -> None:
        self.live_page = LivePage() if self.live is not None else None

    def serves(self, path: str) -> bool:
        return path == "/metrics" or path.startswith("/admin/")

    async def answer(self, request: Request) -> None:
        path, method, exchange = request.path, request.method, request.exchange
        if path == "/metrics":
            not_allowed(method, "GET")
            await self._metrics(request)
            return
        exchange.headers["cache-control"] = "no-store"  # answers with secrets, 401s too
        if path == ADMIN_USAGE:
            not_allowed(method, "GET")
            self.door.admin(request, "read usage")
            scope = _usage_scope(exchange.query)
            await exchange.whole(200, json.dumps(await self.usage(scope)).encode())
            return
        if path in (ADMIN_KEYS, ADMIN_TEAMS) or path.startswith(ADMIN_KEYS_UNDER):
            await self._keys_api(request)
            return
        if self.live_page is not None and path.startswith(_LIVE):
            await self._live(request)
            return
        raise unknown_url(path)

    async def _metrics(self, request: Request) -> None:
        if not self.settings.metrics_public:
            # Every key's figures are in it: with an admin key configured, a tenant's key
            # does not read them.
            if self.door.admins:
                self.door.admin(request, "read the metrics")
            else:
                self.door.authenticate(request)
        data = self.client_metrics.exposition() + self.metrics.exposition()
        fleet = await self.admission.fleet_usage()
        if fleet is not None:
            data += fleet_exposition(fleet)
        # No label can carry an upstream key, whole or masked, whatever an upstream said.
        data = self.errors.scrub(data.decode()).encode()
        await request.exchange.whole(200, data, METRICS_CONTENT_TYPE)

    async def _keys_api(self, request: Request) -> None:
        """``/admin/keys`` and ``/admin/teams`` (llmroute/server/_admin.py), for admin keys."""
        path, method, exchange = request.path, request.method, request.exchange
        self.door.admin(request, "manage keys")

        async def body() -> Any:
            reject = self.metrics.rejecter(exchange.key)
            return await read_json(request, self.settings, reject, allow_empty=True)

        try:
            status, answer = await self.keys_admin.handle(method, path, body)
        except AdminError as error:
            allow = getattr(error, "allow", None)
            raise Refused(
                error.status,
                error_body(error.message, "invalid_request_error", error.code, error.param),
                {"allow": allow} if allow else None,
            ) from None
        except (StoreUnavailable, StoreConflict) as exc:
            raise Refused(
                503,
                error_body(
                    f"The keys cannot be changed now: {exc}.",
                    "server_error",
                    "key_store_unavailable",
                ),
                {"retry-after": "1", "retry-after-ms": "1000"},
            ) from None
        if method != "GET":
            action = key_action(method, path)
            self.metrics.key_changes.labels(action).inc()
            changed = answer.get("name") if isinstance(answer, dict) else None
            log.info("gateway keys: %s by key=%s: %s", action, exchange.key, changed)
        await exchange.whole(status, json.dumps(answer).encode())

    async def _live(self, request: Request) -> None:
        """The live page: its static files to anyone (they hold no data), its data to an admin
        key only (given in ``Authorization``, never in the URL)."""
        assert self.live_page is not None and self.live is not None
        path, exchange = request.path, request.exchange
        not_allowed(request.method, "GET")
        if path == LIVE_DATA:
            self.door.admin(request, "read the live page's data")
            since = since_of(request.headers.get(_SINCE_HEADER, ""))
            data = json.dumps(await self.live.data(since)).encode()
            await exchange.whole(
                200, self.errors.scrub(data.decode()).encode(), headers=PAGE_HEADERS
            )
            return
        found = self.live_page.files.get(path)
        if found is None:
            raise unknown_url(path)
        await exchange.whole(200, found[0], found[1], PAGE_HEADERS)


def key_action(method: str, path: str) -> str:
    """The admin API's change, as ``llmroute_gateway_key_changes_total`` counts it."""
    if path.startswith(ADMIN_TEAMS):
        return "team_delete" if method == "DELETE" else "team_put"
    if path.endswith("/rotate"):
        return "rotate"
    return {"POST": "create", "PATCH": "update", "DELETE": "revoke"}.get(method, "other")


def _usage_scope(query: bytes) -> str:
    """``GET /admin/usage?scope=fleet|replica``'s scope (``fleet`` when not given)."""
    given = urllib.parse.parse_qs(query.decode("latin-1")).get("scope", ["fleet"])[-1]
    if given not in ("fleet", "replica"):
        raise Refused(
            400,
            error_body(
                "Invalid 'scope': expected 'fleet' or 'replica'.",
                "invalid_request_error",
                "invalid_value",
                "scope",
            ),
        )
    return given
