from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmroute.transport._sse import ServerSentEvent, SSEDecodeError, SSEDecoder


def decode(*chunks: bytes, **kwargs: int) -> list[ServerSentEvent]:
    decoder = SSEDecoder(**kwargs)
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def bytewise(stream: bytes) -> list[ServerSentEvent]:
    return decode(*(stream[i : i + 1] for i in range(len(stream))))


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (b"data: hello\n\n", [ServerSentEvent("hello")]),
        (b"data: a\n\ndata: b\n\n", [ServerSentEvent("a"), ServerSentEvent("b")]),
        (b"data: a\r\n\r\n", [ServerSentEvent("a")]),
        (b"data: a\r\rdata: b\r\r", [ServerSentEvent("a"), ServerSentEvent("b")]),
        (b"data: a\r\n\ndata: b\n\r\n", [ServerSentEvent("a"), ServerSentEvent("b")]),
        (b"data: one\ndata: two\ndata:\n\n", [ServerSentEvent("one\ntwo\n")]),
        (b"data:no-space\n\n", [ServerSentEvent("no-space")]),
        (b"data:  two spaces\n\n", [ServerSentEvent(" two spaces")]),
        (b"data\n\n", [ServerSentEvent("")]),
        (b"data:\n\n", [ServerSentEvent("")]),
        (b": comment\ndata: x\n: another\n\n", [ServerSentEvent("x")]),
        (b": keep-alive\n\n\n\n\ndata: x\n\n", [ServerSentEvent("x")]),
        (b"event: delta\ndata: x\n\n", [ServerSentEvent("x", event="delta")]),
        (b"event:\ndata: x\n\n", [ServerSentEvent("x")]),
        (b"event: ping\n\n", []),
        (
            b"id: 7\ndata: x\n\ndata: y\n\n",
            [ServerSentEvent("x", id="7"), ServerSentEvent("y", id="7")],
        ),
        (b"id: 1\0\ndata: x\n\n", [ServerSentEvent("x")]),
        (b"id\ndata: x\n\n", [ServerSentEvent("x", id="")]),
        (
            b"retry: 1500\ndata: x\n\ndata: y\n\n",
            [ServerSentEvent("x", retry=1500), ServerSentEvent("y")],
        ),
        (b"retry: 15x\ndata: x\n\n", [ServerSentEvent("x")]),
        (b"retry: -1\ndata: x\n\n", [ServerSentEvent("x")]),
        (b"foo: bar\ndata: x\nDATA: y\n\n", [ServerSentEvent("x")]),
        (b"data: a:b: c\n\n", [ServerSentEvent("a:b: c")]),
        (b"\xef\xbb\xbfdata: bom\n\n", [ServerSentEvent("bom")]),
        (b"data: \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\n\n", [ServerSentEvent("é€😀")]),
        (b"data: unterminated\n", []),
        (b"data: unterminated", []),
        (b"data: [DONE]\n\n", [ServerSentEvent("[DONE]")]),
    ],
)
def test_rules(stream: bytes, expected: list[ServerSentEvent]) -> None:
    assert decode(stream) == expected
    assert bytewise(stream) == expected


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    assert decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [ServerSentEvent("a\nb")]
    assert decode(b"data: a\r", b"", b"\n\r\n") == [ServerSentEvent("a")]


def test_events_come_out_as_soon_as_complete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\ndata: b\n\ndata: c") == [ServerSentEvent("a"), ServerSentEvent("b")]
    assert decoder.feed(b"\n\n") == [ServerSentEvent("c")]


def test_last_event_id_and_retry_are_kept_on_the_decoder() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 42\nretry: 300\n\n")
    assert (decoder.last_event_id, decoder.retry) == ("42", 300)


def test_multibyte_character_split_across_chunks() -> None:
    stream = "data: 日本語 ok\n\n".encode()
    for cut in range(len(stream)):
        assert decode(stream[:cut], stream[cut:]) == [ServerSentEvent("日本語 ok")]


def test_invalid_utf8_raises() -> None:
    with pytest.raises(SSEDecodeError, match="UTF-8"):
        decode(b"data: \xff\n\n")
    with pytest.raises(SSEDecodeError, match="UTF-8"):
        decode(b"event: \xff\ndata: x\n\n")


def test_size_limit_whole_and_chunked() -> None:
    big = b"data: " + b"x" * 100 + b"\n\n"
    assert decode(big, max_event_bytes=106) == [ServerSentEvent("x" * 100)]
    with pytest.raises(SSEDecodeError, match=r"max_event_bytes=105 \(105 bytes\)"):
        decode(big, max_event_bytes=105)
    with pytest.raises(SSEDecodeError, match=r"max_event_bytes=2048 \(2 KiB\)$"):
        decode(b"data: " + b"y" * 3000 + b"\n\n", max_event_bytes=2048)
    with pytest.raises(SSEDecodeError, match="max_event_bytes=105"):
        decode(*(big[i : i + 7] for i in range(0, len(big), 7)), max_event_bytes=105)
    multi = b"data: " + b"x" * 40 + b"\ndata: " + b"y" * 40 + b"\n\n"
    with pytest.raises(SSEDecodeError):
        decode(b"data: ok\n\n" + multi, max_event_bytes=60)


def test_unterminated_event_cannot_grow_without_limit() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    with pytest.raises(SSEDecodeError, match="max_event_bytes=1000"):
        for _ in range(1000):
            decoder.feed(b"data: " + b"z" * 50 + b"\n")


def test_many_small_events_are_not_limited_together() -> None:
    stream = b"data: 0123456789\n\n" * 100
    assert len(decode(stream, max_event_bytes=20)) == 100


# Property: random events, serialized with random line ends and cut at random byte boundaries,
# decode to the same events as the whole stream and as the list they were made from.

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\0"))
_name = st.one_of(
    st.none(), st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1)
)


@st.composite
def _streams(draw: st.DrawFn) -> tuple[bytes, list[ServerSentEvent]]:
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    mixed = draw(st.booleans())
    out: list[str] = []
    expected: list[ServerSentEvent] = []
    last_id: str | None = None

    previous = [""]

    def end() -> str:
        # Mixed line ends, but never a CR right before an LF: that would be one CRLF line end.
        choices = ["\r\n", "\r"] if previous[0] == "\r" else ["\n", "\r\n", "\r"]
        previous[0] = draw(st.sampled_from(choices)) if mixed else eol
        return previous[0]

    if draw(st.booleans()):
        out.append(": hello" + end())
    for _ in range(draw(st.integers(0, 6))):
        lines = draw(st.lists(_text, min_size=1, max_size=4))
        event = draw(_name)
        event_id = draw(st.one_of(st.none(), _text))
        retry = draw(st.one_of(st.none(), st.integers(0, 10**6)))
        if event is not None:
            out.append(f"event: {event}{end()}")
        for line in lines:
            if draw(st.booleans()):
                out.append(f": {draw(_text)}{end()}")
            space = " " if line.startswith(" ") or draw(st.booleans()) else ""
            out.append(f"data:{space}{line}{end()}")
        if event_id is not None:
            out.append(f"id: {event_id}{end()}")
            last_id = event_id
        if retry is not None:
            out.append(f"retry: {retry}{end()}")
        out.extend(end() for _ in range(draw(st.integers(1, 3))))
        expected.append(ServerSentEvent("\n".join(lines), event or None, last_id, retry))
    return "".join(out).encode(), expected


@settings(max_examples=300, deadline=None)
@given(_streams(), st.lists(st.integers(0, 10_000), max_size=20))
def test_chunking_does_not_change_events(
    case: tuple[bytes, list[ServerSentEvent]], cuts: list[int]
) -> None:
    stream, expected = case
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode(stream) == expected
    assert decode(*chunks) == expected
