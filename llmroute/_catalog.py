"""The vendor catalog: one TOML file per vendor in the top-level ``providers/`` folder.

Each file describes how to reach a vendor and what routing may ask of it: base URL, wire
protocol, the environment variable holding its API key, and capabilities (assistant-prefix
continuation and how it is requested, prompt-prefix caching, usage in streams, the Responses
API and whether it keeps responses), and the vendor's current chat models and the retired ones a
user may still name (:func:`find_model`), their prices per million tokens and where the vendor's
usage reports each billed token class (``[prices]``, ``[usage]``: docs/cost.md). The files ship
inside the wheel (as ``llmroute/_providers``); in a source checkout or an editable install they
are read from ``providers/`` beside the package. Each file ends with its ``[[sources]]``: which
claims were checked against which page, and when.
"""

from __future__ import annotations

import datetime
import functools
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from ._prices import ModelPrice, UsageFields
from .protocols import adapter_for

__all__ = [
    "SOURCE_CLAIMS",
    "CatalogError",
    "ContextWindow",
    "Continuation",
    "ModelListing",
    "ProviderSpec",
    "RetiredModel",
    "Source",
    "Trial",
    "catalog_dir",
    "find_model",
    "format_validation_error",
    "load_catalog",
    "load_provider_file",
    "parse_provider",
]


class CatalogError(ValueError):
    """Raised when a catalog file is missing, not TOML, or not a valid provider description."""


ContextWindow = Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]
"""A context window in tokens: the prompt and the answer together, as the vendor counts them."""


class Continuation(BaseModel):
    """How a vendor continues an answer from a given assistant prefix.

    A continuation request ends its ``messages`` with ``{"role": "assistant", "content":
    <text so far>, **message}`` and adds ``body`` to the request's top level (a vendor's
    switch that turns thinking off, say); it goes to ``base_url`` when set (DeepSeek serves
    it on its beta endpoint only).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    message: dict[str, Any] = Field(default_factory=dict)
    """Extra fields on the trailing assistant message, e.g. ``{"prefix": true}``."""
    body: dict[str, Any] = Field(default_factory=dict)
    """Extra top-level request fields, e.g. ``{"continue_final_message": true}``."""
    base_url: str | None = None
    """Where continuation requests go, if not the provider's ``base_url``."""
    echoes_prefix: bool = Field(False, strict=True)
    """Whether the vendor's answer begins with the prefix it was given (Mistral's does): the
    engine then strips exactly that text from the continuing answer, and fails the
    continuation as a break if the answer does not begin with it."""


class Trial(BaseModel):
    """The vendor's cheapest request that says truthfully whether it serves chat now: what
    llmroute sends, in the background, to a target whose circuit is open.

    A chat completion of the target's model with one short user message, not streamed, and
    ``body`` added at the top level: by default ``{"max_tokens": 1}`` (one output token). A
    target used for another endpoint (Responses, embeddings) is tried with a call of that
    endpoint instead (``llmroute.routing.trials.trial_body``). A models list would cost
    nothing, but a vendor may answer it while its inference is down.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    body: dict[str, Any] = Field(default_factory=lambda: {"max_tokens": 1})
    """Top-level fields of the trial request, e.g. ``{"max_completion_tokens": 1}``."""


SOURCE_CLAIMS = frozenset(
    {
        "base_url",
        "api_key_env",
        "continuation",
        "prompt_caching",
        "stream_usage",
        "responses",
        "request_id_headers",
        "context_windows",
        "trial",
        "max_tokens_field",
        "models",
        "prices",
        "usage",
    }
)
"""The claims a source may vouch for (mostly the catalog keys they set)."""


class Source(BaseModel):
    """Where some of a catalog entry's claims come from, and when they were last checked there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    about: str
    """The claims: names of :data:`SOURCE_CLAIMS`, comma-separated (``"base_url, api_key_env"``)."""
    url: str | None = None
    """The page read (the vendor's own, unless ``verified`` is false); ``None`` only for a claim
    no page states (``verified = false``)."""
    checked: datetime.date
    """The day the claims were last checked against ``url``."""
    verified: bool = Field(default=True, strict=True)
    """False when no page of the vendor's confirms the claims (taken from third-party code,
    captured traffic, or a page that could not be read): what is still to be verified."""
    note: str = ""
    """What the page says, or what was not found."""
    models: tuple[str, ...] = ()
    """The models a per-model claim is about (``prices``): the ``prices`` keys this page dates."""

    @property
    def claims(self) -> tuple[str, ...]:
        """The names in ``about``, in order."""
        return tuple(part.strip() for part in self.about.split(","))

    @pydantic.model_validator(mode="after")
    def _known_claims_and_a_page(self) -> Source:
        unknown = [claim for claim in self.claims if claim not in SOURCE_CLAIMS]
        if unknown:
            raise ValueError(
                f"about: unknown claim {unknown[0]!r} (one of: {', '.join(sorted(SOURCE_CLAIMS))})"
            )
        if self.url is None and self.verified:
            raise ValueError("a verified source needs its url")
        if self.url is not None and not self.url.startswith("https://"):
            raise ValueError(f"url: expected an https:// address, got {self.url!r}")
        return self


class RetiredModel(BaseModel):
    """A model the vendor shut down (or announced a shutdown date for) and what it names instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shutdown: datetime.date
    """The day the vendor stops (or stopped) serving it, as the vendor's deprecation page says."""
    use: Annotated[str, Field(min_length=1)]
    """The replacement the vendor names (or, where that one is retired too, its own successor)."""

    def notice(self, vendor: str, model: str, today: datetime.date) -> str:
        """``"Acme shut down acme-1 on 2026-07-24: use acme-2"`` (``"shuts down"`` when the
        date is after ``today``)."""
        verb = "shut down" if self.shutdown < today else "shuts down"
        return f"{vendor} {verb} {model} on {self.shutdown}: use {self.use}"


class ProviderSpec(BaseModel):
    """One vendor (or self-hosted server kind) as the catalog or a config describes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """The catalog name (the file's stem), e.g. ``"deepseek"``."""
    display_name: str = ""
    base_url: str
    """The OpenAI-style base URL, ending before ``/chat/completions``."""
    protocol: Literal["openai", "anthropic"] = "openai"
    """The wire protocol of ``base_url``."""
    api_key_env: str | None = None
    """The environment variable holding the API key; ``None`` when no key is needed."""
    api_key_env_fallbacks: tuple[str, ...] = ()
    """Older names of that variable, read in order when ``api_key_env`` is unset or empty
    (Zhipu's ``ZHIPUAI_API_KEY``); not read when a config names its own ``api_key_env``."""
    models: tuple[str, ...] = ()
    """The vendor's current chat models, as its docs listed them when checked (a short list of
    the names a user would route to, not every snapshot); empty: no fixed list (a self-hosted
    server serves whatever it was started with). Informational: routing sends any name."""
    retired_models: dict[str, RetiredModel] = Field(default_factory=dict)
    """Models the vendor retired, or announced a shutdown date for, by name."""
    self_hosted: bool = Field(False, strict=True)
    """A server the user runs (SGLang, vLLM, Ollama), usually on a local or private address."""
    continuation: Continuation | None = None
    """Assistant-prefix continuation, or ``None`` when the vendor has none."""
    prompt_caching: Literal["none", "automatic", "explicit"] = "none"
    """Whether the vendor caches prompt prefixes: by itself, only when asked, or not at all."""
    stream_usage: bool = Field(True, strict=True)
    """Whether ``stream_options.include_usage`` is accepted."""
    stream_usage_continuous: bool = Field(False, strict=True)
    """Whether ``stream_options.continuous_usage_stats`` is accepted (vLLM, SGLang): the usage
    so far on every chunk, so a stream that breaks mid-answer is counted exactly."""
    responses: bool = Field(False, strict=True)
    """Whether ``base_url`` serves OpenAI's Responses API (``POST {base_url}/responses``)."""
    responses_stored: bool = Field(False, strict=True)
    """Whether the vendor keeps the responses it issued, so that ``previous_response_id`` works
    (only on the target that answered: a stateless Responses API needs the whole input)."""
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Extra headers every request to this vendor carries (never secrets)."""
    request_id_headers: tuple[str, ...] = ()
    """Response headers carrying the vendor's id of a request, tried in order before
    ``x-request-id`` (e.g. DeepSeek's ``x-ds-trace-id``): what the vendor's support asks for."""
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] | None = None
    """The one field the vendor takes for a chat answer's length limit: a caller's
    ``max_tokens`` or ``max_completion_tokens`` is sent under this name (the smaller, if both
    are given). OpenAI's reasoning models refuse ``max_tokens``, Mistral's schema has no
    ``max_completion_tokens`` (422), DashScope deprecated ``max_tokens``: one route over them
    takes either spelling. ``None``: sent as the caller wrote it."""
    trial: Trial = Field(default_factory=Trial)
    """The request that tries a target whose circuit is open (one output token by default)."""
    docs: str = ""
    """The vendor's documentation page the values come from."""
    context_window: ContextWindow | None = None
    """Tokens (prompt plus answer) every model of this provider takes at most, unless
    ``context_windows`` names the model; ``None``: unknown (never a reason to skip a target)."""
    context_windows: dict[str, ContextWindow] = Field(default_factory=dict)
    """Context windows by model name, as the vendor's docs state them."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """What each model costs, by model name (``"*"``: any model without its own price)."""
    usage: UsageFields | None = None
    """Where the vendor's ``usage`` reports each token class; ``None``: the protocol's."""
    sources: tuple[Source, ...] = ()
    """Where the entry's claims come from and when each was checked (the file's ``[[sources]]``)."""

    @property
    def checked(self) -> datetime.date | None:
        """The oldest day any of the entry's sources was checked; ``None`` without sources."""
        return min((source.checked for source in self.sources), default=None)

    @property
    def usage_fields(self) -> UsageFields:
        """Where this vendor reports billed tokens: its own ``[usage]`` or its protocol's."""
        return self.usage if self.usage is not None else adapter_for(self.protocol).usage_fields

    def window_for(self, model: str) -> int | None:
        """The context window of ``model`` on this provider, in tokens; ``None`` if unknown."""
        return self.context_windows.get(model, self.context_window)

    @pydantic.model_validator(mode="after")
    def _stored_needs_responses(self) -> ProviderSpec:
        if self.responses_stored and not self.responses:
            raise ValueError("responses_stored = true needs responses = true")
        return self


@dataclass(frozen=True)
class ModelListing:
    """Where the catalog lists a model name: current at ``provider``, or retired there."""

    provider: str
    retired: RetiredModel | None = None
    """The shutdown date and named replacement; ``None``: the provider lists it as current."""


def find_model(
    model: str, catalog: Mapping[str, ProviderSpec] | None = None
) -> tuple[ModelListing, ...]:
    """Every catalog provider that lists ``model`` (exactly as spelt), current or retired, in
    the catalog's order; empty when none does (a self-hosted model, a typo, a newer model)."""
    specs = load_catalog() if catalog is None else catalog
    found: list[ModelListing] = []
    for name, spec in specs.items():
        if model in spec.models:
            found.append(ModelListing(name))
        elif (retired := spec.retired_models.get(model)) is not None:
            found.append(ModelListing(name, retired))
    return tuple(found)


def catalog_dir() -> Path:
    """The folder holding the catalog's TOML files (in the wheel, or beside the package)."""
    packaged = resources.files("llmroute").joinpath("_providers")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "providers"


def format_validation_error(exc: pydantic.ValidationError, *, source: str, prefix: str = "") -> str:
    """Pydantic's errors rewritten for a human: the source, the dotted key and what was wrong."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in (prefix, *err["loc"]) if part != "")
        kind = err["type"]
        if kind == "extra_forbidden":
            what = "unknown key"
        elif kind == "missing":
            what = "required key is missing"
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            what = f"expected {expected}, got {err['input']!r}"
        else:
            what = f"{err['msg']}, got {err['input']!r}" if "input" in err else err["msg"]
        lines.append(f"{source}: {key or '(top level)'}: {what}")
    return "\n".join(lines)


def load_provider_file(path: Path) -> ProviderSpec:
    """Read and validate one catalog file; the provider's name is the file's stem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from None
    return parse_provider(path.stem, data, source=str(path))


def parse_provider(name: str, data: Mapping[str, Any], *, source: str) -> ProviderSpec:
    """Validate one provider description, naming ``source`` and the key at fault on error."""
    if "name" in data and data["name"] != name:
        raise CatalogError(
            f"{source}: name: expected {name!r} (the file's name), got {data['name']!r}"
        )
    try:
        spec = ProviderSpec.model_validate({**data, "name": name})
    except pydantic.ValidationError as exc:
        raise CatalogError(format_validation_error(exc, source=source)) from None
    for model in spec.retired_models:
        if model in spec.models:
            raise CatalogError(
                f"{source}: retired_models.{model}: also in models (a model is current or retired)"
            )
    return spec


@functools.cache
def load_catalog() -> Mapping[str, ProviderSpec]:
    """Every provider of the catalog, by name (read once, then cached; read-only)."""
    folder = catalog_dir()
    specs = {path.stem: load_provider_file(path) for path in sorted(folder.glob("*.toml"))}
    if not specs:
        raise CatalogError(f"{folder}: no provider files (*.toml) found")
    return types.MappingProxyType(specs)  # cached: callers must not be able to change it
