"""``OpenAI``: the sync twin of ``AsyncOpenAI``, running it on a private event loop thread.

Each client starts one event loop in a daemon thread (anyio's blocking portal) and builds its
``AsyncOpenAI`` there; every sync call runs the async one on that loop and waits for it. Nothing
is implemented twice: resources are reached through generic proxies, so whatever the async
client offers (a resource, a method, a paginator, a streaming-response context manager) is
offered here as its sync form. Calls from several threads run concurrently on the loop.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import inspect
import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx
import openai
import pydantic
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._client import DEFAULT_MAX_RETRIES, AsyncOpenAI
from ._config import Config
from ._streaming import AsyncStream
from ._types import RouteReport, Timings
from .metrics import ClientMetrics
from .routing.stats import TargetSnapshot

__all__ = ["OpenAI", "Stream"]

log = logging.getLogger("llmroute")

_T = TypeVar("_T")
_NOT_GIVEN: Any = openai.NOT_GIVEN
_CLOSE_TIMEOUT = 5.0  # seconds: closing the async client, then stopping the loop
# Values that are returned as they are, never wrapped (httpx.Response has async methods too).
_PLAIN = (
    str,
    bytes,
    int,
    float,
    bool,
    type(None),
    list,
    tuple,
    dict,
    set,
    frozenset,
    type,
    BaseException,
    pydantic.BaseModel,
    httpx.Response,
    httpx.Request,
    httpx.URL,
    httpx.Headers,
    httpx.Timeout,
    Timings,
    RouteReport,
)


class _Runtime:
    """One event loop thread and the root ``AsyncOpenAI`` built on it; shared with copies.

    Shut down by :meth:`close`, or when the last client, copy, proxy or stream using it is
    garbage-collected, or at interpreter exit (``weakref.finalize``), with bounded waits.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        manager = start_blocking_portal("asyncio", name="llmroute-loop")
        portal = manager.__enter__()
        thread_id = portal.call(threading.get_ident)
        thread = next(t for t in threading.enumerate() if t.ident == thread_id)
        try:
            root = portal.call(functools.partial(AsyncOpenAI, **options))
        except BaseException:
            _shutdown(portal, manager, thread, None)
            raise
        self.portal: BlockingPortal = portal
        self.thread = thread
        self.root = root
        self.pid = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, portal, manager, thread, root)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()


_abandoned: list[object] = []  # loop threads that did not stop in time, left to the exit


def _shutdown(
    portal: BlockingPortal,
    manager: AbstractContextManager[BlockingPortal],
    thread: threading.Thread,
    root: AsyncOpenAI | None,
) -> None:
    """Close ``root`` on its loop, then stop the loop and join its thread, each bounded."""
    if threading.get_ident() == thread.ident:
        # Collected on the loop thread itself (a reference cycle): it cannot wait for itself.
        helper = threading.Thread(
            target=_shutdown, args=(portal, manager, thread, root), daemon=True
        )
        helper.start()
        return
    if root is not None:
        try:
            portal.start_task_soon(root.close).result(_CLOSE_TIMEOUT)
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


def _close_soon(binding: _Binding, stream: AsyncStream[Any]) -> None:
    runtime = binding.runtime
    if runtime.closed or runtime.pid != os.getpid():
        return
    try:
        runtime.portal.start_task_soon(stream.close)
    except RuntimeError:
        pass  # the loop is stopping: it closes everything itself


class ClientClosedError(RuntimeError):
    """Raised when a sync client (or a stream of it) is used after it was closed."""


class _Binding:
    """What every proxy of one sync client holds: the runtime and the client's closed flag."""

    __slots__ = ("closed", "runtime")

    def __init__(self, runtime: _Runtime) -> None:
        self.runtime = runtime
        self.closed = False

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
        runtime = self.runtime
        if self.closed or runtime.closed:
            raise ClientClosedError("The client has been closed")
        if runtime.pid != os.getpid():
            raise ClientClosedError(
                "This llmroute.OpenAI was created before os.fork(): its event loop thread does "
                "not exist in this process; create a new client here"
            )
        if threading.get_ident() == runtime.thread.ident:
            raise RuntimeError(
                "llmroute.OpenAI was called from its own event loop thread, where it would wait "
                "for itself; use llmroute.AsyncOpenAI in async code"
            )
        target = functools.partial(func, *args, **kwargs) if args or kwargs else func
        try:
            future = runtime.portal.start_task_soon(target)
            if started is not None:
                started(future)
        except RuntimeError:
            if runtime.closed:
                raise ClientClosedError("The client has been closed") from None
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if runtime.closed:
                raise ClientClosedError("The client was closed during the call") from None
            raise
        except BaseException:
            if not future.done():  # KeyboardInterrupt and the like: stop the async call too
                future.cancel()
            raise

    def wrap(self, value: Any) -> Any:
        """The sync form of a value the async client gave."""
        if isinstance(value, AsyncStream):
            return Stream(self, value)
        kind = _proxy_kind(type(value))
        return value if kind is None else kind(self, value)


@functools.lru_cache(maxsize=256)
def _proxy_kind(cls: type) -> type[_Proxy] | None:
    """Which proxy a value of ``cls`` needs, or ``None`` for a value returned as it is.

    Async-iterables (pages) and async context managers always need one; so do the async
    client's resources and responses: llmroute's own classes other than records, and classes
    with async methods, except the plain values in ``_PLAIN``.
    """
    iterable = hasattr(cls, "__aiter__")
    context = hasattr(cls, "__aenter__")
    if iterable and context:
        return _IterableContextProxy
    if iterable:
        return _IterableProxy
    if context:
        return _ContextProxy
    if issubclass(cls, _PLAIN) or dataclasses.is_dataclass(cls):
        return None
    if (
        cls.__module__.startswith("llmroute.")
        or cls.__name__.startswith("Async")
        or any(
            inspect.iscoroutinefunction(getattr(cls, name, None))
            or inspect.isasyncgenfunction(getattr(cls, name, None))
            for name in dir(cls)
            if not name.startswith("__")
        )
    ):
        return _Proxy
    return None


class _Proxy:
    """The sync face of an async object: methods run on the loop, results are wrapped too."""

    __slots__ = ("_binding", "_target")

    def __init__(self, binding: _Binding, target: Any) -> None:
        self._binding = binding
        self._target = target

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self._target, name)
        if callable(value) and not isinstance(value, type):
            return _method(self._binding, value)
        return self._binding.wrap(value)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._target)) - {"__aiter__", "__aenter__", "__aexit__"})

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"


def _method(binding: _Binding, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        return binding.wrap(binding.call(func, *args, **kwargs))

    return call


class _IterableProxy(_Proxy):
    __slots__ = ()

    def __iter__(self) -> _SyncIterator:
        binding = self._binding
        return _SyncIterator(binding, binding.call(self._target.__aiter__))


class _ContextProxy(_Proxy):
    __slots__ = ()

    def __enter__(self) -> Any:
        return self._binding.wrap(self._binding.call(self._target.__aenter__))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return self._binding.call(self._target.__aexit__, exc_type, exc, tb)


class _IterableContextProxy(_IterableProxy, _ContextProxy):
    __slots__ = ()


class _SyncIterator:
    """Iterates an async iterator, one ``__anext__`` on the loop per item."""

    def __init__(self, binding: _Binding, iterator: Any) -> None:
        self._binding = binding
        self._iterator = iterator

    def __iter__(self) -> _SyncIterator:
        return self

    def __next__(self) -> Any:
        try:
            return self._binding.wrap(self._binding.call(self._iterator.__anext__))
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        aclose = getattr(self._iterator, "aclose", None)
        if aclose is not None and not (self._binding.closed or self._binding.runtime.closed):
            self._binding.call(aclose)


class Stream(Generic[_T]):
    """The sync form of :class:`~llmroute.AsyncStream`: ``for chunk in stream``, ``with stream``.

    Each item is one ``__anext__`` of the async stream on the client's loop. ``close()`` (or
    leaving a ``with`` block) resets an unfinished HTTP/2 stream at once; after a bare ``break``
    the reset is scheduled as soon as the stream object is dropped.
    """

    def __init__(self, binding: _Binding, stream: AsyncStream[_T]) -> None:
        self._binding = binding
        self._stream = stream
        self._closed = False
        self._reading: concurrent.futures.Future[Any] | None = None
        # Dropped without close() (a bare break): release the upstream stream at once, without
        # waiting, from whatever thread drops it.
        weakref.finalize(self, _close_soon, binding, stream)

    @property
    def response(self) -> httpx.Response:
        return self._stream.response

    @property
    def timings(self) -> Timings:
        return self._stream.timings

    @property
    def route(self) -> RouteReport | None:
        return self._stream.route

    def __iter__(self) -> Stream[_T]:
        return self

    def __next__(self) -> _T:
        if self._closed:
            raise StopIteration
        try:
            return self._binding.call(self._stream.__anext__, started=self._started)
        except StopAsyncIteration:
            raise StopIteration from None
        except concurrent.futures.CancelledError:
            if self._closed:  # closed by another thread while this one was reading
                raise StopIteration from None
            raise

    def _started(self, future: concurrent.futures.Future[Any]) -> None:
        self._reading = future

    def close(self) -> None:
        """Stop reading and release the stream (resets the HTTP/2 stream if unfinished).

        May be called from another thread while one reads it: that read ends (the reader's
        loop stops as at the end of the stream)."""
        if self._closed:
            return
        self._closed = True
        binding = self._binding
        if binding.closed or binding.runtime.closed:
            return
        reading = self._reading
        if reading is not None and not reading.done():
            reading.cancel()
        # The cancelled read unwinds on the loop a moment after its future says so: until it
        # has, the async stream is still running and cannot be closed (bounded retries).
        deadline = time.monotonic() + _CLOSE_TIMEOUT
        while True:
            try:
                binding.call(self._stream.close)
                return
            except RuntimeError as exc:
                if "already running" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def __enter__(self) -> Stream[_T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._binding.wrap(getattr(self._stream, name))


class OpenAI:
    """A drop-in replacement for ``openai.OpenAI``, with :class:`AsyncOpenAI`'s routing.

    Takes ``AsyncOpenAI``'s constructor arguments (``config=`` and ``verify=`` included) and
    offers its resources as sync calls: ``client.chat.completions.create(...)`` returns openai's
    ``ChatCompletion``, or with ``stream=True`` a :class:`Stream` of chunks; errors are the
    async client's own exception objects (openai's types).

    The async client runs on a private event loop in a daemon thread, started here and stopped
    by :meth:`close` (or ``with``), when the client is garbage-collected, or at interpreter exit.
    Safe to use from many threads at once: their calls run concurrently on that loop. It may be
    called from a coroutine on another event loop, but blocks that loop while it waits; use
    ``AsyncOpenAI`` there. ``http_client``, if given, must be an ``httpx.AsyncClient``.
    """

    def __init__(
        self,
        *,
        api_key: str | Callable[[], Any] | None = None,
        organization: str | None = None,
        project: str | None = None,
        base_url: str | httpx.URL | None = None,
        timeout: Any = _NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        http_client: httpx.AsyncClient | None = None,
        verify: ssl.SSLContext | str | bool = True,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            names = ", ".join(sorted(unsupported))
            raise TypeError(f"OpenAI() got unsupported argument(s): {names}")
        _check_http_client(http_client)
        runtime = _Runtime(
            {
                "api_key": api_key,
                "organization": organization,
                "project": project,
                "base_url": base_url,
                "timeout": timeout,
                "max_retries": max_retries,
                "default_headers": default_headers,
                "default_query": default_query,
                "http_client": http_client,
                "verify": verify,
                "config": config,
            }
        )
        self._binding = _Binding(runtime)
        self._async: AsyncOpenAI = runtime.root
        self._owner = True

    @classmethod
    def _copy_of(cls, runtime: _Runtime, client: AsyncOpenAI) -> OpenAI:
        self = object.__new__(cls)
        self._binding = _Binding(runtime)
        self._async = client
        self._owner = False
        return self

    # -- attributes and resources, all the async client's ------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_binding", "_async", "_owner"):
            raise AttributeError(name)
        value = getattr(self._async, name)
        if callable(value) and not isinstance(value, type):
            return _method(self._binding, value)
        return self._binding.wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:  # openai's options (max_retries, timeout, ...) live on the async client
            setattr(self._async, name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._async)))

    @property
    def chat(self) -> Any:
        """``client.chat.completions.create(...)``, as openai's sync client has it."""
        return self._binding.wrap(self._async.chat)

    # -- the client's own methods -----------------------------------------------------------

    def with_options(
        self,
        *,
        api_key: str | Callable[[], Any] | None = None,
        organization: str | None = None,
        project: str | None = None,
        base_url: str | httpx.URL | None = None,
        timeout: Any = _NOT_GIVEN,
        max_retries: int | None = None,
        default_headers: Mapping[str, str] | None = None,
        set_default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        set_default_query: Mapping[str, object] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> OpenAI:
        """A copy of this client with some options changed; it shares the loop thread and the
        connections. Closing the copy leaves this client open; closing this one ends both."""
        _check_http_client(http_client)
        clone = self._binding.call(
            self._async.with_options,
            api_key=api_key,
            organization=organization,
            project=project,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            set_default_headers=set_default_headers,
            default_query=default_query,
            set_default_query=set_default_query,
            http_client=http_client,
        )
        return OpenAI._copy_of(self._binding.runtime, clone)

    copy = with_options

    def warmup(self) -> None:
        """Open the connections now (see :meth:`AsyncOpenAI.warmup`)."""
        self._binding.call(self._async.warmup)

    def stats(self) -> dict[str, TargetSnapshot]:
        """A snapshot of every routed target's live stats (see :meth:`AsyncOpenAI.stats`)."""
        return self._binding.call(self._async.stats)

    @property
    def metrics(self) -> ClientMetrics:
        """This client's Prometheus metrics (see :attr:`AsyncOpenAI.metrics`)."""
        return self._async.metrics

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None:
        """Add (or replace) a provider at run time (see :meth:`AsyncOpenAI.add_provider`)."""
        self._binding.call(self._async.add_provider, name, table)

    def add_targets(self, model: str, targets: Any, **route: Any) -> None:
        """Add targets to a route, creating it (see :meth:`AsyncOpenAI.add_targets`)."""
        self._binding.call(self._async.add_targets, model, list(targets), **route)

    def is_closed(self) -> bool:
        """Whether this client (or the one it is a copy of) was closed, as openai's."""
        return self._binding.closed or self._binding.runtime.closed

    def close(self) -> None:
        """Close the connections and stop the event loop thread (a copy only marks itself
        closed: the connections are its original's). Idempotent."""
        binding = self._binding
        if binding.closed:
            return
        binding.closed = True
        if self._owner:
            binding.runtime.close()

    def __enter__(self) -> OpenAI:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._async).replace("llmroute.AsyncOpenAI", "llmroute.OpenAI", 1)


def _check_http_client(http_client: object) -> None:
    if http_client is not None and not isinstance(http_client, httpx.AsyncClient):
        raise TypeError(
            "llmroute.OpenAI runs its requests on an event loop: http_client must be an "
            f"httpx.AsyncClient (or None), not {type(http_client).__name__}"
        )
