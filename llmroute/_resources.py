"""The resources beyond chat (``completions``, ``embeddings``, ``models``) and the raw and
streamed response wrappers (``with_raw_response``, ``with_streaming_response``) of every resource.

Results are openai's own types, built without validation, so unknown fields survive; parameters
llmroute does not use are sent as given. A model name that is a route goes to the route's first
target (routing applies to chat completions only).
"""

from __future__ import annotations

import array
import base64
import datetime
import functools
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar, cast, overload

import httpx
import openai
from openai._models import construct_type
from openai.pagination import AsyncPage
from openai.types import Completion, CreateEmbeddingResponse, Model

from ._streaming import AsyncStream
from ._types import Timings
from .protocols.openai import CompletionStreamDecoder, parse_body

if TYPE_CHECKING:
    from ._client import AsyncCompletions as AsyncChatCompletions
    from ._client import AsyncOpenAI

__all__ = [
    "AsyncAPIResponse",
    "AsyncEmbeddings",
    "AsyncModelPager",
    "AsyncModels",
    "AsyncResponseContextManager",
    "AsyncTextCompletions",
    "LegacyAPIResponse",
    "attach_response",
    "has_response",
]

P = ParamSpec("P")
R = TypeVar("R")
_T = TypeVar("_T")
_SENTINELS = (type(openai.NOT_GIVEN), type(openai.omit))
_NOT_GIVEN: Any = openai.NOT_GIVEN
_RESPONSE_ATTR = "_llmroute_http_response"

Headers = Mapping[str, str | None] | None
Query = Mapping[str, object] | None


def _given(value: object) -> bool:
    return not isinstance(value, _SENTINELS)


class _ResponseRef:
    """The HTTP response behind a result; copies of the result share it."""

    __slots__ = ("response", "retries")

    def __init__(self, response: httpx.Response, retries: int) -> None:
        self.response = response
        self.retries = retries

    def __copy__(self) -> _ResponseRef:
        return self

    def __deepcopy__(self, memo: object) -> _ResponseRef:
        return self


def attach_response(result: object, response: httpx.Response, retries: int = 0) -> None:
    """Remember the HTTP response ``result`` was decoded from (for ``with_raw_response``)."""
    object.__setattr__(result, _RESPONSE_ATTR, _ResponseRef(response, retries))


def has_response(result: object) -> bool:
    """Whether :func:`attach_response` gave ``result`` its response."""
    return isinstance(getattr(result, _RESPONSE_ATTR, None), _ResponseRef)


def _response_of(result: object) -> tuple[httpx.Response, int]:
    if isinstance(result, AsyncStream):
        stream = cast(AsyncStream[Any], result)
        return stream.response, stream.timings.retries
    ref = getattr(result, _RESPONSE_ATTR, None)
    if isinstance(ref, _ResponseRef):
        return ref.response, ref.retries
    raise TypeError(f"no HTTP response is known for a {type(result).__name__}")


# -- raw and streamed responses ------------------------------------------------------------------


class _ResponseSurface(Generic[R]):
    """What openai's raw and streamed responses share: the HTTP exchange's metadata."""

    def __init__(self, response: httpx.Response, result: R, retries_taken: int) -> None:
        self.http_response = response
        self.retries_taken = retries_taken
        self._result = result

    @property
    def headers(self) -> httpx.Headers:
        return self.http_response.headers

    @property
    def http_request(self) -> httpx.Request:
        return self.http_response.request

    @property
    def status_code(self) -> int:
        return self.http_response.status_code

    @property
    def url(self) -> httpx.URL:
        return self.http_response.url

    @property
    def method(self) -> str:
        return self.http_request.method

    @property
    def http_version(self) -> str:
        return self.http_response.http_version

    @property
    def elapsed(self) -> datetime.timedelta:
        return self.http_response.elapsed

    @property
    def is_closed(self) -> bool:
        return self.http_response.is_closed

    @property
    def request_id(self) -> str | None:
        return self.http_response.headers.get("x-request-id")

    def _parse_as(self, to: type[_T] | None) -> R | _T:
        if to is None:
            return self._result
        if isinstance(self._result, AsyncStream):
            raise TypeError("parse(to=...) is not supported for a streamed result")
        return cast(_T, construct_type(type_=to, value=json.loads(self.http_response.content)))

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} [{self.status_code} {self.http_response.reason_phrase}] "
            f"type={type(self._result).__name__}>"
        )


class LegacyAPIResponse(_ResponseSurface[R]):
    """What ``with_raw_response`` gives, like openai's ``LegacyAPIResponse``: the HTTP metadata
    and ``parse()``, which returns what the plain call returns (a stream for ``stream=True``)."""

    @overload
    def parse(self, *, to: type[_T]) -> _T: ...

    @overload
    def parse(self) -> R: ...

    def parse(self, *, to: type[_T] | None = None) -> R | _T:
        """The result the plain call returns; with ``to``, the JSON body constructed as that."""
        return self._parse_as(to)

    @property
    def content(self) -> bytes:
        return self.http_response.content

    @property
    def text(self) -> str:
        return self.http_response.text


class AsyncAPIResponse(_ResponseSurface[R]):
    """What ``with_streaming_response`` gives inside its ``async with`` block, like openai's
    ``AsyncAPIResponse``. A streamed call's body is read only as asked (``parse()`` for chunks,
    ``iter_bytes()``/``iter_text()``/``iter_lines()`` for the raw bytes); a whole-body call's
    body was read before the block began."""

    @overload
    async def parse(self, *, to: type[_T]) -> _T: ...

    @overload
    async def parse(self) -> R: ...

    async def parse(self, *, to: type[_T] | None = None) -> R | _T:
        """The result the plain call returns; with ``to``, the JSON body constructed as that."""
        return self._parse_as(to)

    async def read(self) -> bytes:
        return await self.http_response.aread()

    async def text(self) -> str:
        await self.read()
        return self.http_response.text

    async def json(self) -> object:
        await self.read()
        return self.http_response.json()

    async def close(self) -> None:
        if isinstance(self._result, AsyncStream):
            await cast(AsyncStream[Any], self._result).close()
        await self.http_response.aclose()

    async def iter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        async for chunk in self.http_response.aiter_bytes(chunk_size):
            yield chunk

    async def iter_text(self, chunk_size: int | None = None) -> AsyncIterator[str]:
        async for chunk in self.http_response.aiter_text(chunk_size):
            yield chunk

    async def iter_lines(self) -> AsyncIterator[str]:
        async for line in self.http_response.aiter_lines():
            yield line


class AsyncResponseContextManager(Generic[R]):
    """``async with`` around a call: the response inside, closed when the block ends."""

    def __init__(self, call: Awaitable[AsyncAPIResponse[R]]) -> None:
        self._call = call
        self._response: AsyncAPIResponse[R] | None = None

    async def __aenter__(self) -> AsyncAPIResponse[R]:
        self._response = await self._call
        return self._response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._response is not None:
            await self._response.close()


def to_raw_response(
    func: Callable[P, Awaitable[R]],
) -> Callable[P, Awaitable[LegacyAPIResponse[R]]]:
    """``func`` returning a :class:`LegacyAPIResponse` around its result."""

    @functools.wraps(func)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> LegacyAPIResponse[R]:
        result = await func(*args, **kwargs)
        response, retries = _response_of(result)
        return LegacyAPIResponse(response, result, retries)

    return wrapped


def to_streamed_response(
    func: Callable[P, Awaitable[R]],
) -> Callable[P, AsyncResponseContextManager[R]]:
    """``func`` as an ``async with`` block giving an :class:`AsyncAPIResponse`."""

    async def call(*args: P.args, **kwargs: P.kwargs) -> AsyncAPIResponse[R]:
        result = await func(*args, **kwargs)
        response, retries = _response_of(result)
        return AsyncAPIResponse(response, result, retries)

    @functools.wraps(func)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> AsyncResponseContextManager[R]:
        return AsyncResponseContextManager(call(*args, **kwargs))

    return wrapped


# -- requests ------------------------------------------------------------------------------------


async def _post(
    client: AsyncOpenAI,
    path: str,
    body: dict[str, Any],
    *,
    stream: bool,
    extra_headers: Headers,
    extra_query: Query,
    timeout: Any,
) -> tuple[httpx.Request, httpx.Response, Timings]:
    """Send ``body`` to the client's base URL, or for a route to its first target."""
    route = client._router.routes.get(body.get("model", ""))
    provider = None
    if route is not None:
        target = route.targets[0]
        provider = client._providers[target.provider]
        body = {**body, "model": target.model}
    request = await client._build_request(
        path,
        body,
        extra_headers=extra_headers,
        extra_query=extra_query,
        timeout=timeout,
        provider=provider,
    )
    response, timings = await client._send(request, read_body=not stream)
    return request, response, timings


async def _get(
    client: AsyncOpenAI, path: str, *, extra_headers: Headers, extra_query: Query, timeout: Any
) -> tuple[httpx.Request, httpx.Response]:
    """A GET on the client's base URL, with the headers and query a POST would have."""
    post = await client._build_request(
        path, {}, extra_headers=extra_headers, extra_query=extra_query, timeout=timeout
    )
    headers = {
        k: v for k, v in post.headers.items() if k.lower() not in ("content-length", "content-type")
    }
    limits = cast(dict[str, Any], post.extensions.get("timeout") or {})
    request = client._client.build_request(
        "GET",
        str(post.url),
        headers=headers,
        timeout=(
            limits.get("connect"),
            limits.get("read"),
            limits.get("write"),
            limits.get("pool"),
        ),
    )
    response, _ = await client._send(request, read_body=True)
    return request, response


def _body(required: dict[str, Any], params: dict[str, Any], extra_body: Query) -> dict[str, Any]:
    body = {k: v for k, v in required.items() if _given(v)}
    body.update((k, v) for k, v in params.items() if _given(v))
    if extra_body:
        body.update(extra_body)
    return body


# -- completions (legacy) ------------------------------------------------------------------------


class AsyncTextCompletions:
    """``client.completions``: openai's legacy text completions; every parameter passed through."""

    def __init__(self, client: AsyncOpenAI) -> None:
        self._client = client

    @functools.cached_property
    def with_raw_response(self) -> AsyncTextCompletionsWithRawResponse:
        return AsyncTextCompletionsWithRawResponse(self)

    @functools.cached_property
    def with_streaming_response(self) -> AsyncTextCompletionsWithStreamingResponse:
        return AsyncTextCompletionsWithStreamingResponse(self)

    @overload
    async def create(
        self,
        *,
        model: str,
        prompt: Any,
        stream: Literal[False] | None = ...,
        extra_headers: Headers = None,
        extra_query: Query = None,
        extra_body: Query = None,
        timeout: Any = ...,
        **params: Any,
    ) -> Completion: ...

    @overload
    async def create(
        self,
        *,
        model: str,
        prompt: Any,
        stream: Literal[True],
        extra_headers: Headers = None,
        extra_query: Query = None,
        extra_body: Query = None,
        timeout: Any = ...,
        **params: Any,
    ) -> AsyncStream[Completion]: ...

    @overload
    async def create(
        self,
        *,
        model: str,
        prompt: Any,
        stream: bool,
        extra_headers: Headers = None,
        extra_query: Query = None,
        extra_body: Query = None,
        timeout: Any = ...,
        **params: Any,
    ) -> Completion | AsyncStream[Completion]: ...

    async def create(
        self,
        *,
        model: str,
        prompt: Any,
        stream: Any = _NOT_GIVEN,
        extra_headers: Headers = None,
        extra_query: Query = None,
        extra_body: Query = None,
        timeout: Any = _NOT_GIVEN,
        **params: Any,
    ) -> Completion | AsyncStream[Completion]:
        """Create a completion; with ``stream=True`` an :class:`AsyncStream` of ``Completion``s.

        A stream is not sent again when it fails before its first token (chat streams are).
        """
        body = _body({"model": model, "prompt": prompt, "stream": stream}, params, extra_body)
        streamed = bool(body.get("stream"))
        request, response, timings = await _post(
            self._client,
            "completions",
            body,
            stream=streamed,
            extra_headers=extra_headers,
            extra_query=extra_query,
            timeout=timeout,
        )
        target = request.url.host
        if streamed:
            return AsyncStream[Completion](
                response=response,
                timings=timings,
                new_decoder=lambda: CompletionStreamDecoder(request=request, target=target),
            )
        completion = parse_body(
            response.content, Completion, request=request, target=target, response=response
        )
        if isinstance(completion, Completion):
            completion._request_id = response.headers.get("x-request-id")
        attach_response(completion, response, timings.retries)
        return completion


class AsyncTextCompletionsWithRawResponse:
    def __init__(self, completions: AsyncTextCompletions) -> None:
        self.create = to_raw_response(completions.create)


class AsyncTextCompletionsWithStreamingResponse:
    def __init__(self, completions: AsyncTextCompletions) -> None:
        self.create = to_streamed_response(completions.create)


# -- embeddings ----------------------------------------------------------------------------------


def decode_embeddings(response: CreateEmbeddingResponse) -> CreateEmbeddingResponse:
    """Turn base64 embeddings (little-endian float32) into lists of floats, as openai does."""
    if not response.data:
        raise ValueError("No embedding data received")
    for embedding in response.data:
        data = cast(object, embedding.embedding)
        if isinstance(data, str):
            values = array.array("f", base64.b64decode(data))
            if sys.byteorder == "big":
                values.byteswap()
            embedding.embedding = values.tolist()
    return response


class AsyncEmbeddings:
    """``client.embeddings``. Without ``encoding_format`` it asks for base64 (as openai does,
    a quarter of the bytes) and returns floats; an explicit format is returned untouched."""

    def __init__(self, client: AsyncOpenAI) -> None:
        self._client = client

    @functools.cached_property
    def with_raw_response(self) -> AsyncEmbeddingsWithRawResponse:
        return AsyncEmbeddingsWithRawResponse(self)

    @functools.cached_property
    def with_streaming_response(self) -> AsyncEmbeddingsWithStreamingResponse:
        return AsyncEmbeddingsWithStreamingResponse(self)

    async def create(
        self,
        *,
        input: Any,
        model: str,
        encoding_format: Any = _NOT_GIVEN,
        extra_headers: Headers = None,
        extra_query: Query = None,
        extra_body: Query = None,
        timeout: Any = _NOT_GIVEN,
        **params: Any,
    ) -> CreateEmbeddingResponse:
        """Create embeddings for ``input`` (a string, strings, or token lists)."""
        asked = _given(encoding_format)
        fields = {"model": model, "input": input}
        fields["encoding_format"] = encoding_format if asked else "base64"
        body = _body(fields, params, extra_body)
        request, response, timings = await _post(
            self._client,
            "embeddings",
            body,
            stream=False,
            extra_headers=extra_headers,
            extra_query=extra_query,
            timeout=timeout,
        )
        result = parse_body(
            response.content,
            CreateEmbeddingResponse,
            request=request,
            target=request.url.host,
            response=response,
        )
        if isinstance(result, CreateEmbeddingResponse):
            result._request_id = response.headers.get("x-request-id")
            if not asked:
                result = decode_embeddings(result)
        attach_response(result, response, timings.retries)
        return result


class AsyncEmbeddingsWithRawResponse:
    def __init__(self, embeddings: AsyncEmbeddings) -> None:
        self.create = to_raw_response(embeddings.create)


class AsyncEmbeddingsWithStreamingResponse:
    def __init__(self, embeddings: AsyncEmbeddings) -> None:
        self.create = to_streamed_response(embeddings.create)


# -- models --------------------------------------------------------------------------------------


class AsyncModelPager:
    """What ``models.list()`` returns, like openai's ``AsyncPaginator``: ``await`` it for the
    ``AsyncPage[Model]``, or iterate it with ``async for`` over the models."""

    def __init__(self, fetch: Callable[[], Awaitable[AsyncPage[Model]]]) -> None:
        self._fetch = fetch

    def __await__(self) -> Generator[Any, None, AsyncPage[Model]]:
        return self._fetch().__await__()

    async def __aiter__(self) -> AsyncIterator[Model]:
        page = await self._fetch()
        for model in page.data:
            yield model


class AsyncModels:
    """``client.models``: ``list()`` and ``retrieve()`` on the client's base URL."""

    def __init__(self, client: AsyncOpenAI) -> None:
        self._client = client

    @functools.cached_property
    def with_raw_response(self) -> AsyncModelsWithRawResponse:
        return AsyncModelsWithRawResponse(self)

    @functools.cached_property
    def with_streaming_response(self) -> AsyncModelsWithStreamingResponse:
        return AsyncModelsWithStreamingResponse(self)

    def list(
        self, *, extra_headers: Headers = None, extra_query: Query = None, timeout: Any = _NOT_GIVEN
    ) -> AsyncModelPager:
        """The models the base URL lists, as an awaitable and async-iterable page."""
        return AsyncModelPager(
            lambda: self._list(
                extra_headers=extra_headers, extra_query=extra_query, timeout=timeout
            )
        )

    async def _list(
        self, *, extra_headers: Headers = None, extra_query: Query = None, timeout: Any = _NOT_GIVEN
    ) -> AsyncPage[Model]:
        request, response = await _get(
            self._client,
            "models",
            extra_headers=extra_headers,
            extra_query=extra_query,
            timeout=timeout,
        )
        page = parse_body(
            response.content,
            AsyncPage[Model],
            request=request,
            target=request.url.host,
            response=response,
        )
        attach_response(page, response)
        return page

    async def retrieve(
        self,
        model: str,
        *,
        extra_headers: Headers = None,
        extra_query: Query = None,
        timeout: Any = _NOT_GIVEN,
    ) -> Model:
        """One model's details."""
        if not model:
            raise ValueError(f"Expected a non-empty value for `model` but received {model!r}")
        request, response = await _get(
            self._client,
            f"models/{model}",
            extra_headers=extra_headers,
            extra_query=extra_query,
            timeout=timeout,
        )
        result = parse_body(
            response.content, Model, request=request, target=request.url.host, response=response
        )
        attach_response(result, response)
        return result


class AsyncModelsWithRawResponse:
    def __init__(self, models: AsyncModels) -> None:
        self.list = to_raw_response(models._list)
        self.retrieve = to_raw_response(models.retrieve)


class AsyncModelsWithStreamingResponse:
    def __init__(self, models: AsyncModels) -> None:
        self.list = to_streamed_response(models._list)
        self.retrieve = to_streamed_response(models.retrieve)


# -- chat completions ----------------------------------------------------------------------------


class AsyncChatCompletionsWithRawResponse:
    def __init__(self, completions: AsyncChatCompletions) -> None:
        self.create = to_raw_response(completions.create)


class AsyncChatCompletionsWithStreamingResponse:
    def __init__(self, completions: AsyncChatCompletions) -> None:
        self.create = to_streamed_response(completions.create)
