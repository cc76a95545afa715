"""Hostile event streams: random and adversarial bytes, cut anywhere, through the SSE decoder and
the two chunk decoders. Only typed errors come out, the cuts never change the result, and memory
stays within the event-size limit.
"""

from __future__ import annotations

import itertools
import re
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmroute._errors import MalformedStreamError
from llmroute.protocols.anthropic import AnthropicStreamDecoder
from llmroute.protocols.openai import (
    ChatStreamDecoder,
    CompletionStreamDecoder,
    MalformedResponseError,
    parse_chat_completion,
)
from llmroute.transport._sse import ServerSentEvent, SSEDecodeError, SSEDecoder

from ..work import ScanCountingBuffer, assert_linear_work, count_lines

REQUEST = httpx.Request("POST", "https://fuzz.invalid/v1/chat/completions")
BOM = b"\xef\xbb\xbf"
SETTINGS = settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])

# -- streams --------------------------------------------------------------------------------------

_fragments = st.sampled_from(
    [
        b"data:",
        b"data: ",
        b"data",
        b"DATA:",
        b"event:",
        b"event: ",
        b"event: thread.run",
        b"event: message_stop",
        b"id:",
        b"id: 7",
        b"id: a\0b",
        b"retry:",
        b"retry: 1500",
        b"retry: 007",
        b"retry: -1",
        b"retry: 1" + b"0" * 5000,
        b"retry: \xd9\xa3",
        b"foo: bar",
        b":",
        b": keep-alive",
        b" ",
        b"\r",
        b"\n",
        b"\r\n",
        b"\n\n",
        b"\r\r",
        b"\r\n\r\n",
        BOM,
        b"\xef\xbb",
        b"\0",
        b"\xff",
        b"\xc3",
        b"\xa9",
        b"\xe2\x82",
        "é€😀".encode(),
        b"[DONE]",
        b" [DONE]",
        b"[DONE]x",
        b"[done]",
        b"{}",
        b"null",
        b"[]",
        b"{",
        b'{"error": {"message": "boom"}}',
        b'{"error": 0}',
        b'{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]}',
        b'{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}',
        b'{"choices": 5}',
        b'{"choices": [{"index": [1], "delta": 5}]}',
        b'{"id": 1, "choices": [{"delta": {"content": 7}}], "usage": 3}',
        b"[" * 3000,
        b"1" * 5000,
        b"x",
        b"1e400",
        b'"\\ud800"',
    ]
)
_field_lines = st.tuples(
    st.sampled_from([b"data", b"event", b"id", b"retry", b"foo", b"", b"DATA", b"dat"]),
    st.sampled_from([b":", b": ", b":  ", b"", b"::"]),
    st.sampled_from([b"", b"x", b"y z", b"12", b"0015", b"\0", b"\xff", b" lead", b"[DONE]"])
    | st.binary(max_size=6),
    st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b"\r\n\r\n", b"\r\r", b""]),
).map(b"".join)
_streams = st.one_of(
    st.binary(max_size=300),
    st.lists(_fragments | st.binary(max_size=8), max_size=30).map(b"".join),
    st.tuples(
        st.sampled_from([b"", BOM, b"\xef", b"\n"]),
        st.lists(_field_lines, max_size=20).map(b"".join),
    ).map(b"".join),
)


def _cuts(stream: bytes, points: Sequence[int]) -> list[bytes]:
    bounds = sorted({p % (len(stream) + 1) for p in points} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def _bytewise(stream: bytes) -> list[bytes]:
    """One byte at a time (the first 2000; the rest in one piece, to keep examples quick)."""
    return [stream[i : i + 1] for i in range(min(len(stream), 2000))] + [stream[2000:]]


_Outcome = tuple[list[Any], type[BaseException] | None]


def _run(
    feed: Callable[[bytes], list[Any]],
    close: Callable[[], list[Any]],
    chunks: list[bytes],
    allowed: type[BaseException] | tuple[type[BaseException], ...],
) -> _Outcome:
    """Everything a decoder gives for these chunks, and the type of the error it ends with."""
    out: list[Any] = []
    try:
        for chunk in chunks:
            out += feed(chunk)
        out += close()
    except allowed as exc:
        return out, type(exc)
    return out, None


def _sse(chunks: list[bytes], limit: int = 1 << 20) -> _Outcome:
    decoder = SSEDecoder(max_event_bytes=limit)
    return _run(decoder.feed, decoder.close, chunks, SSEDecodeError)


def _chat(chunks: list[bytes], limit: int = 1 << 20) -> _Outcome:
    decoder = ChatStreamDecoder(request=REQUEST, target="fuzz:model", max_event_bytes=limit)
    out = _run(decoder.feed, decoder.close, chunks, openai.APIError)
    if out[1] is not None:
        assert decoder.done  # an error ends the stream
        assert decoder.feed(b"data: {}\n\n") == []
    return out


def _anthropic(chunks: list[bytes], limit: int = 1 << 20) -> _Outcome:
    decoder = AnthropicStreamDecoder(
        request=REQUEST, target="fuzz:claude", include_usage=True, max_event_bytes=limit
    )
    out, error = _run(decoder.feed, decoder.close, chunks, openai.APIError)
    # Without ``created`` (the clock's second at message_start), so two runs compare equal.
    return [chunk.model_dump(exclude={"created"}, warnings=False) for chunk in out], error


# -- a reference: the WHATWG rules, line by line, on the whole stream -----------------------------


def _reference(stream: bytes) -> tuple[list[ServerSentEvent], bool]:
    """The events of a whole stream, and whether a field llmroute decodes is not UTF-8."""
    if stream.startswith(BOM):
        stream = stream[3:]
    lines = re.split(rb"\r\n|\r|\n", stream)[:-1]  # the last piece has no line end yet
    # Lines after the last blank one belong to an event that never ends: discarded unread.
    lines = lines[: max((i for i, line in enumerate(lines) if not line), default=-1) + 1]
    events: list[ServerSentEvent] = []
    data: list[bytes] = []
    event: bytes | None = None
    retry: int | None = None
    last_id: str | None = None
    try:
        for line in lines:
            if not line:
                if data:
                    name = event.decode() if event else None
                    events.append(
                        ServerSentEvent(b"\n".join(data).decode(), name or None, last_id, retry)
                    )
                data, event, retry = [], None, None
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"data":
                data.append(value)
            elif field == b"event":
                event = value
            elif field == b"id" and b"\0" not in value:
                last_id = value.decode()
            elif field == b"retry" and re.fullmatch(rb"[0-9]+", value):
                if len(value.lstrip(b"0")) <= 15:
                    retry = int(value)
    except UnicodeDecodeError:
        return events, True
    return events, False


# -- the SSE decoder ------------------------------------------------------------------------------


@SETTINGS
@given(_streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_sse_matches_the_reference_however_cut(stream: bytes, points: list[int]) -> None:
    expected, bad_utf8 = _reference(stream)
    whole = _sse([stream])
    assert _sse(_cuts(stream, points)) == whole
    assert _sse(_bytewise(stream)) == whole
    events, error = whole
    if bad_utf8:
        assert error is SSEDecodeError
        assert events == expected
    else:
        assert (events, error) == (expected, None)


@settings(max_examples=40)
@given(st.lists(_fragments, min_size=1, max_size=12).map(b"".join))
def test_sse_every_single_cut_gives_the_same(stream: bytes) -> None:
    whole = _sse([stream])
    for cut in range(1, len(stream)):
        assert _sse([stream[:cut], stream[cut:]]) == whole


@SETTINGS
@given(_streams, st.lists(st.integers(0, 10_000), max_size=12), st.integers(1, 64))
def test_sse_size_limit_is_the_same_however_cut(
    stream: bytes, points: list[int], limit: int
) -> None:
    whole = _sse([stream], limit)
    assert _sse(_cuts(stream, points), limit) == whole
    assert _sse(_bytewise(stream), limit) == whole
    for event in whole[0]:  # every event that came out is within the limit
        assert len(event.data.encode()) <= limit


def test_sse_errors_after_good_events_come_at_the_next_feed() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: \xff\n\ndata: b\n\n") == [ServerSentEvent("a")]
    with pytest.raises(SSEDecodeError, match="UTF-8"):
        decoder.feed(b"")
    decoder = SSEDecoder(max_event_bytes=20)
    assert decoder.feed(b"data: a\n\ndata: " + b"x" * 30) == [ServerSentEvent("a")]
    with pytest.raises(SSEDecodeError, match="max_event_bytes=20"):
        decoder.close()


def test_sse_huge_retry_is_ignored_not_a_crash() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"retry: " + b"9" * 5000 + b"\ndata: x\n\nretry: 0002500\ndata: y\n\n")
    assert events == [ServerSentEvent("x"), ServerSentEvent("y", retry=2500)]
    assert decoder.retry == 2500


# -- the event-size limit: memory stays bounded ---------------------------------------------------


@pytest.mark.parametrize("piece", [1, 7, 1000, 4096])
@pytest.mark.parametrize("line", [b"data: ", b": comment ", b"foo", b""])
def test_a_line_without_end_is_bounded(piece: int, line: bytes) -> None:
    limit = 10_000
    decoder = SSEDecoder(max_event_bytes=limit)
    stream = line + b"z" * (limit * 3)
    fed = 0
    with pytest.raises(SSEDecodeError, match=f"max_event_bytes={limit}"):
        for start in range(0, len(stream), piece):
            decoder.feed(stream[start : start + piece])
            fed += piece
            assert decoder.buffered <= limit + 1
    assert fed <= limit < fed + piece  # raised by the feed that passed the limit
    assert decoder.buffered == 0


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_many_lines_without_a_blank_line_are_bounded(eol: bytes) -> None:
    limit = 5_000
    decoder = SSEDecoder(max_event_bytes=limit)
    lines = 0
    with pytest.raises(SSEDecodeError, match=f"max_event_bytes={limit}"):
        for _ in range(10_000):
            decoder.feed(b"data: 0123456789" + eol)
            lines += 1
            assert decoder.buffered <= limit + 1
    assert lines * 17 <= limit < (lines + 1) * 17  # line ends count one byte


def test_chat_decoder_reports_the_limit_as_a_malformed_stream() -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target="fuzz:model", max_event_bytes=1000)
    with pytest.raises(MalformedStreamError, match="max_event_bytes=1000") as info:
        for _ in range(100):
            decoder.feed(b"data: " + b"y" * 100)
    assert info.value.target == "fuzz:model"
    assert decoder.done


def test_default_limit_holds_a_1gib_line_to_a_few_mib_of_memory() -> None:
    """A server streaming a line without end: the client keeps at most the default limit."""
    decoder = SSEDecoder()
    piece = b"a" * (1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(SSEDecodeError, match="max_event_bytes"):
            for _ in range(1024):  # 1 GiB, if it were all kept
                decoder.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * (1 << 20)


# -- linear time: no input makes decoding quadratic -----------------------------------------------


def _feed_all(pattern: bytes, n: int, piece: int) -> Callable[[], int]:
    """Decode ``pattern * n`` fed in ``piece``-byte chunks; return the work it took: Python lines
    executed, bytes the decoder's buffer touched, and the bytes fed (each chunk is scanned a
    constant number of times: for CR, for the blank line)."""
    stream = pattern * n

    def work() -> int:
        decoder = SSEDecoder(max_event_bytes=len(stream) + 1)
        buffer = decoder._buf = ScanCountingBuffer()  # type: ignore[misc]
        out: list[ServerSentEvent] = []

        def feed() -> None:
            for start in range(0, len(stream), piece):
                out.extend(decoder.feed(stream[start : start + piece]))

        lines = count_lines(feed)
        assert decoder._buf is buffer  # the decoder kept the counting buffer throughout
        return lines + buffer.scanned + len(stream)

    return work


@pytest.mark.parametrize(
    ("pattern", "piece"),
    [
        (b"data: x\n\n", 64),  # many events
        (b"data: x\n", 64),  # one event of many lines
        (b"\r", 3),  # only line ends
        (b"\n", 5),
        (b": c\r\n", 1),
        (b"x", 4096),  # one long line
        (b"id: 1\nretry: 5\nevent: e\ndata: x\r\n\r\n", 257),
    ],
)
def test_decoding_work_is_linear(pattern: bytes, piece: int) -> None:
    """Four times the stream, about four times the work (counted, not timed: tests/work.py)."""
    n = 20_000 // len(pattern) + 1
    assert_linear_work(lambda size: _feed_all(pattern, size, piece), n)


def test_rescanning_the_buffer_would_be_caught() -> None:
    """The counter sees the quadratic decoder it guards against: one that searches its whole
    buffer for a blank line at every chunk."""

    class Rescanning(ScanCountingBuffer):
        def rfind(self, sub: Any, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
            return super().rfind(sub, 0, end)

    def make(n: int) -> Callable[[], int]:
        stream = b"x" * n

        def work() -> int:
            decoder = SSEDecoder(max_event_bytes=len(stream) + 1)
            buffer = decoder._buf = Rescanning()  # type: ignore[misc]
            for start in range(0, len(stream), 64):
                decoder.feed(stream[start : start + 64])
            return buffer.scanned

        return work

    with pytest.raises(AssertionError, match="quadratic 16"):
        assert_linear_work(make, 20_000)


# -- the chunk decoders ---------------------------------------------------------------------------


def _events(draw: st.DrawFn) -> bytes:
    payload = draw(_fragments | st.binary(max_size=20))
    head = draw(st.sampled_from([b"", b"event: thread.x\n", b"id: 1\n", b": c\n", b"retry: 1\n"]))
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    return head + b"data: " + payload + eol + eol


_chat_streams = st.one_of(
    _streams,
    st.lists(st.composite(lambda draw: _events(draw))(), max_size=8).map(b"".join),
)


@SETTINGS
@given(_chat_streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_chat_decoder_raises_only_typed_errors(stream: bytes, points: list[int]) -> None:
    whole = _chat([stream])
    assert _chat(_cuts(stream, points)) == whole
    assert _chat(_bytewise(stream)) == whole
    error = whole[1]
    assert error is None or issubclass(error, openai.APIError)


@SETTINGS
@given(_chat_streams, st.integers(1, 80))
def test_chat_decoder_size_limit_is_typed_and_cut_independent(stream: bytes, limit: int) -> None:
    whole = _chat([stream], limit)
    assert _chat(_bytewise(stream), limit) == whole


@pytest.mark.parametrize(
    "done", [b"[DONE]", b"[DONE] ", b"[DONE]\0", b"[DONE]{}", b"[DONE]\xc3\xa9"]
)
def test_done_variants_end_the_stream(done: bytes) -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target="fuzz:model")
    first = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
    chunks = decoder.feed(first + b"data: " + done + b"\n\n" + b"data: \xff garbage\n\n")
    assert len(chunks) == 1 and decoder.done
    assert decoder.feed(b"data: {\n\n") == [] and decoder.close() == []
    assert decoder.text == "a"


@pytest.mark.parametrize("not_done", [b" [DONE]", b"[done]", b"[DON", b'"[DONE]"'])
def test_near_done_is_not_done(not_done: bytes) -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target="fuzz:model")
    try:
        decoder.feed(b"data: " + not_done + b"\n\n")
    except MalformedStreamError:
        pass
    assert not decoder.finished


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 100_000,
        b"[" * 900 + b"]" * 900,
        b'{"choices": ' + b"[" * 900 + b"]" * 900 + b"}",
        b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"arguments": '
        + b"[" * 900
        + b"]" * 900
        + b"}}]}}]}",
        b'{"choices": [{"index": 0, "delta": {"content": "' + b"x" * 2_000_000 + b'"}}]}',
        b'{"choices": [{"index": ' + b"9" * 5000 + b', "delta": {"content": "x"}}]}',
        b'{"choices": [' + b'{"index": 1, "delta": {}},' * 20_000 + b"{}]}",
    ],
)
def test_deep_and_huge_chunks(payload: bytes) -> None:
    for make in (_chat, _anthropic):
        _, error = make([b"data: " + payload + b"\n\n"], 1 << 24)
        assert error is None or issubclass(error, openai.APIError)


# -- the Anthropic decoder on the same bytes ------------------------------------------------------


@SETTINGS
@given(_chat_streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_anthropic_decoder_raises_only_typed_errors_on_any_bytes(
    stream: bytes, points: list[int]
) -> None:
    whole = _anthropic([stream])
    assert _anthropic(_cuts(stream, points)) == whole
    _, error = whole
    assert error is None or issubclass(error, openai.APIError)


@SETTINGS
@given(_chat_streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_completion_decoder_raises_only_typed_errors(stream: bytes, points: list[int]) -> None:
    def run(chunks: list[bytes]) -> _Outcome:
        decoder = CompletionStreamDecoder(request=REQUEST, target="fuzz:model")
        return _run(decoder.feed, decoder.close, chunks, openai.APIError)

    assert run(_cuts(stream, points)) == run([stream])


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xff{}", b"[" * 100_000, b"{" * 3000, b"1" * 5000, b'{"a": ' + b"9" * 5000 + b"}"],
)
def test_whole_bodies_that_are_not_json(raw: bytes) -> None:
    with pytest.raises(MalformedResponseError, match="fuzz:model") as info:
        parse_chat_completion(raw, request=REQUEST, target="fuzz:model")
    assert isinstance(info.value, openai.APIResponseValidationError)
