"""One attempt of a request on one target (:class:`Attempt`), until its first token (its whole
answer when not streamed): sent through the client's :data:`~.route.Sender`, read with the
target's protocol adapter, and counted in the target's stats and health and in the route
report, as it wins, loses, fails or is cancelled."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

import anyio
from openai.types.chat import ChatCompletionChunk

from .._errors import (
    APIStatusError,
    FirstTokenTimeout,
    RequestBodyError,
    describe_error,
    map_transport_errors,
    stream_ended,
)
from .._types import AttemptReport
from ..protocols import adapter_for
from ..protocols.reader import StreamReader
from ..transport import body_receiver, close_quietly, replay_head
from .answer import Ready
from .causes import classify, cooldown_after, is_health_failure, outcome
from .costs import lost_cost
from .failures import unavailable
from .race import Race
from .route import SENDING, RouteTarget
from .run import Run

__all__ = ["Attempt", "vendor_request_id"]


async def _sending(record: AttemptReport, opening: Awaitable[Ready]) -> Ready:
    """``opening`` with ``record`` as the attempt being sent (:data:`SENDING`)."""
    token = SENDING.set(record)
    try:
        return await opening
    finally:
        SENDING.reset(token)


class Attempt:
    """One attempt on one target until its first token (its whole answer when not
    streamed), counted in the target's stats and health and in the route report."""

    def __init__(self, run: Run, record: AttemptReport, state: Race, prefix: str | None):
        self.run, self.record, self.state, self.prefix = run, record, state, prefix
        self.target = run.route.target(record.target)
        self.stats = run.router.stats.target(record.target)
        self.health = run.router.health(record.target)
        self.probe = False
        self.started = 0.0
        self.waiting = 0

    async def make(self) -> None:
        run, stats, health = self.run, self.stats, self.health
        if not health.available() or not health.breaker.acquire():
            if not run.failures.fails_open(self.target.name):
                self._unavailable()
                return
            self.record.failed_open = True
        self.probe = health.breaker.state == "half-open" and not self.record.failed_open
        self.started = run.clock()
        stats.load.started()
        self.waiting = stats.waiting() if run.stream else 0
        try:
            ready = await self._open()
        except anyio.get_cancelled_exc_class():
            self._cancelled()
            raise
        except RequestBodyError as exc:  # the request's fault, the same on every target
            self._refused(exc)
            return
        except Exception as exc:
            self._failed(exc)
            return
        stats.done_waiting(self.waiting)
        elapsed = run.clock() - self.started
        if self.state.winner is not None:  # another attempt won while this one finished
            await self._lost(ready, elapsed)
        else:
            self._won(ready, elapsed)

    async def _open(self) -> Ready:
        """The attempt's first token (its answer), within its first-token deadline."""
        run, target, prefix = self.run, self.target, self.prefix
        timeout = run.failures.first_token_deadline(target.name, prefix) if run.stream else None
        opening = _sending(
            self.record, self._stream(target, prefix) if run.stream else self._complete(target)
        )
        if not timeout:  # no first-token deadline: no cancel scope to enter
            return await opening
        ready: Ready | None = None
        with anyio.CancelScope(deadline=anyio.current_time() + timeout) as deadline:
            ready = await opening
        if ready is None or deadline.cancelled_caught:
            raise FirstTokenTimeout(run.request_stub(), target=target.name, seconds=timeout)
        return ready

    def _unavailable(self) -> None:
        """Its target may not be asked now (cooling down, its circuit open)."""
        exc = unavailable(self.target.name, self.health, self.run.request_stub())
        self.run.failures.failed(self.record, self.state, exc, "error", count=False)

    def _release(self) -> None:
        """No verdict on the target's health (a trial's slot given back)."""
        if self.probe:
            self.health.breaker.release()

    def _cancelled(self) -> None:
        stats, run = self.stats, self.run
        stats.done_waiting(self.waiting)
        self.record.outcome = "cancelled"
        stats.record_outcome("cancelled")
        if run.stream:
            raced = self.record.reason in ("race", "probe")
            stats.record_censored(run.clock() - self.started, run.prompt_tokens, raced=raced)
        stats.load.finished()
        self._release()

    def _refused(self, exc: RequestBodyError) -> None:
        """The request cannot be sent to any target: the race ends with ``exc``."""
        self.stats.done_waiting(self.waiting)
        self.stats.load.finished()
        self._release()
        self.record.outcome, self.record.error = "error", describe_error(exc)
        state = self.state
        state.final = exc
        state.live -= 1
        state.notify()

    def _failed(self, exc: Exception) -> None:
        run, stats, health = self.run, self.stats, self.health
        stats.done_waiting(self.waiting)
        stats.load.finished()
        counted = outcome(exc)
        if counted == "timeout" and run.stream and self.prefix is None:
            # A deadline missed is a sample too: the TTFT was at least this long.
            stats.record_censored(run.clock() - self.started, run.prompt_tokens)
        if counted == "rate_limited" and isinstance(exc, APIStatusError):
            health.cool_down(cooldown_after(exc.response.headers))
        if classify(exc) == "misconfigured":
            health.misconfigured(describe_error(exc), run.router.misconfigured_cooldown, exc)
        if is_health_failure(exc):
            health.failed(exc, run.kind)
            health.breaker.record_failure()
        else:
            self._release()  # no verdict on its health (a 429, a bad request)
        if isinstance(exc, APIStatusError):
            self.record.request_id = vendor_request_id(self.target, exc.response.headers)
        run.failures.failed(self.record, self.state, exc, counted, count=True)

    async def _lost(self, ready: Ready, elapsed: float) -> None:
        """Another attempt won while this one reached its first token."""
        stats, run = self.stats, self.run
        self.record.outcome = "cancelled"
        stats.record_outcome("cancelled")
        if run.stream and ready.timings.tokens and self.prefix is None:
            stats.record_ttft(elapsed, run.prompt_tokens)  # a first token all the same
            if self.record.reason == "probe":  # what it ran on for
                self.record.ttft = elapsed
        stats.load.finished()
        self._release()
        decoder = ready.decoder
        self.record.cost = lost_cost(
            self.target,
            decoder.vendor_usage if decoder is not None else ready.completion_usage,
            run.prompt_tokens,
            ready.timings.tokens if decoder is not None else None,
        )
        await close_quietly(ready.response)

    def _won(self, ready: Ready, elapsed: float) -> None:
        run, stats, record, target = self.run, self.stats, self.record, self.target
        record.outcome = "won"
        record.ttft = elapsed
        record.request_id = vendor_request_id(target, ready.response.headers)
        if record.reason == "hedge":
            run.refund_hedge(target.name)  # it saved the request: no extra request lost
        if run.report.winner is None:
            run.report.winner = target.name
        self.health.breaker.record_success()
        stats.record_outcome("ok")
        if not run.stream:
            stats.record_latency(elapsed)
            stats.load.finished()
        elif ready.timings.tokens and self.prefix is None:
            stats.record_ttft(elapsed, run.prompt_tokens)
        self.state.winner = ready
        self.state.notify()

    async def _stream(self, target: RouteTarget, prefix: str | None) -> Ready:
        run = self.run
        body = run.bodies.body_for(target, prefix)
        response, timings = await run.send(
            target, body, stream=True, continuation=prefix is not None
        )
        try:
            request = response.request
            asked = run.body.get("stream_options")
            decoder = adapter_for(target.protocol).stream_decoder(
                run.kind,
                request=request,
                target=target.name,
                body=body,
                include_usage=isinstance(asked, dict) and bool(asked.get("include_usage")),
            )
            reader = StreamReader(decoder, timings, clock=run.clock)
            receive = body_receiver(response)
            buffered: list[ChatCompletionChunk] = []
            head: list[bytes] | None = [] if run.bodies.raw else None  # the caller reads the body
            with map_transport_errors(request):
                while not reader.answering:
                    if reader.ended:
                        raise stream_ended(request, before_first_token=target.name)
                    data = await receive()
                    if head is not None and data is not None:
                        head.append(data)
                    buffered.extend(reader.feed(data))
            timings.first_token = run.clock() - timings.started_at
            reader.counting = False  # the answer counts the chunks it passes on (routing.answer)
            if head is not None:
                replay_head(response, head)
            return Ready(target, response, timings, reader, receive, buffered)
        except BaseException:
            await close_quietly(response)
            raise

    async def _complete(self, target: RouteTarget) -> Ready:
        run = self.run
        body = run.bodies.body_for(target, None)
        response, timings = await run.send(target, body, stream=False, continuation=False)
        adapter = adapter_for(target.protocol)
        completion = adapter.parse_answer(run.kind, response, target=target.name, body=body)
        ready = Ready(target, response, timings, completion=completion)
        ready.completion_usage = adapter.answer_usage(run.kind, completion, response)
        self.record.usage = ready.completion_usage
        return ready


def vendor_request_id(target: RouteTarget, headers: Mapping[str, str]) -> str | None:
    """The vendor's id of a request from its response headers: the first of the catalog's
    ``request_id_headers`` present (DeepSeek's ``x-ds-trace-id``...), else by the target's
    protocol (Anthropic's ``request-id``; ``x-request-id`` for the OpenAI-style APIs)."""
    for name in target.request_id_headers:
        if value := headers.get(name):
            return value
    return adapter_for(target.protocol).request_id(headers)
