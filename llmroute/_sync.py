"""``OpenAI``: openai's own sync client, with llmroute under it and on top of it.

llmroute's transport and routing engine are async: each client family (a client and its
copies) runs them on one private event loop in a daemon thread (anyio's blocking portal).
openai's sync machinery sends over a bridge transport into that loop; a call whose model name is
a route runs on the loop and comes back as openai's own types, a stream as :class:`Stream` (an
``openai.Stream``). Calls from several threads run concurrently on the loop.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Literal, TypeVar, cast, overload

import httpx
import openai
from anyio.from_thread import BlockingPortal, start_blocking_portal
from openai._compat import cached_property
from openai._models import FinalRequestOptions
from openai.resources.chat import Chat, Completions
from openai.resources.responses import Responses
from openai.types.chat import ChatCompletionChunk

from ._call import Call, Served, attach
from ._call_cache import LOOKED_UP
from ._client import (
    DEFAULT_TIMEOUT,
    MISS,
    NO_KEY,
    AsyncOpenAI,
    EarlyCheck,
    base_url_of,
    is_legacy_raw,
    is_raw,
    own_state,
    post_parse,
    prepare,
    records,
    signs_late,
    wrap_raw,
)
from ._dispatch import Dispatch, missing_key_error
from ._errors import APIConnectionError, map_transport_errors, stream_ended_with_text
from ._streaming import AsyncStream, broke
from ._types import RouteReport, Timings
from ._upstream import body_errors, to_timeout
from .config import Config
from .metrics import ClientMetrics
from .protocols.openai import ChatStreamDecoder
from .protocols.reader import StreamReader
from .routing.probe import PROBE_TIMEOUT
from .routing.stats import TargetSnapshot
from .transport import response_timings

__all__ = ["ClientClosedError", "OpenAI", "Stream"]

log = logging.getLogger("llmroute")

_T = TypeVar("_T")
_ResponseT = TypeVar("_ResponseT")
_StreamT = TypeVar("_StreamT", bound=openai.Stream[Any])
_NOT_GIVEN: Any = openai.NOT_GIVEN
_CLOSE_TIMEOUT = 5.0  # seconds: closing the routing state, then stopping the loop


class ClientClosedError(RuntimeError):
    """Raised when a sync client (or a stream of it) is used after it was closed."""


class _Runtime:
    """One event loop thread and the routing state built on it; shared with copies.

    Shut down by :meth:`close`, or when the last client, copy or stream using it is
    garbage-collected, or at interpreter exit (``weakref.finalize``), with bounded waits.
    """

    def __init__(self, kwargs: dict[str, Any], config: object, verify: object) -> None:
        manager = start_blocking_portal("asyncio", name="llmroute-loop")
        portal = manager.__enter__()
        thread_id = portal.call(threading.get_ident)
        thread = next(t for t in threading.enumerate() if t.ident == thread_id)
        try:
            # Built on the loop: its locks and connections belong there.
            dispatch, missing = portal.call(
                functools.partial(prepare, kwargs, config, verify, None)
            )
        except BaseException:
            _shutdown(portal, manager, thread, None)
            raise
        self.portal: BlockingPortal = portal
        self.thread = thread
        self.dispatch: Dispatch = dispatch
        self.missing_key = missing
        self.pid = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, portal, manager, thread, dispatch)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()

    def check(self) -> None:
        """Raise :class:`ClientClosedError` if the loop cannot be used from here."""
        if self.closed:
            raise ClientClosedError("The client has been closed")
        if self.pid != os.getpid():
            raise ClientClosedError(
                "This llmroute.OpenAI was created before os.fork(): its event loop thread does "
                "not exist in this process; create a new client here"
            )

    def call(
        self,
        func: Callable[..., Any],
        /,
        *args: Any,
        started: Callable[[concurrent.futures.Future[Any]], None] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``func(*args, **kwargs)`` on the loop (awaiting what it returns), and wait.

        ``started`` is given the call's future as soon as it is scheduled (a stream keeps it,
        so that another thread can cancel a read in progress)."""
        self.check()
        if threading.get_ident() == self.thread.ident:
            raise RuntimeError(
                "llmroute.OpenAI was called from its own event loop thread, where it would wait "
                "for itself; use llmroute.AsyncOpenAI in async code"
            )
        target = functools.partial(func, *args, **kwargs) if args or kwargs else func
        try:
            future = self.portal.start_task_soon(target)
            if started is not None:
                started(future)
        except RuntimeError:
            if self.closed:
                raise ClientClosedError("The client has been closed") from None
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self.closed:
                raise ClientClosedError("The client was closed during the call") from None
            raise
        except BaseException:
            if not future.done():  # KeyboardInterrupt and the like: stop the async call too
                future.cancel()
            raise


_abandoned: list[object] = []  # loop threads that did not stop in time, left to the exit


def _shutdown(
    portal: BlockingPortal,
    manager: AbstractContextManager[BlockingPortal],
    thread: threading.Thread,
    dispatch: Dispatch | None,
) -> None:
    """Close ``dispatch`` on its loop, then stop the loop and join its thread, each bounded."""
    if threading.get_ident() == thread.ident:
        # Collected on the loop thread itself (a reference cycle): it cannot wait for itself.
        helper = threading.Thread(
            target=_shutdown, args=(portal, manager, thread, dispatch), daemon=True
        )
        helper.start()
        return
    if dispatch is not None:
        try:
            portal.start_task_soon(dispatch.aclose).result(_CLOSE_TIMEOUT)
        except concurrent.futures.TimeoutError:
            log.warning("llmroute.OpenAI: closing the client took over %ss", _CLOSE_TIMEOUT)
        except Exception as exc:  # the loop is gone, or closing failed: stop anyway
            log.warning("llmroute.OpenAI: closing the client failed: %r", exc)
    try:
        portal.start_task_soon(portal.stop, True).result(_CLOSE_TIMEOUT)
    except (RuntimeError, concurrent.futures.CancelledError):
        pass  # stopped already
    except Exception as exc:
        log.warning("llmroute.OpenAI: stopping the event loop failed: %r", exc)
    thread.join(_CLOSE_TIMEOUT)
    if thread.is_alive():
        _abandoned.append(manager)  # its exit would join the thread without a bound
        return
    manager.__exit__(None, None, None)


class _Reads:
    """What a sync reader of the loop and whoever closes it share: the read in progress."""

    __slots__ = ("closed", "reading")

    def __init__(self) -> None:
        self.closed = False
        self.reading: concurrent.futures.Future[Any] | None = None

    def started(self, future: concurrent.futures.Future[Any]) -> None:
        self.reading = future

    def cancel(self) -> None:
        self.closed = True
        reading = self.reading
        if reading is not None and not reading.done():
            reading.cancel()


class _BridgedBody(httpx.SyncByteStream):
    """A response body read on the loop, one chunk per call, for sync readers. ``close()``
    may come from another thread while one reads: that read ends as the body's end."""

    def __init__(self, runtime: _Runtime, stream: Any) -> None:
        self._runtime = runtime
        self._stream = stream
        self._reads = _Reads()

    def __iter__(self) -> Iterator[bytes]:
        runtime, reads = self._runtime, self._reads
        iterator = runtime.call(_aiter, self._stream)
        while not reads.closed:
            try:
                chunk = runtime.call(iterator.__anext__, started=reads.started)
            except StopAsyncIteration:
                return
            except concurrent.futures.CancelledError:
                if reads.closed:
                    return
                raise
            yield chunk

    def close(self) -> None:
        runtime, reads = self._runtime, self._reads
        if reads.closed and reads.reading is None:
            return
        reads.cancel()
        if runtime.closed or runtime.pid != os.getpid():
            return
        aclose = getattr(self._stream, "aclose", None)
        if aclose is None:
            return
        deadline = time.monotonic() + _CLOSE_TIMEOUT
        while True:  # a cancelled read unwinds on the loop a moment after its future says so
            try:
                runtime.call(aclose)
                return
            except RuntimeError as exc:
                if "already running" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)


async def _aiter(stream: Any) -> Any:
    return stream.__aiter__()


def bridged(runtime: _Runtime, response: httpx.Response, request: Any = None) -> httpx.Response:
    """A sync ``httpx.Response`` over an async one whose body is read on the loop."""
    body = response.stream
    if getattr(response, "_content", None) is not None:
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            content=response.content,
            extensions=response.extensions,
            request=request or response.request,
        )
    return httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=_BridgedBody(runtime, body),
        extensions=response.extensions,
        request=request or response.request,
    )


class _BridgeTransport(httpx.BaseTransport):
    """openai's sync requests, sent by llmroute's async transport on the client's loop."""

    def __init__(self, runtime: _Runtime) -> None:
        self._runtime = runtime

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        content = request.read()
        sent = httpx.Request(
            request.method,
            request.url,
            headers=request.headers,
            content=content,
            extensions=request.extensions,
        )
        transport = self._runtime.dispatch.transport
        response = self._runtime.call(transport.handle_async_request, sent)
        return bridged(self._runtime, response, request)

    def close(self) -> None:
        pass  # the transport is the routing state's, closed with it


class Stream(openai.Stream[_T]):
    """A streamed chat answer for sync code: an ``openai.Stream`` with llmroute's decoding,
    ``timings`` and ``route``.

    ``close()`` (or leaving a ``with`` block) resets an unfinished HTTP/2 stream at once, also
    from another thread while one reads it; after a bare ``break`` the reset goes out as soon
    as the stream object is dropped. A stream never ends quietly with a truncated answer: it
    raises :class:`~llmroute.StreamInterrupted`.
    """

    response: httpx.Response  # pyright: ignore[reportIncompatibleVariableOverride]
    timings: Timings
    route: RouteReport | None

    def __init__(
        self,
        *,
        cast_to: Any = ChatCompletionChunk,
        response: httpx.Response,
        client: Any = None,
        options: Any = None,
    ) -> None:
        # As openai's machinery builds it, for a chat call that is not routed.
        self.response = response
        self._cast_to, self._client, self._options = cast_to, client, options
        self.timings = response_timings(response, None)
        self.route = None
        self._async: AsyncStream[Any] | None = None
        self._runtime: _Runtime | None = None
        self._reads = _Reads()
        self._iterator = _decode(response, self.timings, self._reads)

    @classmethod
    def _over(cls, runtime: _Runtime, stream: AsyncStream[Any]) -> Stream[Any]:
        """The sync form of a stream that runs on the loop (a routed or cached answer)."""
        self = cls.__new__(cls)
        self._cast_to, self._client, self._options = ChatCompletionChunk, None, None
        self._async, self._runtime = stream, runtime
        self.response, self.timings, self.route = stream.response, stream.timings, stream.route
        self._reads = reads = _Reads()
        self._iterator = _relay(runtime, stream, reads)
        # Dropped without close() (a bare break): release the upstream stream at once.
        weakref.finalize(self, _close_soon, runtime, stream)
        return self

    def __next__(self) -> _T:
        if self._reads.closed:
            raise StopIteration
        value = self._iterator.__next__()
        if self._async is not None:
            self.response = self._async.response  # a continuation switches responses  # pyright: ignore[reportIncompatibleVariableOverride]
        return value

    def __iter__(self) -> Iterator[_T]:  # type: ignore[override]
        return self

    def close(self) -> None:
        """Stop reading and release the stream (resets the HTTP/2 stream if unfinished).

        May be called from another thread while one reads it: that read ends."""
        reads = self._reads
        if reads.closed:
            return
        runtime, stream = self._runtime, self._async
        if stream is None or runtime is None:
            reads.closed = True
            try:
                cast(Any, self._iterator).close()
            except ValueError:  # being read in another thread: that read ends with the body
                pass
            self.response.close()
            return
        reads.cancel()
        if runtime.closed:
            return
        deadline = time.monotonic() + _CLOSE_TIMEOUT
        while True:  # a cancelled read unwinds on the loop a moment after its future says so
            try:
                runtime.call(stream.close)
                return
            except RuntimeError as exc:
                if "already running" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def __enter__(self) -> Stream[_T]:  # type: ignore[override]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _relay(runtime: _Runtime, stream: AsyncStream[Any], reads: _Reads) -> Iterator[Any]:
    """The chunks of a stream that runs on the loop (no reference to the sync stream, so
    dropping that one releases this at once)."""
    while not reads.closed:
        try:
            yield runtime.call(stream.__anext__, started=reads.started)
        except StopAsyncIteration:
            return
        except concurrent.futures.CancelledError:
            if reads.closed:  # closed by another thread while this one was reading
                return
            raise


def _decode(response: httpx.Response, timings: Timings, reads: _Reads) -> Iterator[Any]:
    """A direct chat stream's chunks, decoded from its sync response as bytes arrive."""
    request = response.request
    decoder = ChatStreamDecoder(request=request, target=request.url.host)
    reader = StreamReader(decoder, timings)
    try:
        with map_transport_errors(request):
            for data in response.iter_raw():
                yield from reader.feed(data)
                if reader.done:
                    break
            if not reader.done:
                yield from reader.feed(None)
    except APIConnectionError as exc:
        if timings.tokens:
            raise broke(exc, request, timings, decoder) from exc
        raise
    finally:
        timings.total = time.monotonic() - timings.started_at
        response.close()
    if not reader.complete and not reads.closed:
        raise stream_ended_with_text(request, decoder.text)


def _close_soon(runtime: _Runtime, stream: AsyncStream[Any]) -> None:
    if runtime.closed or runtime.pid != os.getpid():
        return
    try:
        runtime.portal.start_task_soon(stream.close)
    except RuntimeError:
        pass  # the loop is stopping: it closes everything itself


_CHAT_EARLY = EarlyCheck(Completions, "/chat/completions", ("model", "messages"))
_RESPONSES_EARLY = EarlyCheck(Responses, "/responses", ("model",))


def _create_early(
    resource: Any, early: EarlyCheck, create: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``create(*args, **kwargs)``, asking the client's cache first (on its loop) when the
    body is known without openai's machinery, as the async client does."""
    client = cast(OpenAI, resource._client)
    body = early.body(client._llmroute.dispatch.cache, args, kwargs)
    if body is None:
        return create(*args, **kwargs)
    found, key = client._cache_first(early.path, body)
    if found is not MISS:
        return found
    token = LOOKED_UP.set(key)  # the loop's task runs in a copy of this context
    try:
        return create(**kwargs)
    finally:
        LOOKED_UP.reset(token)


class _Completions(Completions):
    """openai's sync ``chat.completions``, whose ``create`` asks the cache first."""

    def create(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return _create_early(self, _CHAT_EARLY, super().create, args, kwargs)


class _Responses(Responses):
    """openai's sync ``responses``, whose ``create`` asks the cache first."""

    def create(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return _create_early(self, _RESPONSES_EARLY, super().create, args, kwargs)


functools.update_wrapper(_Completions.create, Completions.create)
functools.update_wrapper(_Responses.create, Responses.create)


class _Chat(Chat):
    @cached_property
    def completions(self) -> Completions:
        return _Completions(self._client)


class OpenAI(openai.OpenAI):
    """openai's ``OpenAI`` with llmroute's transport and routing (see :class:`AsyncOpenAI`).

    Takes every constructor argument of the installed openai version, plus ``config`` and
    ``verify``. The routing runs on a private event loop in a daemon thread, started here and
    stopped by :meth:`close` (or ``with``), when the client is garbage-collected, or at
    interpreter exit. Safe to use from many threads at once. A given ``http_client`` (an
    ``httpx.Client``, as openai takes) carries openai's requests; routed calls still use
    llmroute's transport.
    """

    def __init__(
        self,
        *args: Any,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        verify: Any = True,
        **kwargs: Any,
    ) -> None:
        shared: _Runtime | None = kwargs.pop("_llmroute", None)  # a copy's: its original's
        owner = shared is None
        if shared is None:
            runtime = _Runtime(kwargs, config, verify)
            missing = runtime.missing_key
        else:
            runtime = shared
            _, missing = prepare(kwargs, config, verify, runtime.dispatch)
        given = kwargs.get("http_client")
        if given is None or getattr(given, "_llmroute_of", runtime) is not runtime:
            # (another routing state's bridge: a copy given its own config builds its own)
            http = httpx.Client(
                transport=_BridgeTransport(runtime),
                timeout=DEFAULT_TIMEOUT,
                follow_redirects=True,
            )
            http._llmroute_owned = True  # type: ignore[attr-defined]
            http._llmroute_of = runtime  # type: ignore[attr-defined]
            kwargs["http_client"] = http
        base_url_of(kwargs)  # a bad base URL fails here, before any request
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            if owner:
                runtime.close()
            raise
        self._llmroute = runtime
        self._llmroute_owner = owner
        self._llmroute_closed = False
        self._missing_key = missing or self.api_key == NO_KEY

    def copy(
        self,
        *args: Any,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | openai.NotGiven | None = (
            openai.NOT_GIVEN
        ),
        verify: Any = openai.NOT_GIVEN,
        _extra_kwargs: Mapping[str, Any] = {},
        **kwargs: Any,
    ) -> Any:
        """openai's ``copy``/``with_options``, which also take llmroute's ``config`` and
        ``verify``. Without them the copy shares the loop thread, routes, stats, cache and
        connections (closing the copy leaves this client open); with either, it gets a routing
        state and loop thread of its own (see :meth:`AsyncOpenAI.copy`)."""
        extra = {**_extra_kwargs, **own_state(self._llmroute, config, verify)}
        return super().copy(*args, _extra_kwargs=extra, **kwargs)

    with_options = copy  # type: ignore[assignment]

    # openai's overloads of request(), declared again so that type checkers and
    # typing.get_overloads see them on the seam too.
    @overload
    def request(
        self,
        cast_to: type[_ResponseT],
        options: FinalRequestOptions,
        *,
        stream: Literal[True],
        stream_cls: type[_StreamT],
    ) -> _StreamT: ...

    @overload
    def request(
        self,
        cast_to: type[_ResponseT],
        options: FinalRequestOptions,
        *,
        stream: Literal[False] = False,
    ) -> _ResponseT: ...

    @overload
    def request(
        self,
        cast_to: type[_ResponseT],
        options: FinalRequestOptions,
        *,
        stream: bool = False,
        stream_cls: type[_StreamT] | None = None,
    ) -> _ResponseT | _StreamT: ...

    def request(
        self,
        cast_to: Any,
        options: Any,
        *,
        stream: bool = False,
        stream_cls: Any = None,
    ) -> Any:
        with body_errors():
            return self._serve(cast_to, options, stream, stream_cls)

    def _serve(self, cast_to: Any, options: Any, stream: bool, stream_cls: Any) -> Any:
        runtime = self._llmroute
        if self._llmroute_closed:
            raise ClientClosedError("The client has been closed")
        runtime.check()  # before openai's machinery, which would wrap it in a connection error
        dispatch = runtime.dispatch
        timeout = options.timeout
        limits = to_timeout(self.timeout if isinstance(timeout, type(_NOT_GIVEN)) else timeout)
        call = dispatch.classify(options, timeout=limits)
        if (call is None or call.route is None) and self._missing_key:
            model = options.json_data.get("model") if call is not None else None
            raise missing_key_error(model, dispatch.router.routes)
        if call is None:
            return super().request(cast_to, options, stream=stream, stream_cls=stream_cls)
        if call.route is None:
            inner = None if is_raw(options) else self._inner()
            if inner is not None:  # on the loop: the cache, the metrics, llmroute's stream
                chunk_cls = AsyncStream[Any] if stream else stream_cls
                result = runtime.call(
                    inner.request, cast_to, options, stream=stream, stream_cls=chunk_cls
                )
                return Stream._over(runtime, result) if isinstance(result, AsyncStream) else result
            started = time.monotonic()
            chunk_cls = Stream[Any] if stream else stream_cls
            result = super().request(cast_to, options, stream=stream, stream_cls=chunk_cls)
            if isinstance(result, Stream):
                result.timings.started_at = started
            elif not is_raw(options) and result is not None:
                attach(result, Timings(started_at=started), None, started)
            return result
        _describe(self, call)
        cast_to = self._maybe_override_cast_to(cast_to, options)
        if call.kind in ("chat", "responses"):
            outcome = runtime.call(dispatch.answer, call, _unreachable)
            result = outcome.result
            if isinstance(result, AsyncStream):
                result = Stream._over(runtime, result)
            else:
                result = post_parse(result, options)
            if is_raw(options):  # openai's sync response classes read the body: bridge it
                response = bridged(runtime, outcome.response)
                outcome = Served(outcome.result, response, outcome.retries)
            return wrap_raw(self, outcome, result, cast_to, options, stream, stream_cls)
        outcome = runtime.call(dispatch.other, call)
        response = bridged(runtime, outcome.response)
        result = self._process_response(
            cast_to=cast_to,
            options=options,
            response=cast(Any, response),
            stream=stream,
            stream_cls=stream_cls,
            retries_taken=outcome.retries,
        )
        records(result, outcome.response)
        if is_legacy_raw(options):  # openai decides that by the upstream request's headers
            return wrap_raw(self, outcome, result, cast_to, options, stream, stream_cls)
        return result

    @cached_property
    def chat(self) -> Chat:
        return _Chat(self)

    @cached_property
    def responses(self) -> Responses:
        return _Responses(self)

    def _cache_first(self, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
        """A call's cached answer before openai's machinery builds its request (see
        :meth:`AsyncOpenAI._cache_first`), looked up on the loop by the async twin;
        ``MISS`` when the call must go the usual way (as every call does when the twin
        cannot carry this client's calls)."""
        runtime = self._llmroute
        if self._llmroute_closed or runtime.closed or runtime.pid != os.getpid():
            return MISS, None  # the seam raises ClientClosedError
        inner = self._inner()
        if inner is None:
            return MISS, None
        found, key = runtime.call(inner._cache_first, path, body)
        if isinstance(found, AsyncStream):
            found = Stream._over(runtime, found)
        return found, key

    def _inner(self) -> AsyncOpenAI | None:
        """The async twin on the loop that serves this client's chat calls for model names
        that are not routes (so they get the cache and the metrics as the async client's do);
        ``None`` when this client's own ``http_client`` must carry them, or openai's
        per-request authentication (a key callable, a workload identity, a cloud provider)."""
        if not getattr(self._client, "_llmroute_owned", False):
            return None
        if signs_late(self):
            return None  # openai authenticates each request (the twin would not carry it)
        inner = self.__dict__.get("_llmroute_inner")
        if inner is None:
            inner = self._llmroute.call(_twin, self, self._llmroute.dispatch)
            self.__dict__["_llmroute_inner"] = inner
        return inner

    def warmup(self, *, probe: bool = False, probe_timeout: float = PROBE_TIMEOUT) -> None:
        """Open the connections now; ``probe=True``: and measure every routed target with one
        small request (see :meth:`AsyncOpenAI.warmup`)."""
        dispatch = self._llmroute.dispatch
        default = (
            httpx.URL(str(self.base_url))
            if not dispatch.configured or (dispatch.default_provider is not None)
            else None
        )
        connect = to_timeout(self.timeout).connect
        self._llmroute.call(
            dispatch.warm.warmup, default, connect, probe=probe, probe_timeout=probe_timeout
        )

    def stats(self) -> dict[str, TargetSnapshot]:
        """A snapshot of every routed target's live stats (see :meth:`AsyncOpenAI.stats`)."""
        return self._llmroute.call(_stats, self._llmroute.dispatch)

    @property
    def metrics(self) -> ClientMetrics:
        """This client's Prometheus metrics (see :attr:`AsyncOpenAI.metrics`)."""
        return self._llmroute.dispatch.metrics

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None:
        """Add (or replace) a provider at run time (see :meth:`AsyncOpenAI.add_provider`)."""
        self._llmroute.dispatch.add_provider(name, table)

    def add_targets(self, model: str, targets: Any, **route: Any) -> None:
        """Add targets to a route, creating it (see :meth:`AsyncOpenAI.add_targets`)."""
        self._llmroute.dispatch.add_targets(model, list(targets), **route)

    def is_closed(self) -> bool:
        """Whether this client (or the one it is a copy of) was closed, as openai's."""
        return self._llmroute_closed or self._llmroute.closed or super().is_closed()

    def close(self) -> None:
        """Close the connections and stop the event loop thread (a copy only marks itself
        closed: the connections are its original's). Idempotent."""
        if self._llmroute_closed:
            return
        self._llmroute_closed = True
        if self._llmroute_owner:
            if not getattr(self._client, "_llmroute_owned", False):
                super().close()
            self._llmroute.close()

    def __repr__(self) -> str:
        routes = self._llmroute.dispatch.router.routes
        shown = f" routes={sorted(routes)!r}" if routes else ""
        return f"<llmroute.OpenAI base_url={str(self.base_url)!r}{shown}>"


async def _twin(client: OpenAI, dispatch: Dispatch) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` with ``client``'s options, sharing its routing state."""
    return AsyncOpenAI(
        api_key=client.api_key,
        organization=client.organization,
        project=client.project,
        base_url=client.base_url,
        timeout=client.timeout,
        max_retries=client.max_retries,
        default_headers=client._custom_headers,
        default_query=client._custom_query,
        _llmroute=dispatch,
    )


async def _stats(dispatch: Dispatch) -> dict[str, TargetSnapshot]:
    return dispatch.stats()


async def _unreachable() -> Any:
    raise AssertionError("a routed call has no direct path")


def _describe(client: Any, call: Call) -> None:
    call.client_headers = {k: v for k, v in client._custom_headers.items() if isinstance(v, str)}
    call.base_url = str(client.base_url)
