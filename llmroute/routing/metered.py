"""A routed stream openai's machinery reads itself (a legacy completion on a route): its body
is decoded on its way to the caller, so that when it ends its route report says what the
vendor billed and the client's metrics count it.

The caller's bytes are passed on unchanged; a copy goes through the protocol's decoder (a
:class:`~llmroute.protocols.reader.StreamReader`). When the stream ends (read to its end,
closed by openai at ``[DONE]`` or by the caller, or broken) the winning attempt gets the usage
of the vendor's last usage chunk (sent when the caller asked for
``stream_options.include_usage``) or, without one, the token chunks counted (its cost then an
estimate, docs/cost.md), and ``on_end`` is called once.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from .._errors import describe_error
from .._types import AttemptReport, Timings
from ..protocols import adapter_for
from ..protocols.reader import StreamReader
from .route import RouteTarget

__all__ = ["MeteredStream", "meter"]

_PLAIN = frozenset({"", "identity"})
_WINDOWS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The content encodings the standard library inflates, by their zlib window: the copy of such
a body is decompressed before it is decoded (``br`` and ``zstd`` need packages llmroute does
not install: such a body's answer tokens are not counted)."""


class _Inflater:
    """A compressed body's bytes, decompressed as they come (HTTP's ``deflate`` is zlib's
    format, though some servers send it raw: tried when the first bytes are not zlib's)."""

    def __init__(self, window: int) -> None:
        self._window = window
        self._inflate = zlib.decompressobj(window)
        self._started = False

    def __call__(self, data: bytes | None) -> list[bytes | None]:
        """What to decode for ``data`` (``None``: the body ended, which is passed on)."""
        if data is None:
            rest = self._inflate.flush()
            return [rest, None] if rest else [None]
        try:
            out = self._inflate.decompress(data)
        except zlib.error:
            if self._started or self._window != zlib.MAX_WBITS:
                raise
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._inflate.decompress(data)
        self._started = True
        return [out] if out else []


class MeteredStream(httpx.AsyncByteStream):
    """A response body read by openai, decoded on the side (see the module's docstring)."""

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        reader: StreamReader | None,
        record: AttemptReport,
        on_end: Callable[[BaseException | None, bool], None],
        inflate: _Inflater | None = None,
    ) -> None:
        self._inner = inner
        self._reader = reader
        self._inflate = inflate
        self._record = record
        self._on_end = on_end
        self._usage: Any = None
        self._ended = False
        self._iterator: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> MeteredStream:  # type: ignore[override]
        return self  # an iterator, not an async generator: nothing left for GC to finalize

    async def __anext__(self) -> bytes:
        if self._iterator is None:
            self._iterator = self._inner.__aiter__()
        try:
            data = await self._iterator.__anext__()
        except StopAsyncIteration:
            self._feed(None)
            self._end(None)
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        self._feed(data)
        return data

    async def aclose(self) -> None:
        """Close the body (openai does at ``[DONE]``, before its end): the inner body's
        iterator too, so that no async generator is left for the garbage collector."""
        iterator, self._iterator = self._iterator, None
        try:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                await close()
        finally:
            try:
                await self._inner.aclose()
            finally:
                self._end(None)

    def _feed(self, data: bytes | None) -> None:
        reader = self._reader
        if reader is None:
            return
        try:
            if self._inflate is None:
                chunks = reader.feed(data)
            else:
                chunks = [chunk for piece in self._inflate(data) for chunk in reader.feed(piece)]
        except Exception:  # the caller's stream raises its own error; the count stops here
            self._reader = None
            return
        for chunk in chunks:
            usage = getattr(chunk, "usage", None)
            if usage:
                self._usage = usage

    def _end(self, exc: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        record, reader = self._record, self._reader
        decoder = reader.decoder if reader is not None else None
        whole = decoder is not None and (decoder.done or decoder.finished)
        usage = self._usage
        counted = getattr(usage, "completion_tokens", None) if usage is not None else None
        if type(counted) is int:
            record.usage, record.tokens, record.tokens_counted = usage, counted, "usage"
        else:
            record.tokens = decoder.tokens if decoder is not None else 0
            record.tokens_counted = "deltas"
        if exc is not None and not whole and isinstance(exc, Exception):
            record.outcome, record.error = "interrupted", describe_error(exc)
        self._on_end(exc, whole)


def meter(
    response: httpx.Response,
    target: RouteTarget,
    kind: str,
    record: AttemptReport,
    timings: Timings,
    on_end: Callable[[BaseException | None, bool], None],
) -> None:
    """Decode ``response``'s streamed body on its way to openai (see the module's docstring).
    A copy of a gzip or deflate body is decompressed first; a body in another content encoding
    (``br``, ``zstd``, several) is passed on without being decoded: its answer tokens are then
    not counted."""
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    reader, inflate = None, None
    encoding = response.headers.get("content-encoding", "").strip().lower()
    window = _WINDOWS.get(encoding)
    if encoding in _PLAIN or window is not None:
        decoder = adapter_for(target.protocol).stream_decoder(
            kind, request=response.request, target=target.name, body={}, include_usage=True
        )
        reader = StreamReader(decoder, timings)
        inflate = _Inflater(window) if window is not None else None
    response.stream = MeteredStream(stream, reader, record, on_end, inflate)
