"""llmroute: a drop-in OpenAI client that gets the first token sooner."""

from ._client import AsyncOpenAI
from ._errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    MalformedStreamError,
    NotFoundError,
    OpenAIError,
    PermissionDeniedError,
    RateLimitError,
    StreamInterrupted,
    UnprocessableEntityError,
)
from ._streaming import AsyncStream
from ._types import Timings
from ._version import __version__

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncOpenAI",
    "AsyncStream",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "MalformedStreamError",
    "NotFoundError",
    "OpenAIError",
    "PermissionDeniedError",
    "RateLimitError",
    "StreamInterrupted",
    "Timings",
    "UnprocessableEntityError",
    "__version__",
]
