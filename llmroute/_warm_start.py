"""A client's warm start: what it learnt last time, and its connections opened before the
first request.

:class:`WarmStart` reads the stats file as the client starts (``[routing] stats_file``:
``stats_file_for`` seeds the router's stats) and writes it when the client closes; its
:meth:`~WarmStart.warmup` (the client's ``warmup()``) opens every provider's connection, reads
the fleet's stats and prepares the tiered names' classifiers beside them, then, with
``probe=True``, sends every routed target one small request (:mod:`.routing.probe`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import anyio
import httpx

from ._errors import (
    AllTargetsFailed,
    APIConnectionError,
    APITimeoutError,
    describe_error,
    map_transport_errors,
)
from ._routes import save_stats, stats_file_for
from ._tiers import TieredModel
from .config import Resolved, ResolvedProvider
from .metrics import ClientMetrics
from .routing.engine import Router
from .routing.probe import PROBE_TIMEOUT, Probe, probe_targets
from .routing.route import Sender
from .routing.shared import StatsSync
from .transport import Transport

log = logging.getLogger("llmroute")

_WARMUP_REQUEST = httpx.Request("POST", "llmroute://warmup/probe")


class WarmStart:
    """The stats file of one client (and its copies), and its ``warmup()``."""

    def __init__(
        self,
        resolved: Resolved | None,
        router: Router,
        *,
        http: httpx.AsyncClient,
        transport: Transport,
        providers: Mapping[str, ResolvedProvider],
        tiered: Mapping[str, TieredModel],
        stats_sync: StatsSync | None,
        metrics: ClientMetrics,
        sender: Callable[[float], Sender],
    ) -> None:
        self.router = router
        self.stats_file = stats_file_for(resolved, router) if resolved is not None else None
        """The config's stats file, its samples already read into the router's stats."""
        self.http = http
        self.transport = transport
        self.providers = providers  # the client's own (add_provider adds to it)
        self.tiered = tiered
        self.stats_sync = stats_sync
        self.metrics = metrics
        self.sender = sender
        """The sender of a probe, given its timeout (the provider's key, no caller's headers)."""

    async def warmup(
        self,
        default: httpx.URL | None,
        connect_timeout: float | None,
        *,
        probe: bool = False,
        probe_timeout: float = PROBE_TIMEOUT,
    ) -> None:
        await self._connect(default, connect_timeout)
        if probe and self.router.routes:
            await self._probe(probe_timeout)

    async def _probe(self, timeout: float) -> None:
        """One small request to every routed target at once (:mod:`.routing.probe`), each
        counted in the metrics as it ends; raises only when every one failed."""

        def done(probe: Probe) -> None:
            if probe.report is not None:
                self.metrics.probed(probe.report)
            if probe.error is not None:
                log.warning(
                    "warmup: the probe of %s failed: %s", probe.target, describe_error(probe.error)
                )

        sender = self.sender(timeout)
        probes = await probe_targets(self.router, sender, timeout=timeout, on_done=done)
        errors = {p.target: _cause(p) for p in probes if p.error is not None}
        if probes and len(errors) == len(probes):
            raise AllTargetsFailed("warmup(probe=True)", errors, _WARMUP_REQUEST)

    async def _connect(self, default: httpx.URL | None, connect_timeout: float | None) -> None:
        urls = {str(default): default} if default is not None else {}
        for provider in self.providers.values():
            urls.setdefault(str(provider.base_url), provider.base_url)
        errors: list[BaseException] = []

        async def warm(url: httpx.URL) -> None:
            try:
                with map_transport_errors(self.http.build_request("GET", url)):
                    await self.transport.warmup(url, timeout=connect_timeout)
            except APIConnectionError as exc:
                if self.providers:
                    log.warning("warmup: cannot reach %s: %s", url, exc.message)
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            if self.stats_sync is not None:  # the fleet's statistics, beside the connections
                tg.start_soon(self.stats_sync.refresh, None)
            for tiered in self.tiered.values():  # the classifiers, beside the connections
                tg.start_soon(tiered.prepare)
            for url in urls.values():
                tg.start_soon(warm, url)
        if errors and (not self.providers or len(errors) == len(urls)):
            raise errors[0]

    async def aclose(self) -> None:
        """Leave what the router learnt in the stats file, for the next client."""
        if self.stats_file is not None:
            await save_stats(self.stats_file, self.router)


def _cause(probe: Probe) -> BaseException:
    """Why a probe failed: its target's own failure (the engine wraps it), a timeout as
    openai's ``APITimeoutError``."""
    error = probe.error
    if isinstance(error, AllTargetsFailed):
        return error.errors.get(probe.target, error)
    if isinstance(error, TimeoutError):
        return APITimeoutError(request=_WARMUP_REQUEST)  # type: ignore[arg-type]
    assert error is not None
    return error
