"""llmroute's errors: openai's exception tree, plus a few subclasses of it.

    openai.OpenAIError
    ├── RequestBodyError                     a request body JSON cannot encode (also a ValueError)
    ├── UnknownModelError                    a model name is no route: a near miss of one, or the
    │                                        config refuses other names (also a ValueError)
    └── openai.APIError
        ├── openai.APIConnectionError
        │   └── openai.APITimeoutError
        │       ├── FirstTokenTimeout        no first token within a route's deadline
        │       └── StallTimeout             no chunk within a stream's deadline between chunks
        ├── openai.APIStatusError            (one subclass per HTTP status, as in openai)
        ├── MalformedStreamError             a target sent an SSE line that is not valid
        ├── StreamInterrupted                the stream broke after content was yielded
        ├── TargetUnavailable                a target's circuit is open or it cools down after a 429
        └── AllTargetsFailed                 every target of a route failed; keeps each cause,
                                             and is also the openai class of the last one's
                                             meaning (BadRequestError, RateLimitError, ...)

Every error raised by llmroute is, or subclasses, the openai exception of the same meaning, so
``except openai.RateLimitError`` and ``isinstance`` checks in existing code keep working.
Foreign exceptions (httpx, h2, ssl) are translated in one place: :func:`map_transport_errors`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import h2.exceptions
import httpx
from openai import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    OpenAIError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AllTargetsFailed",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "FirstTokenTimeout",
    "InternalServerError",
    "MalformedStreamError",
    "NotFoundError",
    "OpenAIError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestBodyError",
    "StallTimeout",
    "StreamInterrupted",
    "TargetUnavailable",
    "UnknownModelError",
    "UnprocessableEntityError",
    "explained",
    "make_status_error",
    "map_transport_errors",
    "stream_ended",
    "stream_ended_with_text",
]

_QUOTE_LIMIT = 200


def quote(text: str, limit: int = _QUOTE_LIMIT) -> str:
    """Quote a piece of wire text for an error message, truncated to ``limit`` characters."""
    if len(text) > limit:
        return repr(text[:limit]) + f" ... ({len(text)} characters)"
    return repr(text)


class MalformedStreamError(APIError, ValueError):
    """Raised when a target sends a stream event that cannot be decoded (also a ``ValueError``,
    as openai raises ``json.JSONDecodeError`` there)."""

    def __init__(self, message: str, request: httpx.Request, *, target: str, line: str) -> None:
        text = f"{message} from target {target!r}: {quote(line)}"
        super().__init__(text, request, body=None)  # type: ignore[arg-type]
        self.target = target
        self.line = line


class RequestBodyError(OpenAIError, ValueError):
    """Raised before sending when a request body cannot be encoded as JSON (nested too deeply)."""


class UnknownModelError(OpenAIError, ValueError):
    """Raised before sending when a model name is not a route and must not go to the default
    provider: it is a near miss of a route (``suggestion``), or the config refuses such names.
    ``routes`` are the route names there were."""

    def __init__(self, message: str, *, model: str, routes: list[str], suggestion: str | None):
        super().__init__(message)
        self.model = model
        self.routes = routes
        self.suggestion = suggestion


class StreamInterrupted(APIError):
    """Raised when a stream breaks after content was yielded; ``partial_text`` keeps it."""

    def __init__(
        self,
        message: str,
        request: httpx.Request,
        *,
        partial_text: str,
        cause: BaseException | None,
    ) -> None:
        super().__init__(message, request, body=None)  # type: ignore[arg-type]
        self.partial_text = partial_text
        self.cause = cause


_UNFINISHED = "(no [DONE] and no finish_reason)"


def stream_ended(
    request: httpx.Request, *, before_first_token: str | None = None
) -> APIConnectionError:
    """The error of a stream whose body ended before its answer was whole (neither ``[DONE]``
    nor every choice's ``finish_reason``): an ``APIConnectionError``, as a connection lost
    (another target may answer, or continue it). ``before_first_token``: the target whose
    stream ended before a first token."""
    if before_first_token is not None:
        what = f"The stream of target {before_first_token!r} ended before its first token"
    else:
        what = "The stream ended before the answer was complete"
    message = f"{what} {_UNFINISHED}"
    return APIConnectionError(message=message, request=request)  # type: ignore[arg-type]


def stream_ended_with_text(request: httpx.Request, partial_text: str) -> StreamInterrupted:
    """:func:`stream_ended` for a stream whose caller got its text so far (a stream llmroute
    does not route, hence does not continue): :class:`StreamInterrupted` with that text."""
    return StreamInterrupted(
        f"{stream_ended(request).message}; the text so far is in .partial_text.",
        request,
        partial_text=partial_text,
        cause=None,
    )


class FirstTokenTimeout(APITimeoutError):
    """Raised when a target sends no first token within its first-token deadline (live, at
    most the route's ``first_token_timeout``)."""

    def __init__(self, request: httpx.Request, *, target: str, seconds: float) -> None:
        super().__init__(request=request)  # type: ignore[arg-type]
        self.message = f"No first token from target {target!r} within {seconds:g} s"
        self.args = (self.message,)
        self.target = target


class StallTimeout(APITimeoutError):
    """Raised when a stream sends nothing for longer than its deadline between chunks."""

    def __init__(self, request: httpx.Request, *, target: str, seconds: float) -> None:
        super().__init__(request=request)  # type: ignore[arg-type]
        self.message = f"No chunk from target {target!r} for {seconds:.3g} s (a stall)"
        self.args = (self.message,)
        self.target = target


class TargetUnavailable(APIError):
    """Raised for an attempt on a target whose circuit is open or that cools down after a 429."""

    def __init__(
        self,
        message: str,
        request: httpx.Request,
        *,
        target: str,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message, request, body=None)  # type: ignore[arg-type]
        self.target = target
        self.cause = cause
        """The failure that left the target out, where it says what is wrong (a 401)."""


class AllTargetsFailed(APIError):
    """Raised when every target of a route failed before its first token.

    ``errors`` maps each target (``"provider:model"``) to the exception it last failed with;
    the message lists them all. The exception keeps the meaning of the last target's failure:
    when that was a status error it is also an instance of that openai class (a 400 from the
    only target is an ``openai.BadRequestError`` with its ``status_code``, ``body`` and
    ``response``), a timeout an ``openai.APITimeoutError``, a connection error an
    ``openai.APIConnectionError``; ``last`` is that exception.
    """

    def __new__(
        cls,
        route: str,
        errors: dict[str, BaseException],
        request: httpx.Request,
        *,
        report: Any = None,
        last: BaseException | None = None,
    ) -> AllTargetsFailed:
        made: type[AllTargetsFailed] = cls
        if cls is AllTargetsFailed:
            meaning = _meaning(last if last is not None else _last_cause(errors))
            if meaning is not None:
                made = _typed_failure(meaning)
        return APIError.__new__(made)

    def __init__(
        self,
        route: str,
        errors: dict[str, BaseException],
        request: httpx.Request,
        *,
        report: Any = None,
        last: BaseException | None = None,
    ) -> None:
        causes = "; ".join(f"{target}: {describe_error(exc)}" for target, exc in errors.items())
        count = f"all {len(errors)} targets" if len(errors) != 1 else "its only target"
        message = (
            f"Route {route!r}: {count} failed: {causes}"
            if errors
            else (f"Route {route!r}: no target is available")
        )
        last = last if last is not None else _last_cause(errors)
        if isinstance(self, APIStatusError) and isinstance(last, APIStatusError):
            APIStatusError.__init__(self, message, response=last.response, body=last.body)
        else:
            APIError.__init__(self, message, request, body=None)  # type: ignore[arg-type]
        self.route = route
        self.errors = dict(errors)
        self.report = report
        """The :class:`~llmroute.RouteReport` of the request: every attempt, in order."""
        self.last = last
        """The failure whose meaning the exception keeps (the last target's), or ``None``."""


_MEANINGS: tuple[type[APIError], ...] = (
    BadRequestError,
    AuthenticationError,
    PermissionDeniedError,
    NotFoundError,
    ConflictError,
    UnprocessableEntityError,
    RateLimitError,
    InternalServerError,
    APIStatusError,
    APITimeoutError,
    APIConnectionError,
)
_TYPED: dict[type[APIError], type[AllTargetsFailed]] = {}


def _last_cause(errors: dict[str, BaseException]) -> BaseException | None:
    """The last failure that says something about a target (not that it was skipped)."""
    for exc in reversed(list(errors.values())):
        if not isinstance(exc, TargetUnavailable):
            return exc
        if exc.cause is not None:  # left out as misconfigured: that answer's meaning
            return exc.cause
    return None


def _meaning(exc: BaseException | None) -> type[APIError] | None:
    """The openai class whose meaning ``exc`` has (its own, or the nearest openai base)."""
    if exc is None:
        return None
    for cls in _MEANINGS:
        if isinstance(exc, cls):
            return cls
    return None


def _typed_failure(meaning: type[APIError]) -> type[AllTargetsFailed]:
    """``AllTargetsFailed`` that is also ``meaning`` (made once per class)."""
    typed = _TYPED.get(meaning)
    if typed is None:
        typed = type(
            "AllTargetsFailed",  # the name users and traces know; also a ``meaning``
            (AllTargetsFailed, meaning),
            {"__module__": __name__, "__doc__": AllTargetsFailed.__doc__},
        )
        _TYPED[meaning] = typed
    return typed


def describe_error(exc: BaseException) -> str:
    """One line naming an exception's class and message (status code first for HTTP errors)."""
    text = getattr(exc, "message", None) or str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def make_status_error(response: httpx.Response, raw_body: bytes) -> APIStatusError:
    """Build the openai status error for an HTTP error response, exactly as openai does.

    A JSON body gives its ``error`` member as ``body``; anything else (an HTML page from a proxy)
    is kept as text.
    """
    text = raw_body.decode("utf-8", errors="replace").strip()
    body: Any = text
    err_msg = f"Error code: {response.status_code}"
    try:
        body = json.loads(text)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str) and message:
            err_msg += f" - {message}"
    data = body.get("error", body) if isinstance(body, dict) else body
    if response.status_code >= 500:
        cls: type[APIStatusError] = InternalServerError
    else:
        cls = _STATUS_ERRORS.get(response.status_code, APIStatusError)
    return cls(err_msg, response=response, body=data)  # type: ignore[arg-type]


def _transport_exceptions() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    timeouts: list[type[Exception]] = [httpx.TimeoutException]
    # h2's errors only escape the transport by mistake; they still mean a broken connection.
    transport: list[type[Exception]] = [httpx.TransportError, h2.exceptions.H2Error]
    try:  # openai >= 3 hands out httpx2 clients; a user may pass one as http_client
        import httpx2

        timeouts.append(httpx2.TimeoutException)
        transport.append(httpx2.TransportError)
    except ImportError:  # pragma: no cover - openai < 3
        pass
    return tuple(timeouts), tuple(transport)


_TIMEOUTS, _TRANSPORT_ERRORS = _transport_exceptions()


@contextlib.contextmanager
def map_transport_errors(request: httpx.Request) -> Iterator[None]:
    """Translate httpx's (and httpx2's) transport exceptions into openai's connection errors,
    whose message names the address and, for a certificate no CA here trusts, the fix."""
    try:
        yield
    except _TIMEOUTS as exc:
        raise APITimeoutError(request=request) from exc  # type: ignore[arg-type]
    except _TRANSPORT_ERRORS as exc:
        message = _connection_message(exc, request)
        raise APIConnectionError(message=message, request=request) from exc  # type: ignore[arg-type]


def explained(exc: APIConnectionError) -> APIConnectionError | None:
    """openai's bare ``Connection error.`` (its own code's, for a call llmroute does not route;
    it keeps the transport's exception as the cause) as :func:`map_transport_errors` words it,
    for a connection that failed or a certificate that did not verify; ``None`` for anything
    else (a timeout, a message of its own, a request httpx refused to send)."""
    cause = exc.__cause__
    if type(exc) is not APIConnectionError or not isinstance(cause, _TRANSPORT_ERRORS):
        return None
    if exc.message != "Connection error.":
        return None
    if "Connect" not in type(cause).__name__ and "CERTIFICATE_VERIFY_FAILED" not in str(cause):
        return None  # e.g. a key httpx refuses as a header: openai's own words, as openai says it
    message = _connection_message(cause, exc.request)
    return APIConnectionError(message=message, request=exc.request)


UNTRUSTED_CERTIFICATE = (
    "the server's certificate is not signed by a CA this client trusts: give that CA's file "
    'as verify = "/path/to/ca.pem" in the provider\'s table (AsyncOpenAI(verify=...) in code, '
    "--ca FILE on llmroute's commands, or SSL_CERT_FILE for the whole process)"
)
"""The fix for a certificate that did not verify: a private CA (a lab server, the simulator)."""

_UNTRUSTED = (
    "unable to get local issuer certificate",
    "self-signed certificate",
    "self signed certificate",
    "unable to verify the first certificate",
)


def _connection_message(exc: BaseException, request: Any) -> str:
    detail = " ".join(str(exc).split()) or type(exc).__name__
    url: Any = getattr(request, "url", None)
    host = getattr(url, "host", None)
    if host:
        port = url.port or (443 if url.scheme == "https" else 80)
        address = f"{host}:{port}"
        if address not in detail:
            connect = "Connect" in type(exc).__name__
            detail = f"cannot connect to {address}: {detail}" if connect else f"{address}: {detail}"
    if "CERTIFICATE_VERIFY_FAILED" in detail and any(u in detail for u in _UNTRUSTED):
        detail = f"{detail}; {UNTRUSTED_CERTIFICATE}"
    return f"Connection error: {detail}"
