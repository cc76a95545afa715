"""Reading a routed answer after its first token: the chunks the caller iterates.

The engine's race ends with a :class:`Ready` attempt (its first token decoded, the rest of its
stream unread). :class:`Answer` reads on from there: it passes each chunk to the caller the
moment it is decoded (one id for the whole answer, usage the caller did not ask for left out),
bounds the pauses between chunks (the stall deadline), and decides at the stream's end whether
the answer is whole. A stream that breaks first is handed to the engine's continuation (the
``proceed`` callable it was given), whose stream the caller then reads on without a splice; the
answer's tokens are kept in its :class:`~.accounts.TokenAccount`. Live stats get the stream's
pace and pauses once it completes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx
from openai.types.chat import ChatCompletionChunk

from .._errors import (
    APIError,
    APITimeoutError,
    StallTimeout,
    map_transport_errors,
    stream_ended,
)
from .._types import AttemptReport, RouteReport, Timings
from ..protocols.openai import (
    ChatStreamDecoder,
    is_preamble_chunk,
    is_token_chunk,
    response_text_delta,
)
from ..protocols.reader import StreamReader
from ..transport import bound_wait, close_quietly
from .accounts import TokenAccount
from .continuation import splice_for
from .route import Route, RouteTarget
from .splice import REASONING_FIELDS, ContinuationMismatch, Splice
from .stats import (
    STALL_STREAM_GAPS,
    LiveStats,
    TargetStats,
    stall_deadline,
    stream_stall_deadline,
)

__all__ = [
    "Answer",
    "Ready",
    "content_kind",
    "plain_answer",
    "stall_deadline_of",
    "stalls_from_stream",
    "won_attempt",
]

Proceed = Callable[["Ready", APIError, bool], Awaitable["Ready | None"]]
"""Continues a broken answer (the engine's): the continuing attempt, or ``None`` when the
answer already holds the caller's ``max_tokens``; raises StreamInterrupted if it cannot."""


@dataclass(slots=True)
class Ready:
    """An attempt that produced its first token (or its whole answer, when not streamed):
    its stream's reader, the body's ``receive`` and the chunks decoded so far."""

    target: RouteTarget
    response: httpx.Response
    timings: Timings
    reader: StreamReader | None = None
    receive: Callable[[], Awaitable[bytes | None]] | None = None
    buffered: list[ChatCompletionChunk] = field(default_factory=list)
    completion: Any = None
    completion_usage: Any = None
    """A whole answer's usage as its vendor sent it (:meth:`ProtocolAdapter.answer_usage`)."""

    @property
    def decoder(self) -> ChatStreamDecoder | None:
        return self.reader.decoder if self.reader is not None else None


def content_kind(delta: Any) -> Literal["text", "reasoning"] | None:
    """What a delta (or message) carries: plain ``"text"``, ``"reasoning"`` beside or instead
    of it (:data:`.splice.REASONING_FIELDS`), or ``None`` for tool calls or a refusal (an answer
    that cannot be continued as text)."""
    if delta.tool_calls or delta.function_call or delta.refusal:
        return None
    extra = delta.__pydantic_extra__
    if extra and any(extra.get(key) for key in REASONING_FIELDS):
        return "reasoning"
    return "text"


def plain_answer(completion: Any) -> str | None:
    """The text of a completion whose only choice is a plain text message, else ``None``."""
    choices = getattr(completion, "choices", None)
    if not choices or len(choices) != 1:
        return None
    message = choices[0].message
    content = message.content
    if not isinstance(content, str) or content_kind(message) != "text":
        return None
    return content


def won_attempt(report: RouteReport, target: str) -> AttemptReport | None:
    """The report of ``target``'s attempt that is serving the answer now."""
    for record in reversed(report.attempts):
        if record.target == target and record.outcome == "won":
            return record
    return None


def stall_deadline_of(route: Route, stats: TargetStats) -> float | None:
    """Seconds a stream from the target of ``stats`` may send nothing before it counts as
    broken: the route's ``stall_timeout``, or with ``"auto"`` from the target's live pauses
    (:func:`~.stats.stall_deadline`)."""
    setting = route.stall_timeout
    if setting != "auto":
        return setting
    cap = route.first_token_timeout or 30.0
    return stall_deadline(stats.gap_quantile(0.99), cap=cap)


def stalls_from_stream(route: Route, stats: TargetStats) -> bool:
    """Whether a stream from the target of ``stats`` sets its own deadline between chunks once
    it has shown a few pauses (:func:`~.stats.stream_stall_deadline`): with ``"auto"`` while
    the target has too few streams measured for its live statistic."""
    return route.stall_timeout == "auto" and stats.gap_quantile(0.99) is None


class _AtLimit(Exception):
    """The answer reached the caller's ``max_tokens``: it ends with these chunks."""

    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = chunks


class _Read:
    """The reading of one attempt's stream: its deadline between chunks and what it shows."""

    __slots__ = (
        "gaps",
        "hide_usage",
        "in_transport",
        "kept",
        "longest",
        "own",
        "reader",
        "ready",
        "receive",
        "request",
        "stall",
        "strip_continuous",
        "unbounded",
        "usage",
    )

    def __init__(self, answer: Answer, ready: Ready) -> None:
        reader, receive = ready.reader, ready.receive
        assert reader is not None and receive is not None
        self.ready, self.reader, self.receive = ready, reader, receive
        self.request = ready.response.request
        target = ready.target
        stats = answer.stats.target(target.name)
        stall = stall_deadline_of(answer.route, stats)
        self.in_transport, read_timeout = (
            bound_wait(ready.response, stall) if stall is not None else (False, None)
        )
        if read_timeout is not None and stall is not None and read_timeout < stall:
            stall = None  # the read timeout comes first: it is the deadline
        self.stall = stall
        self.unbounded = stall is None or self.in_transport
        """Reads wait without a deadline of the answer's own (none, or the transport's)."""
        self.own = stall is not None and stalls_from_stream(answer.route, stats)
        account = answer.account
        # Usage llmroute asked for, not the caller: it is counted, and not shown.
        self.hide_usage = not account.usage_asked and answer.asks_usage(target)
        self.strip_continuous = target.stream_usage_continuous and not account.continuous_asked
        self.gaps, self.longest = 0, 0.0
        self.kept = account.delivered  # the tokens of the answer so far, counted low
        self.usage: Any = None
        """This attempt's newest usage, as its vendor sent it (before it is combined)."""

    def timed_out(self, exc: APITimeoutError) -> APIError:
        """The failure of a read that timed out: a stall when the wait's bound was the stall's."""
        if self.in_transport and self.stall is not None:
            return StallTimeout(self.request, target=self.ready.target.name, seconds=self.stall)
        return exc

    def paused(self, waited: float) -> None:
        """A read waited ``waited`` seconds: after a few pauses, a stream that sets its own
        deadline (``own``) takes it from the longest of them."""
        self.gaps, self.longest = self.gaps + 1, max(self.longest, waited)
        if self.gaps >= STALL_STREAM_GAPS and self.stall is not None:  # its own pauses
            self.own = False
            first = self.ready.timings.first_token
            self.stall = stream_stall_deadline(self.longest, first, prior=self.stall)
            if self.in_transport:
                bound_wait(self.ready.response, self.stall)


class Answer:
    """The chunks of one routed stream after its first token, continued across breaks.

    ``first`` is the winner of the race; ``asks_usage(target)`` says whether llmroute asked
    ``target`` for usage the caller may not have asked for; ``proceed`` continues a broken
    answer (:data:`Proceed`); ``answered(target, text)`` tells the policy a plain text answer
    completed (``None``: nobody asked); ``finish`` ends the winner's time in flight.
    """

    def __init__(
        self,
        first: Ready,
        account: TokenAccount,
        *,
        route: Route,
        stats: LiveStats,
        report: RouteReport,
        clock: Callable[[], float],
        continuable: bool,
        asks_usage: Callable[[RouteTarget], bool],
        proceed: Proceed,
        answered: Callable[[str, str], None] | None,
        finish: Callable[[], None],
    ) -> None:
        self.first = first
        self._timings = first.timings
        self.account = account
        self.route = route
        self.stats = stats
        self.report = report
        self.clock = clock
        self.asks_usage = asks_usage
        self._proceed = proceed
        self._answered = answered
        self._finish = finish
        self.complete = False
        self.longest_gap = 0.0
        """The longest pause between chunks of the first stream (a sample when it completes)."""
        self._continuable = continuable
        self._first_id: str | None = None
        self._template: ChatCompletionChunk | None = None
        self._skipping = False
        """A continuation's opening chunks repeat what the caller has: they are skipped."""
        self._splice: Splice | None = None
        """A continuing stream's reasoning and echo, stripped."""
        self._read: _Read | None = None
        """The stream being read now."""

    async def chunks(self, on_switch: Callable[[httpx.Response], None]) -> AsyncIterator[Any]:
        """The answer's chunks, continued on another target if the winner breaks mid-way."""
        ready, admit, clock = self.first, self._admit, self.clock
        try:
            while True:
                read = self._read = _Read(self, ready)
                reader, receive, unbounded = read.reader, read.receive, read.unbounded
                decoder, feed = reader.decoder, reader.feed
                failure: APIError | None = None
                try:
                    with map_transport_errors(read.request):
                        buffered, ready.buffered = ready.buffered, []
                        while True:
                            for chunk in buffered:
                                if admit(chunk, read):
                                    yield chunk
                            if decoder.done or reader.ended:
                                break
                            waited = clock()
                            data = await (receive() if unbounded else self._bounded(read))
                            waited = clock() - waited
                            if waited > self.longest_gap and ready is self.first:
                                self.longest_gap = waited
                            if read.own:  # until this stream's own pauses set its deadline
                                read.paused(waited)
                            buffered = feed(data)
                except _AtLimit as end:  # past the caller's limit: the answer ends here
                    for chunk in end.chunks:
                        yield chunk
                    self._completed(read)
                    return
                except APITimeoutError as exc:
                    failure = read.timed_out(exc)
                except APIError as exc:
                    failure = exc
                failure = self._verdict(read, failure)
                if failure is None:
                    return
                self._bill(read)
                new = await self._proceed(ready, failure, self._continuable)
                if new is None:  # the answer already holds the tokens the caller asked for
                    for chunk in self._ended_at_limit():
                        yield chunk
                    return
                ready = self._switch(new, on_switch)
        finally:
            if not self.complete and self._read is not None:
                self._cut(self._read)
            timings = self.first.timings
            if timings.total is None:
                timings.total = clock() - timings.started_at
            await close_quietly(ready.response)
            self._finish()

    def _ended_at_limit(self) -> list[Any]:
        """The chunks that end an answer which reached the caller's limit as it broke."""
        account = self.account
        self.complete = True
        timings = self.first.timings
        timings.total = self.clock() - timings.started_at
        return account.ending(self._template, self._first_id, account.delivered)

    def _switch(self, new: Ready, on_switch: Callable[[httpx.Response], None]) -> Ready:
        """A continuation took over: the caller reads on from ``new``, past what it repeats."""
        self._splice = splice_for(new.target, new.response.request, self.account.text)
        on_switch(new.response)
        self._skipping = True
        return new

    def _admit(self, chunk: Any, read: _Read) -> bool:
        """Whether the caller gets ``chunk``, counted in the account (its id and usage may be
        changed in place); raises :class:`_AtLimit` past the caller's ``max_tokens``."""
        if type(chunk) is not ChatCompletionChunk:
            return self._event(chunk)
        account = self.account
        splice = self._splice
        if splice is not None:
            admitted = splice.admit(chunk)
            account.uncounted = account.uncounted or splice.stripped
            if not admitted:
                return False
        if self._skipping:
            if is_preamble_chunk(chunk):
                return False
            self._skipping = False
        first_id = self._first_id
        if first_id is None:
            self._first_id = chunk.id
        elif chunk.id != first_id:
            chunk.id = first_id
        self._template = chunk
        text = account.text
        before = len(text)
        for choice in chunk.choices:
            delta = choice.delta
            kind = content_kind(delta) if choice.index == 0 else None
            if kind is None:
                self._continuable = False
                continue
            if kind == "reasoning":
                # Shown, not text; the answer's text can still be continued once it has begun.
                account.reasoned = account.uncounted = True
            if delta.content:
                text.append(delta.content)
        if is_token_chunk(chunk):
            self._timings.tokens = account.tokens = account.tokens + 1
        if chunk.usage is not None and not self._usage(chunk, read):
            return False
        if read.hide_usage:  # not even the vendor's "usage": null
            chunk.model_fields_set.discard("usage")
        if account.delivered and account.limit is not None:
            self._count(before, read, account.limit)
        return True

    def _usage(self, chunk: ChatCompletionChunk, read: _Read) -> bool:
        """A chunk with the vendor's usage: counted, then shown only as the caller asked;
        whether the chunk is still for the caller."""
        read.usage = chunk.usage
        self.account.usage_seen(chunk, chunk.usage)
        if read.hide_usage:
            if not chunk.choices:
                return False
            chunk.usage = None
        elif chunk.choices and read.strip_continuous:
            chunk.usage = None
        return True

    def _count(self, before: int, read: _Read, limit: int) -> None:
        """A continued answer's tokens against the caller's ``limit`` (counted low)."""
        account = self.account
        count = account.combined()
        if count > limit:
            account.cut(before)
            raise _AtLimit(account.ending(self._template, self._first_id, read.kept))
        read.kept = count

    def _event(self, chunk: Any) -> bool:
        """Another API's event (Responses) or none (a ``null`` event): counted, never
        continued; whether the caller gets it."""
        if self._skipping:
            if is_preamble_chunk(chunk):
                return False
            self._skipping = False
        self._continuable = False
        kind = getattr(chunk, "type", None)
        if type(kind) is str and kind.endswith(".delta"):
            account = self.account
            self._timings.tokens = account.tokens = account.tokens + 1
            piece = response_text_delta(chunk)
            if piece:
                account.text.append(piece)
        return True

    async def _bounded(self, read: _Read) -> bytes | None:
        """The stream's next bytes within the stall deadline (a transport that cannot bound
        its own waits: a cancel scope does it)."""
        stall = read.stall
        assert stall is not None
        with anyio.CancelScope(deadline=anyio.current_time() + stall):
            return await read.receive()
        raise StallTimeout(read.request, target=read.ready.target.name, seconds=stall)

    def _verdict(self, read: _Read, failure: APIError | None) -> APIError | None:
        """At a stream's end: ``None`` if the answer is whole (recorded as such), else why not."""
        decoder, ready = read.reader.decoder, read.ready
        splice = self._splice
        if splice is not None and failure is None and (decoder.finished or decoder.done):
            failure = splice.unfinished()  # it ended inside the echo: not spliced
        if not isinstance(failure, ContinuationMismatch) and (
            decoder.finished or (decoder.done and failure is None)
        ):
            # Every choice has its finish_reason: the answer is whole, even if the
            # connection broke before the usage chunk or [DONE]. (A decoder that
            # raised is done too, but its answer is not whole.)
            self._completed(read)
            if self._continuable:  # one choice of plain text
                name = ready.target.name
                self.account.calibrate(decoder, self.stats.target(name).token_counts)
                if self._answered is not None:
                    self._answered(name, "".join(self.account.text))
            return None
        return stream_ended(read.request) if failure is None else failure

    def _bill(self, read: _Read) -> AttemptReport | None:
        """The attempt's own usage as its vendor sent it, on its record (what it is priced
        from: :mod:`.costs`)."""
        record = won_attempt(self.report, read.ready.target.name)
        if record is not None:
            vendor = read.reader.decoder.vendor_usage
            record.usage = vendor if vendor is not None else read.usage
        return record

    def _cut(self, read: _Read) -> None:
        """The stream ended before its answer did and did not break (its caller closed it,
        or left): the attempt serving it keeps the usage its vendor had sent by then
        (Anthropic's ``message_start`` counts the prompt and its cache reads) and the tokens
        it delivered, and is marked ``cut`` unless every choice had finished."""
        record = self._bill(read)
        if record is None:  # not the winner's any more (it broke: priced as broken)
            return
        decoder = read.reader.decoder
        counts = self.stats.target(read.ready.target.name).token_counts
        record.tokens, record.tokens_counted, record.tokens_estimate = self.account.delivered_by(
            read.ready.decoder, counts
        )
        record.cut = not (decoder.finished or decoder.done)

    def _completed(self, read: _Read) -> None:
        self.complete = True
        ready = read.ready
        stats = self.stats.target(ready.target.name)
        account = self.account
        record = self._bill(read)
        if record is not None:
            record.tokens, record.tokens_counted, record.tokens_estimate = account.delivered_by(
                ready.decoder, stats.token_counts
            )
        timings = self.first.timings
        timings.total = self.clock() - timings.started_at
        if ready is self.first and account.tokens > 1:
            span = timings.total - (timings.first_token or 0.0)
            itl = span / (account.tokens - 1) if span > 0 else None
            stats.record_stream(itl, (account.tokens - 1) / span if span > 0 else None)
            stats.record_gap(self.longest_gap)
