"""llmroute: a drop-in OpenAI client that gets the first token sooner."""

import warnings
from typing import Any

from ._client import AsyncOpenAI
from ._errors import (
    AllTargetsFailed,
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    FirstTokenTimeout,
    InternalServerError,
    MalformedStreamError,
    NotFoundError,
    OpenAIError,
    PermissionDeniedError,
    RateLimitError,
    RequestBodyError,
    StallTimeout,
    StreamInterrupted,
    TargetUnavailable,
    UnknownModelError,
    UnprocessableEntityError,
)
from ._streaming import AsyncStream
from ._sync import OpenAI, Stream
from ._types import AttemptReport, RouteReport, TierDecision, Timings
from ._version import __version__
from .config import Config, ConfigError
from .routing.stats import TargetSnapshot

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AllTargetsFailed",
    "AsyncOpenAI",
    "AsyncStream",
    "AttemptReport",
    "AuthenticationError",
    "BadRequestError",
    "Config",
    "ConfigError",
    "ConflictError",
    "FirstTokenTimeout",
    "InternalServerError",
    "MalformedStreamError",
    "NotFoundError",
    "OpenAI",
    "OpenAIError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestBodyError",
    "RouteReport",
    "StallTimeout",
    "Stream",
    "StreamInterrupted",
    "TargetSnapshot",
    "TargetUnavailable",
    "TierDecision",
    "Timings",
    "UnknownModelError",
    "UnprocessableEntityError",
    "__version__",
]

_POLICIES = frozenset(
    {
        "FailoverPolicy",
        "FastestPolicy",
        "HedgePolicy",
        "LeastLoadedPolicy",
        "PrefixPolicy",
        "RacePolicy",
        "RoundRobinPolicy",
        "WeightedPolicy",
    }
)


def __getattr__(name: str) -> Any:
    """The policy classes, exported until now though no call took one: still found, with a
    DeprecationWarning, for a release."""
    if name not in _POLICIES:
        raise AttributeError(f"module 'llmroute' has no attribute {name!r}")
    warnings.warn(
        f"llmroute.{name} is no longer exported and will be removed: a route's policy is chosen "
        'in its config (policy = "hedge", "fastest", ...; docs/routing.md); the class itself is '
        f"llmroute.routing.policies.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    from .routing import policies

    return getattr(policies, name)
