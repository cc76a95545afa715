"""The ``[providers.<name>]`` tables: a catalog vendor, one based on a catalog ``kind``, a server
the catalog does not know, or a simulated provider."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import httpx
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from .._catalog import ContextWindow, Continuation
from .._prices import ModelPrice, UsageFields
from ._messages import invalid, show
from ._values import Duration, empty_is_none, parse_duration, verify_input

__all__ = ["SIMULATOR", "ProviderConfig", "SimulatorPhase"]

SIMULATOR = "simulator"
"""The built-in ``kind`` of a simulated provider, started on 127.0.0.1 with the client that uses
the config and stopped with it (``llmroute._simulated``; docs/simulator.md)."""
_SIMULATOR_OWN = ("base_url", "api_key", "api_key_env", "api_key_env_fallbacks", "verify")
"""What a simulated provider brings itself: its address, its (any) key and its CA."""


def _profile_input(value: Any) -> Any:
    """A simulator's profile: a preset's name, or a table whose durations (``"70ms"``) become
    seconds; its fields are checked with the provider (``ProviderConfig._check_simulator``)."""
    if not isinstance(value, Mapping):
        return value
    from ..testing import DURATION_FIELDS

    table = dict(value)
    for name in DURATION_FIELDS:
        given = table.get(name)
        try:
            if isinstance(given, str):
                table[name] = parse_duration(given)
            elif name == "stall_range" and isinstance(given, list):
                table[name] = [parse_duration(v) if isinstance(v, str) else v for v in given]
        except ValueError as exc:
            raise invalid(str(exc), name) from None
    return table


SimulatorProfile = Annotated[str | dict[str, Any] | None, BeforeValidator(_profile_input)]


class SimulatorPhase(BaseModel):
    """One ``[[providers.<name>.phases]]`` entry of a simulated provider: some of its profile's
    fields replaced ``after`` the simulator started (it slows, fails or recovers mid-run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after: Duration
    profile: Annotated[dict[str, Any], BeforeValidator(_profile_input)]


class ProviderConfig(BaseModel):
    """One ``[providers.<name>]`` table: a catalog vendor, one based on a catalog ``kind``, or a
    server the catalog does not know (then ``base_url`` is required).

    Fields left unset come from the catalog entry. ``continuation = false`` (or ``None``) turns
    continuation off; ``api_key_env = ""`` (or ``None``) says the provider needs no key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str | None = None
    """The catalog entry this provider is based on; default: the table's own name."""
    base_url: str | None = None
    api_key: SecretStr | None = None
    """The API key itself; prefer ``api_key_env`` to keep keys out of files."""
    api_key_env: Annotated[str | None, BeforeValidator(empty_is_none)] = None
    api_key_env_fallbacks: tuple[str, ...] | None = None
    """Older names of ``api_key_env``, read when it is unset (the catalog's, unless
    ``api_key_env`` is given here)."""
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Extra headers, added to the catalog entry's."""
    request_id_headers: tuple[str, ...] | None = None
    """Response headers naming the vendor's request id, tried before ``x-request-id``."""
    continuation: Continuation | None = None
    protocol: Literal["openai", "anthropic"] | None = None
    stream_usage: bool | None = None
    stream_usage_continuous: bool | None = None
    responses: bool | None = None
    responses_stored: bool | None = None
    self_hosted: bool | None = None
    display_name: str | None = None
    verify: Annotated[bool | str | None, BeforeValidator(verify_input)] = None
    """TLS trust of this provider's ``https://`` base URL: ``true`` (the system's roots or
    ``SSL_CERT_FILE``), ``false`` (no verification: for a test server only), or the path of a CA
    file (PEM) or directory; unset, the client's own ``verify``."""
    context_window: ContextWindow | None = None
    """Tokens (prompt plus answer) every model of this provider takes at most, e.g. 32768 for a
    self-hosted server started with that context length; it replaces the catalog's windows."""
    context_windows: dict[str, ContextWindow] = Field(default_factory=dict)
    """Context windows by model name (``{ "qwen2.5-7b-instruct" = 32768 }``), added to the
    catalog's; a model named here takes its window from here, before ``context_window``."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Prices by model name (``[providers.<name>.prices."<model>"]``, docs/cost.md), added to
    the catalog's: a model named here takes its price from here. ``"*"`` prices every model
    without its own (a self-hosted server: ``gpu_hour = { usd = 2.5, tokens_per_second =
    2400 }``, or ``input = 0, output = 0``)."""
    usage: UsageFields | None = None
    """Where the server's ``usage`` reports each token class; unset: the catalog's or the
    protocol's."""
    profile: SimulatorProfile = None
    """``kind = "simulator"`` only: how the simulated provider behaves, a preset's name
    (``instant``, ``fast-but-spiky``, ``steady-slow``, ``flaky``) or a table of its fields,
    optionally on a preset (``{ preset = "flaky", rate_503 = 0.2 }``); unset: ``instant``."""
    phases: tuple[SimulatorPhase, ...] = ()
    """``kind = "simulator"`` only: profile changes at given times after its start."""

    @model_validator(mode="after")
    def _check_simulator(self) -> ProviderConfig:
        given = self.model_fields_set
        if self.kind != SIMULATOR:
            for name in ("profile", "phases"):
                if name in given:
                    raise invalid(f'{name} is for kind = "{SIMULATOR}" providers only', name)
            return self
        for name in _SIMULATOR_OWN:
            if name in given:
                raise invalid(
                    f"a simulated provider has its own {name} (it starts on 127.0.0.1 with the "
                    f"client, with the simulators' CA): remove {name}",
                    name,
                )
        from ..testing import check_fields, profile_of

        try:
            profile_of(self.profile, "profile")
            after = -1.0
            for index, phase in enumerate(self.phases):
                check_fields(phase.profile, f"phases.{index}.profile")
                if phase.after <= after:
                    raise ValueError(f"phases.{index}.after: the phases must come in time order")
                after = phase.after
        except ValueError as exc:
            raise invalid(str(exc)) from None
        return self

    @field_validator("continuation", mode="before")
    @classmethod
    def _check_continuation(cls, value: Any) -> Any:
        if value is False:
            return None
        if value is True:
            raise invalid("expected a table such as { message = { prefix = true } } or false")
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url: httpx.URL | None = httpx.URL(value)
        except httpx.InvalidURL:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise invalid(f"expected an http:// or https:// URL, got {show(value)}")
        return value
