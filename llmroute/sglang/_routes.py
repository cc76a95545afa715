"""Started SGLang servers as routing targets: their providers, targets and metrics sources."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._gateway import SGLangGateway

__all__ = ["RouteRegistry", "WorkerRoutes"]


class RouteRegistry(Protocol):
    """What :meth:`SGLangServer.register` needs of a client (``llmroute.AsyncOpenAI``)."""

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None: ...

    def add_targets(self, model: str, targets: Any, **route: Any) -> None: ...


class WorkerRoutes:
    """What :class:`SGLangServer` tells a client about its workers (``urls``, ``api_key``,
    ``served_model_name``, its gateway)."""

    _gateway: SGLangGateway | None

    @property
    def urls(self) -> list[str]:
        raise NotImplementedError

    @property
    def api_key(self) -> str:
        raise NotImplementedError

    @property
    def served_model_name(self) -> str:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def provider_names(self, provider_name: str) -> list[str]:
        """One provider per worker: ``name``, ``name-1``, ``name-2``, ..."""
        return [provider_name if i == 0 else f"{provider_name}-{i}" for i in range(len(self))]

    def provider_config(self, worker: int = 0) -> dict[str, Any]:
        """A ``[providers.X]`` table for ``worker``: kind, base URL and key."""
        return {"kind": "sglang", "base_url": self.urls[worker], "api_key": self.api_key}

    @property
    def gateway_url(self) -> str | None:
        """The OpenAI base URL of SGLang's gateway in front of the workers (``gateway=True``),
        else ``None``."""
        return self._gateway.url if self._gateway is not None else None

    @property
    def gateway(self) -> SGLangGateway | None:
        return self._gateway

    def providers(self, provider_name: str) -> dict[str, dict[str, Any]]:
        """Every worker's ``[providers.X]`` table, by the names of :meth:`provider_names`; with
        a gateway, the gateway's alone (``kind = "sglang-gateway"``): it decides the worker."""
        if self._gateway is not None:
            table = {"kind": "sglang-gateway", "base_url": self._gateway.url}
            return {provider_name: {**table, "api_key": self.api_key}}
        names = self.provider_names(provider_name)
        return {name: self.provider_config(i) for i, name in enumerate(names)}

    def targets(self, provider_name: str) -> list[str]:
        """Each worker as a route target, ``"provider:served_model_name"``; with a gateway,
        the gateway alone."""
        if self._gateway is not None:
            return [f"{provider_name}:{self.served_model_name}"]
        return [f"{name}:{self.served_model_name}" for name in self.provider_names(provider_name)]

    def metrics_urls(self, provider_name: str) -> dict[str, str]:
        """Each worker's server root by target name, for :class:`MetricsPoller`."""
        roots = [url.removesuffix("/v1") for url in self.urls]
        return dict(zip(self.targets(provider_name), roots, strict=True))

    def metrics_keys(self, provider_name: str) -> dict[str, str]:
        """The API key by target name, for :class:`MetricsPoller`'s ``keys`` (SGLang before 0.5
        wants it on ``/metrics`` too)."""
        return dict.fromkeys(self.targets(provider_name), self.api_key)

    def register(
        self, client: RouteRegistry, model: str, *, provider: str = "sglang", **route: Any
    ) -> list[str]:
        """Make every worker a target of ``client``'s route ``model``; returns the targets.

        The workers become providers ``provider``, ``provider-1``, ... (``kind = "sglang"``,
        so the client reads their ``/metrics``). A route that does not exist yet is created
        from ``route`` (the keys of a ``[models.<name>]`` table, e.g. ``policy="prefix"``).
        """
        for name, table in self.providers(provider).items():
            client.add_provider(name, table)
        targets = self.targets(provider)
        client.add_targets(model, targets, **route)
        return targets
