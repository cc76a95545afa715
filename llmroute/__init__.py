"""llmroute: a drop-in OpenAI client that gets the first token sooner."""

from ._client import AsyncOpenAI
from ._config import Config, ConfigError
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
    StreamInterrupted,
    TargetUnavailable,
    UnprocessableEntityError,
)
from ._streaming import AsyncStream
from ._sync import OpenAI, Stream
from ._types import AttemptReport, RouteReport, Timings
from ._version import __version__
from .routing.policies import (
    FailoverPolicy,
    FastestPolicy,
    HedgePolicy,
    LeastLoadedPolicy,
    PrefixPolicy,
    RacePolicy,
    RoundRobinPolicy,
    WeightedPolicy,
)
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
    "FailoverPolicy",
    "FastestPolicy",
    "FirstTokenTimeout",
    "HedgePolicy",
    "InternalServerError",
    "LeastLoadedPolicy",
    "MalformedStreamError",
    "NotFoundError",
    "OpenAI",
    "OpenAIError",
    "PermissionDeniedError",
    "PrefixPolicy",
    "RacePolicy",
    "RateLimitError",
    "RequestBodyError",
    "RoundRobinPolicy",
    "RouteReport",
    "Stream",
    "StreamInterrupted",
    "TargetSnapshot",
    "TargetUnavailable",
    "Timings",
    "UnprocessableEntityError",
    "WeightedPolicy",
    "__version__",
]
