"""``AsyncOpenAI``: openai's own async client, with llmroute under it and on top of it.

Under it: every request openai's machinery makes goes over llmroute's transport (persistent
HTTP/2, stream resets on early close, per-stream deadlines). On top of it: one seam,
:meth:`AsyncOpenAI.request`, where a call whose model name is a route (chat completions,
Responses, completions, embeddings) leaves openai's path for llmroute's routing, and where every
chat call gets llmroute's fast stream decoding, timings, metrics and cache. Everything else
(every resource, helper, argument and response class) is openai's, inherited.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import ssl
import time
import types
import weakref
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast, get_origin, overload

import anyio
import httpx
import openai
from openai._compat import cached_property
from openai._constants import RAW_RESPONSE_HEADER
from openai._legacy_response import LegacyAPIResponse
from openai._models import FinalRequestOptions
from openai._response import APIResponse, AsyncAPIResponse, BaseAPIResponse, extract_response_type
from openai.resources.chat import AsyncChat, AsyncCompletions
from openai.resources.responses import AsyncResponses

from ._call import RECEIVED, Call, Posted, Served, attach
from ._call_cache import LOOKED_UP
from ._dispatch import Dispatch, missing_key_error
from ._streaming import CALL_STARTED, AsyncStream
from ._types import Timings
from ._upstream import OFF_LOOP_BYTES, body_errors, check_base_url, to_timeout
from .cache import Flight
from .config import Config, load_config
from .metrics import ClientMetrics
from .routing.engine import Router
from .routing.probe import PROBE_TIMEOUT
from .routing.stats import TargetSnapshot
from .transport import response_timings

__all__ = ["DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT", "AsyncOpenAI"]

log = logging.getLogger("llmroute")

DEFAULT_TIMEOUT = httpx.Timeout(timeout=600.0, connect=5.0)  # openai's
DEFAULT_MAX_RETRIES = 2
_DEFAULT_BASE_URL = "https://api.openai.com/v1"
_NOT_GIVEN: Any = openai.NOT_GIVEN
NO_KEY = "llmroute-routes-only"
"""The API key of a routed client that has none: openai wants one; it is never sent (a call
for a model name that is not a route raises before anything is sent)."""
SIGNERS = ("_api_key_provider", "workload_identity", "_provider_runtime")
"""openai's ways of authenticating a request as it is sent (an API key provider called per
request, a workload identity, a cloud provider's signing): until then ``api_key`` is empty or
a placeholder that every tenant shares."""


def signs_late(client: object) -> bool:
    """Whether openai authenticates ``client``'s requests as it sends each (see ``SIGNERS``)."""
    return any(getattr(client, name, None) is not None for name in SIGNERS)


_EXCHANGE: contextvars.ContextVar[list[Timings] | None] = contextvars.ContextVar(
    "llmroute_exchange", default=None
)
"""Where the timings of a direct call's response are noted (nothing that holds the response)."""


def warn_if_unverified(verify: object) -> None:
    if verify is False or (
        isinstance(verify, ssl.SSLContext) and verify.verify_mode == ssl.CERT_NONE
    ):
        log.warning(
            "TLS certificate verification is off (verify=False): anyone on the network "
            "path can read the requests, their API keys and the answers"
        )


def prepare(
    kwargs: dict[str, Any], config: object, verify: object, shared: Dispatch | None
) -> tuple[Dispatch, bool]:
    """The shared routing state for a new client (``shared``: a copy's), with ``kwargs``
    completed from the config's default provider; and whether the client has no API key."""
    if shared is None:
        retries = kwargs.get("max_retries", DEFAULT_MAX_RETRIES)
        warn_if_unverified(verify)
        shared = Dispatch(
            load_config(cast(Any, config)),
            verify=verify,
            max_retries=retries if isinstance(retries, int) and retries >= 0 else 2,
        )
    default = shared.default_provider
    # openai refuses an api_key beside these (they authenticate each request themselves).
    signed = any(kwargs.get(name) is not None for name in ("workload_identity", "provider"))
    if default is not None:
        if kwargs.get("base_url") is None:
            kwargs["base_url"] = str(default.base_url)
        if kwargs.get("api_key") is None and not signed:
            kwargs["api_key"] = default.api_key or NO_KEY
    missing = False
    if (
        kwargs.get("api_key") is None
        and not signed
        and shared.configured
        and not os.environ.get("OPENAI_API_KEY")
    ):
        kwargs["api_key"] = NO_KEY  # only routes are usable; a call for any other model says why
        missing = True
    return shared, missing


def own_state(shared: Any, config: Any, verify: Any) -> dict[str, Any]:
    """The constructor arguments that give a copy its routing state: ``shared`` (its
    original's) unless a ``config`` or ``verify`` is given, else a new state's ``config`` and
    ``verify``, each the given one or the original's."""
    if isinstance(config, openai.NotGiven) and isinstance(verify, openai.NotGiven):
        return {"_llmroute": shared}
    dispatch: Dispatch = getattr(shared, "dispatch", shared)  # the sync client's runtime holds it
    return {
        "config": dispatch.config if isinstance(config, openai.NotGiven) else config,
        "verify": dispatch.verify if isinstance(verify, openai.NotGiven) else verify,
    }


def base_url_of(kwargs: Mapping[str, Any]) -> httpx.URL:
    base = kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL") or _DEFAULT_BASE_URL
    return check_base_url(base)


def is_raw(options: Any) -> bool:
    headers = options.headers
    return isinstance(headers, Mapping) and bool(headers.get(RAW_RESPONSE_HEADER))


def is_legacy_raw(options: Any) -> bool:
    """The call came through ``with_raw_response`` (openai's ``LegacyAPIResponse``)."""
    headers = options.headers
    return isinstance(headers, Mapping) and headers.get(RAW_RESPONSE_HEADER) == "true"


def post_parse(result: Any, options: Any) -> Any:
    """``result`` through the call's ``post_parser`` (``parse()``), keeping llmroute's records."""
    parser = options.post_parser
    if result is None or isinstance(result, openai.AsyncStream | openai.Stream):
        return result
    if not callable(parser):
        return result
    parsed = parser(result)
    if parsed is not result:
        for name in ("timings", "route", "_request_id"):
            if name in result.__dict__ or hasattr(result, name):
                object.__setattr__(parsed, name, getattr(result, name, None))
    return parsed


def wrap_raw(
    client: Any,
    outcome: Served,
    result: Any,
    cast_to: Any,
    options: Any,
    stream: bool,
    stream_cls: Any,
) -> Any:
    """``result`` as openai returns it for this call: itself, or inside the raw or streamed
    response class the call asked for (``with_raw_response`` / ``with_streaming_response``),
    whose ``parse()`` gives it."""
    headers = options.headers if isinstance(options.headers, Mapping) else {}
    common = {
        "raw": outcome.response,
        "client": client,
        "stream": stream,
        "stream_cls": stream_cls,
        "options": options,
        "retries_taken": outcome.retries,
    }
    if headers.get(RAW_RESPONSE_HEADER) == "true":
        legacy = LegacyAPIResponse(cast_to=cast_to, **common)
        legacy._parsed_by_type[cast_to] = result
        return legacy
    origin = get_origin(cast_to) or cast_to
    if inspect.isclass(origin) and issubclass(origin, BaseAPIResponse):
        response = cast_to(cast_to=extract_response_type(cast_to), **common)
        response._parsed_by_type[response._cast_to] = result
        return response
    if headers.get(RAW_RESPONSE_HEADER):  # with_streaming_response: the client's own class
        kind = AsyncAPIResponse if isinstance(client, openai.AsyncOpenAI) else APIResponse
        response = kind(cast_to=cast_to, **common)
        response._parsed_by_type[cast_to] = result
        return response
    return result


def records(result: Any, response: httpx.Response) -> None:
    """Give a result parsed by openai from a routed response its route report and timings."""
    for name, attr in (("route", "_llmroute_route"), ("timings", "_llmroute_timings")):
        value = getattr(response, attr, None)
        if value is not None and result is not None:
            try:
                object.__setattr__(result, name, value)
            except (AttributeError, TypeError):
                pass


# -- a cache hit before openai's machinery ------------------------------------------------------

_EXTRAS = ("extra_headers", "extra_query", "extra_body", "timeout")
_CHAT_PARAMS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {
    "self",
    *_EXTRAS,
}
"""The body parameters of the installed openai's ``chat.completions.create``."""
_ABSENT = (openai.NotGiven, openai.Omit)
_JSON_SCALARS = (str, int, float, bool, type(None))
_MAX_DEPTH = 32
MISS: Any = object()
NOT_ROUTED: Any = object()
"""What :meth:`AsyncOpenAI._routed_call` returns for a model that is not a route (kept for
callers of that private method; :meth:`AsyncOpenAI.route_json` returns ``None``)."""


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is JSON as it is: dicts with string keys, lists and scalars (the
    exact types; openai's params transform leaves such a value unchanged)."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return True
    if depth >= _MAX_DEPTH:
        return False
    if kind is list:
        return all(_plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


def plain_body(
    kwargs: Mapping[str, Any],
    params: frozenset[str] = _CHAT_PARAMS,
    required: tuple[str, ...] = ("model", "messages"),
) -> dict[str, Any] | None:
    """The request body openai's ``chat.completions.create(**kwargs)`` (or another ``create``
    whose body ``params`` are given) would send, when it can be known without openai's
    machinery: every argument a body parameter of the installed openai (no ``extra_*`` or
    ``timeout``), every value plain JSON, the ``required`` ones given. ``None``: only
    openai's machinery knows (or raises)."""
    body: dict[str, Any] = {}
    for name, value in kwargs.items():
        if isinstance(value, _ABSENT):
            continue
        if name not in params:
            if name in _EXTRAS and value is None:
                continue
            return None
        if not _plain(value):
            return None
        body[name] = value
    if any(name not in body for name in required):
        return None
    return body


_ResponseT = TypeVar("_ResponseT")
_AsyncStreamT = TypeVar("_AsyncStreamT", bound=openai.AsyncStream[Any])

_OPENAI_CODE = os.path.dirname(openai.__file__) + os.sep


def _openais_own(create: object) -> bool:
    """Whether ``create`` is openai's own code, not a wrapper an instrumentation (a tracer, an
    error reporter) put on openai's class: such a wrapper must see every call, hits too."""
    code = getattr(create, "__code__", None)
    return (
        type(create) is types.FunctionType
        and code is not None
        and (code.co_filename.startswith(_OPENAI_CODE))
    )


class EarlyCheck:
    """openai's ``create`` of one resource, for the early cache check: its endpoint, its body
    parameters, and whether it is openai's own code now (not wrapped by an instrumentation)."""

    def __init__(self, owner: type, path: str, required: tuple[str, ...]) -> None:
        self.owner = owner
        self.original = owner.__dict__["create"]
        self.own = _openais_own(self.original)
        self.path = path
        self.params = frozenset(inspect.signature(self.original).parameters) - {"self", *_EXTRAS}
        self.required = required

    def body(self, cache: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """The body to look up (:func:`plain_body`), or ``None``: openai's ``create`` runs."""
        if (
            self.own
            and not args
            and cache is not None
            and self.owner.__dict__.get("create") is self.original  # not wrapped since
        ):
            return plain_body(kwargs, self.params, self.required)
        return None


_CHAT_EARLY = EarlyCheck(AsyncCompletions, "/chat/completions", ("model", "messages"))
_RESPONSES_EARLY = EarlyCheck(AsyncResponses, "/responses", ("model",))


async def _create_early(
    resource: Any, early: EarlyCheck, create: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``create(*args, **kwargs)``, asking the client's cache first when the body is known
    without openai's machinery (see :class:`_AsyncCompletions`)."""
    client = cast(AsyncOpenAI, resource._client)
    body = early.body(client._llmroute.cache, args, kwargs)
    if body is None:
        return await create(*args, **kwargs)
    found, key = await client._cache_first(early.path, body)
    if found is not MISS:
        return found
    token = LOOKED_UP.set(key)
    try:
        return await create(**kwargs)
    finally:
        LOOKED_UP.reset(token)


class _AsyncCompletions(AsyncCompletions):
    """openai's ``chat.completions``, whose ``create`` asks the cache first.

    openai's ``create`` transforms its arguments into the request body before the seam sees
    the call: for a one-message call that is most of a cache hit's time. When the body is
    known without it (:func:`plain_body`), the cache answers here; otherwise, and on a miss,
    openai's ``create`` runs as it is. So does every call while something (a tracer, an error
    reporter) has wrapped openai's ``create``: the wrapper sees hits as it did before."""

    async def create(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return await _create_early(self, _CHAT_EARLY, super().create, args, kwargs)


class _AsyncResponses(AsyncResponses):
    """openai's ``responses``, whose ``create`` asks the cache first, as chat's does."""

    async def create(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return await _create_early(self, _RESPONSES_EARLY, super().create, args, kwargs)


# Introspection (signature, type hints, overloads, docs) sees openai's own create():
# typing.get_overloads finds a function's overloads by its module and qualified name.
functools.update_wrapper(_AsyncCompletions.create, AsyncCompletions.create)
functools.update_wrapper(_AsyncResponses.create, AsyncResponses.create)


class _AsyncChat(AsyncChat):
    @cached_property
    def completions(self) -> AsyncCompletions:
        return _AsyncCompletions(self._client)


def _noted(call: Call, body_bytes: int | None, prompt_tokens: int | None) -> None:
    """What a server knew of the call's body (``route_json``'s ``body_bytes`` and
    ``prompt_tokens``, or a :class:`~._call.Received`): a large body is encoded off the event
    loop, and the prompt's count spares the routing another pass over it."""
    call.off_loop = body_bytes is not None and body_bytes >= OFF_LOOP_BYTES
    call.prompt_tokens = prompt_tokens


class AsyncOpenAI(openai.AsyncOpenAI):
    """openai's ``AsyncOpenAI`` with llmroute's transport and routing.

    Takes every constructor argument of the installed openai version, and two of its own:
    ``config`` (providers, routes and cache: a TOML path, a dict or a :class:`Config`) and
    ``verify`` (TLS trust of llmroute's transport: ``True``, a CA file path, an
    ``ssl.SSLContext`` or ``False``). A given ``http_client`` is used as it is (openai's
    requests then go over its transport; routed calls still use llmroute's).
    """

    _llmroute: Dispatch

    def __init__(
        self,
        *args: Any,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        verify: ssl.SSLContext | str | bool = True,
        **kwargs: Any,
    ) -> None:
        shared: Dispatch | None = kwargs.pop("_llmroute", None)  # a copy's: its original's state
        owner = shared is None
        dispatch, missing = prepare(kwargs, config, verify, shared)
        given_base_url = kwargs.get("base_url") is not None
        http = kwargs.get("http_client")
        if http is None or getattr(http, "_llmroute_of", dispatch) is not dispatch:
            # (another routing state's client: a copy given its own config builds its own)
            kwargs["http_client"] = dispatch.http_client(base_url_of(kwargs), DEFAULT_TIMEOUT)
        super().__init__(*args, **kwargs)
        if dispatch.trial_http is None and not getattr(self._client, "_llmroute_owned", False):
            dispatch.trial_http = self._client  # the application's client carries trials too
        self._llmroute = dispatch
        self._llmroute_owner = owner
        if owner:  # dropped without close(): its background trials end (none holds the client)
            weakref.finalize(self, dispatch.trials.abandon)
        self._missing_key = missing or self.api_key == NO_KEY
        # A routed client warms its base URL only when it is meant to be used.
        self._warm_default = (
            not dispatch.configured or given_base_url or dispatch.default_provider is not None
        )

    # -- copies share the routing state --------------------------------------------------------

    def copy(
        self,
        *args: Any,
        config: Config
        | Mapping[str, Any]
        | str
        | os.PathLike[str]
        | openai.NotGiven
        | None = _NOT_GIVEN,
        verify: ssl.SSLContext | str | bool | openai.NotGiven = _NOT_GIVEN,
        _extra_kwargs: Mapping[str, Any] = {},
        **kwargs: Any,
    ) -> Any:
        """openai's ``copy``/``with_options``, which also take llmroute's ``config`` and
        ``verify``. Without them the copy shares routes, stats, cache and connections with
        this client (closing it leaves them open); with either, it gets a routing state of its
        own, built from the given ``config`` (or this client's) and ``verify`` (or this
        client's), and closing it closes that state."""
        extra = {**_extra_kwargs, **own_state(self._llmroute, config, verify)}
        return super().copy(*args, _extra_kwargs=extra, **kwargs)

    with_options = copy  # type: ignore[assignment]

    @cached_property
    def chat(self) -> AsyncChat:
        return _AsyncChat(self)

    @cached_property
    def responses(self) -> AsyncResponses:
        return _AsyncResponses(self)

    # -- the seam ------------------------------------------------------------------------------

    # openai's overloads of request(), declared again so that type checkers and
    # typing.get_overloads see them on the seam too.
    @overload
    async def request(
        self,
        cast_to: type[_ResponseT],
        options: FinalRequestOptions,
        *,
        stream: Literal[False] = False,
    ) -> _ResponseT: ...

    @overload
    async def request(
        self,
        cast_to: type[_ResponseT],
        options: FinalRequestOptions,
        *,
        stream: Literal[True],
        stream_cls: type[_AsyncStreamT],
    ) -> _AsyncStreamT: ...

    @overload
    async def request(
        self,
        cast_to: type[_ResponseT],
        options: FinalRequestOptions,
        *,
        stream: bool,
        stream_cls: type[_AsyncStreamT] | None = None,
    ) -> _ResponseT | _AsyncStreamT: ...

    async def request(
        self,
        cast_to: Any,
        options: Any,
        *,
        stream: bool = False,
        stream_cls: Any = None,
    ) -> Any:
        with body_errors():
            return await self._serve(cast_to, options, stream, stream_cls)

    async def _serve(self, cast_to: Any, options: Any, stream: bool, stream_cls: Any) -> Any:
        dispatch = self._llmroute
        received = RECEIVED.get()
        if received is not None and not received.of(options.json_data):
            received = None  # a server's note of another body
        call = dispatch.classify(options, timeout=self._timeout_of(options))
        if call is not None and received is not None:
            _noted(call, received.size, received.prompt_tokens)
        if call is None or call.route is None:
            if self._missing_key:
                model = options.json_data.get("model") if call is not None else None
                raise missing_key_error(model, dispatch.router.routes)
        if call is None:
            return await super().request(cast_to, options, stream=stream, stream_cls=stream_cls)
        self._describe(call)
        if call.route is None:
            if is_raw(options):
                chunk_cls = AsyncStream[Any] if stream else stream_cls
                return await super().request(cast_to, options, stream=stream, stream_cls=chunk_cls)
            outcome = await dispatch.answer(call, lambda: self._direct(cast_to, options, stream))
            result = outcome.result if isinstance(outcome, Served) else outcome
            return post_parse(result, options)
        cast_to = self._maybe_override_cast_to(cast_to, options)
        if call.kind in ("chat", "responses"):
            outcome = await dispatch.answer(call, _unreachable)
            result = outcome.result if stream else post_parse(outcome.result, options)
            return wrap_raw(self, outcome, result, cast_to, options, stream, stream_cls)
        outcome = await dispatch.other(call)
        result = await self._process_response(
            cast_to=cast_to,
            options=options,
            response=cast(Any, outcome.response),
            stream=stream,
            stream_cls=stream_cls,
            retries_taken=outcome.retries,
        )
        records(result, outcome.response)
        if is_legacy_raw(options):  # openai decides that by the upstream request's headers
            return wrap_raw(self, outcome, result, cast_to, options, stream, stream_cls)
        return result

    async def _cache_first(
        self, path: str, body: dict[str, Any]
    ) -> tuple[Any, tuple[str, Flight | None] | None]:
        """A call's cached answer, as :meth:`request` would return it, before openai's
        machinery builds the request; ``MISS`` (with the key looked up, if any) when the
        call must go the usual way."""
        options = Posted(path, body)
        with body_errors():
            dispatch = self._llmroute
            call = dispatch.classify(options, timeout=self._timeout_of(options))
            if call is None or (call.route is None and self._missing_key):
                return MISS, None
            self._describe(call)
            outcome, key = await dispatch.from_cache(call)
        if outcome is None:
            return MISS, key
        return post_parse(outcome.result, options), key

    async def route_json(
        self,
        path: str,
        body: dict[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | openai.NotGiven | None = _NOT_GIVEN,
        body_bytes: int | None = None,
        prompt_tokens: int | None = None,
    ) -> Any:
        """Route a chat or Responses call given as its JSON body, as the same call through
        ``chat.completions.create(**body)`` or ``responses.create(**body)`` is routed (tiers,
        cache, policy, hedges, failover, continuation), without openai's request machinery.

        For a server that already holds a checked JSON body (llmroute's gateway hands every
        call on a route here). ``path`` is ``"/chat/completions"`` or ``"/responses"``;
        ``body`` goes on as it is (openai's argument checks do not run: check it first);
        ``headers`` are the call's extra headers (``x-llmroute-*``, ``traceparent``);
        ``timeout`` the upstream timeouts (the client's own when not given); ``body_bytes``
        the body's size as received, when known: from 64 KiB up (``OFF_LOOP_BYTES``) each
        attempt's body is encoded in a worker thread, not on the event loop; ``prompt_tokens``
        the prompt's tokens as :func:`llmroute.routing.estimate_request` counts them, when the
        caller counted them already (the routing sizes the request by it, without another pass
        over the body).

        Returns what ``create`` would: an :class:`llmroute.AsyncStream` for a streamed call,
        else openai's ``ChatCompletion`` or ``Response``, each with ``.route``; ``None`` when
        ``body["model"]`` is not a route (send that call through openai's methods). Raises
        openai's and llmroute's errors as ``create`` does."""
        dispatch = self._llmroute
        call = dispatch.classify(Posted(path, body, headers), timeout=self._timeout_given(timeout))
        if call is None or call.route is None:
            return None
        _noted(call, body_bytes, prompt_tokens)
        self._describe(call)
        with body_errors():
            outcome = await dispatch.answer(call, _unreachable)
        return outcome.result if isinstance(outcome, Served) else outcome

    async def _routed_call(
        self, url: str, body: dict[str, Any], headers: Mapping[str, str], timeout: httpx.Timeout
    ) -> Any:
        """:meth:`route_json`, with ``NOT_ROUTED`` for a model that is not a route."""
        result = await self.route_json(url, body, headers=headers, timeout=timeout)
        return NOT_ROUTED if result is None else result

    def _timeout_of(self, options: Any) -> httpx.Timeout:
        return self._timeout_given(options.timeout)

    def _timeout_given(self, timeout: object) -> httpx.Timeout:
        if not isinstance(timeout, type(_NOT_GIVEN)):
            return to_timeout(timeout)
        own = self.timeout  # converted once (openai 3's is an httpx2 Timeout)
        memo = self.__dict__.get("_llmroute_timeout")
        if memo is None or memo[0] is not own:
            memo = self.__dict__["_llmroute_timeout"] = (own, to_timeout(own))
        return memo[1]

    def _describe(self, call: Call) -> None:
        call.client_headers = {k: v for k, v in self._custom_headers.items() if isinstance(v, str)}
        call.base_url = str(self.base_url)
        if not getattr(self._client, "_llmroute_owned", False):
            call.http = self._client  # the application's own client carries routed calls too
        if call.route is None:
            sent: dict[str, str] = {}
            auth = self.auth_headers
            sent.update({k: v for k, v in auth.items() if isinstance(v, str)})
            if self.organization:
                sent["OpenAI-Organization"] = self.organization
            if self.project:
                sent["OpenAI-Project"] = self.project
            sent.update(call.client_headers)
            call.sent_headers = sent
            call.signed_late = signs_late(self)

    async def _direct(self, cast_to: Any, options: Any, stream: bool) -> Any:
        """A chat call for a model name that is not a route: openai's machinery sends it to
        the client's base URL; llmroute decodes the stream and measures it."""
        plain = options.model_copy()
        plain.post_parser = _NOT_GIVEN
        started = time.monotonic()
        exchange: list[Timings] = []
        token = CALL_STARTED.set(started)
        noted = _EXCHANGE.set(exchange)
        try:
            result = await super().request(
                cast_to, plain, stream=stream, stream_cls=AsyncStream[Any] if stream else None
            )
        finally:
            CALL_STARTED.reset(token)
            _EXCHANGE.reset(noted)
        if isinstance(result, AsyncStream):
            if exchange:
                result.timings.retries = exchange[-1].retries
            result._retry = lambda done, exc: self._retry_stream(cast_to, plain, done, exc)
        elif result is not None and not isinstance(result, openai.AsyncStream):
            attach(result, exchange[-1] if exchange else Timings(started_at=started), None, started)
        return result

    async def _process_response(self, **kwargs: Any) -> Any:  # type: ignore[override]
        exchange = _EXCHANGE.get()
        started = CALL_STARTED.get()
        if exchange is not None:
            timings = response_timings(kwargs.get("response"), started)
            timings.retries = kwargs.get("retries_taken", 0)
            exchange.append(timings)
        return await super()._process_response(**kwargs)

    async def _retry_stream(
        self, cast_to: Any, options: Any, retries_done: int, error: Exception
    ) -> tuple[httpx.Response, Timings] | None:
        """Send a direct stream's call again after it failed before its first token (openai's
        backoff, within the call's ``max_retries``); ``None`` when none is left."""
        max_retries = options.get_max_retries(self.max_retries)
        if retries_done >= max_retries:
            return None
        remaining = max_retries - retries_done
        delay = self._calculate_retry_timeout(remaining, options, None)
        log.info(
            "Retrying request to %s in %f seconds (%s before the first token)",
            options.url,
            delay,
            type(error).__name__,
        )
        await anyio.sleep(delay)
        again = options.model_copy()
        again.max_retries = remaining - 1
        fresh = await self._direct(cast_to, again, True)
        fresh.timings.retries = retries_done + 1
        return fresh.response, fresh.timings

    # -- llmroute's own methods ----------------------------------------------------------------

    async def warmup(self, *, probe: bool = False, probe_timeout: float = PROBE_TIMEOUT) -> None:
        """Open the connections now, so the first requests find them warm.

        A plain client opens its base URL's connection (and raises if it cannot). A routed one
        opens every target's, concurrently; a target that cannot be reached is logged and left
        to the routing, and only if none can be reached does this raise. With shared stats
        (``stats_backend = "redis"``) it also reads the fleet's, so the first request routes
        where the fleet learned (an unreachable Redis is logged, never raised).

        ``probe=True``: then, every routed target gets one small real request (one output
        token, streamed), all at once, each within ``probe_timeout`` seconds, and its TTFT is
        recorded as a sample (a failure as a failure); what they cost is in
        ``client.metrics.costs()`` under the kind ``"probe"`` (docs/routing.md, "Starting
        warm"). A target whose probe fails is logged and left to the routing; only if every
        probe fails does this raise ``AllTargetsFailed`` (each target's cause in ``errors``).
        """
        # The base URL is warmed only over llmroute's own transport (not a user's http_client,
        # nor httpx's transport through a proxy).
        ours = self._transport is not None
        default = check_base_url(self.base_url) if self._warm_default and ours else None
        if default is None and not self._llmroute.providers:
            return
        connect = to_timeout(self.timeout).connect
        await self._llmroute.warm.warmup(default, connect, probe=probe, probe_timeout=probe_timeout)

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None:
        """Add (or replace) a provider at run time, from a ``[providers.<name>]`` table, e.g.
        ``{"kind": "sglang", "base_url": ..., "api_key": ...}``; ``ConfigError`` if invalid."""
        self._llmroute.add_provider(name, table)

    def add_targets(self, model: str, targets: Any, **route: Any) -> None:
        """Add ``"provider:model"`` targets to the route ``model``, creating it (from ``route``,
        the keys of a ``[models.<name>]`` table) when it does not exist yet. The providers must
        be known: in the config, or added with :meth:`add_provider`."""
        self._llmroute.add_targets(model, list(targets), **route)

    def stats(self) -> dict[str, TargetSnapshot]:
        """A snapshot of every routed target's live stats (empty for a client without routes):
        per target, TTFT p50/p95/p99 over the sliding window, inter-token latency, error and
        429 rates, requests in flight and the circuit breaker's state."""
        return self._llmroute.stats()

    @property
    def metrics(self) -> ClientMetrics:
        """This client's Prometheus metrics; see :mod:`llmroute.metrics`."""
        return self._llmroute.metrics

    @property
    def _router(self) -> Router:
        return self._llmroute.router

    @property
    def _cache(self) -> Any:
        return self._llmroute.cache

    @property
    def _providers(self) -> Any:
        return self._llmroute.providers

    @property
    def _transport(self) -> Any:
        transport = self._llmroute.transport
        return transport if getattr(self._client, "_transport", None) is transport else None

    @property
    def _stats_sync(self) -> Any:
        return self._llmroute.stats_sync

    @property
    def _servers(self) -> Any:
        return self._llmroute.servers

    async def close(self) -> None:
        """Close the connections and the cache (a copy leaves them to its original)."""
        if not self._llmroute_owner:
            return
        await super().close()
        await self._llmroute.aclose()

    def __repr__(self) -> str:
        routes = self._llmroute.router.routes
        shown = f" routes={sorted(routes)!r}" if routes else ""
        return f"<llmroute.AsyncOpenAI base_url={str(self.base_url)!r}{shown}>"


async def _unreachable() -> Any:  # a routed chat call never goes to the base URL
    raise AssertionError("a routed call has no direct path")
