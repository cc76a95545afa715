"""A routed request's answer, relayed: the client's call made beside a watch on the gateway's
client (it left, it stopped reading), cut when the key is revoked, the gateway shuts down or
the request's total timeout passes; a stream's events written as they come and ended with
``[DONE]`` or an error event, a whole answer written at once, a failure as OpenAI's error."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import openai
import pydantic

from .._client import AsyncOpenAI
from .._types import RouteReport
from ..routing.health import failure_party
from ._calls import RESPONSES, ApiCall, call_client
from ._errors import ErrorAnswers, Refused, TotalTimeout, error_body
from ._exchange import (
    Exchange,
    answer_headers,
    cache_hit,
    dump_json,
    named_event,
    watch,
)
from ._gate import Gate
from ._keys import LiveKeys
from ._metrics import GatewayMetrics
from ._tally import Tally

__all__ = ["InFlight", "Relay"]

log = logging.getLogger("llmroute.server")

_CLOSE_TIMEOUT = 5.0  # seconds a cancelled upstream stream may take to close


class InFlight:
    """The requests being answered now, each with the cancel scope that ends it."""

    def __init__(self) -> None:
        self.scopes: dict[anyio.CancelScope, Exchange] = {}
        self._idle: anyio.Event | None = None  # set when the last one ends while draining

    def __len__(self) -> int:
        return len(self.scopes)

    def add(self, scope: anyio.CancelScope, exchange: Exchange) -> None:
        self.scopes[scope] = exchange

    def remove(self, scope: anyio.CancelScope) -> None:
        self.scopes.pop(scope, None)
        if self._idle is not None and not self.scopes:
            self._idle.set()  # the last request in flight of a gateway draining

    async def idle(self) -> None:
        """Return once no request is in flight."""
        if self.scopes:
            self._idle = anyio.Event()
            await self._idle.wait()

    def cut(self, keys: set[str] | None = None) -> None:
        """End the requests of ``keys`` (revoked: their clients are told so), or all."""
        for scope, exchange in list(self.scopes.items()):
            if keys is None:
                scope.cancel()
            elif exchange.key in keys:
                exchange.revoked = True
                scope.cancel()


@dataclass(slots=True, eq=False, repr=False)
class _Answer:
    """What the routed call gave: a stream or a whole answer, or the failure it ended in."""

    stream: openai.AsyncStream[Any] | None = None
    result: object = None
    failure: Exception | None = None
    complete: bool = False  # the stream was read to its end
    sequence: object = None  # the last Responses stream event's sequence_number


@dataclass(eq=False, repr=False)
class Relay:
    """Answers a checked, admitted request through the gateway's client (see the module's
    docstring)."""

    client: AsyncOpenAI
    timeout: httpx.Timeout
    metrics: GatewayMetrics
    keys: LiveKeys
    gate: Gate
    in_flight: InFlight
    errors: ErrorAnswers

    async def call(self, path: str, body: dict[str, Any], extra_headers: dict[str, str]) -> object:
        """The client's call for ``path`` (:func:`~._calls.call_client`)."""
        return await call_client(self.client, path, body, extra_headers, self.timeout)

    async def answer(self, call: ApiCall, tally: Tally) -> None:
        """The call and its answer, within its total timeout if it has one; what it used goes
        in ``tally``. Failures of this request count against its key first
        (routing/health.py): one key's bad requests open that key's breakers, not
        everyone's."""
        party = failure_party.set(call.exchange.key)
        try:
            answer = await self._run(call, tally)
            await self._answer_back(call, tally, answer)
        finally:
            failure_party.reset(party)

    async def _run(self, call: ApiCall, tally: Tally) -> _Answer:
        """The call, and a stream's chunks relayed, beside a watch on the client; cut when
        the client leaves or stalls, the key is revoked, the gateway shuts down or its total
        timeout passes."""
        exchange, total = call.exchange, call.total
        answer = _Answer()
        async with anyio.create_task_group() as tg:
            scope = tg.cancel_scope

            def client_gone() -> None:
                if not exchange.finished:
                    exchange.gone = True
                    scope.cancel()

            def client_stalled() -> None:
                exchange.gone = exchange.stalled = True
                scope.cancel()

            tg.start_soon(watch, call.request, client_gone, client_stalled, self.gate.renew)
            self.in_flight.add(scope, exchange)
            if self.keys.revoked_since(exchange.tenants, exchange.key):
                exchange.revoked = True  # while its body came, or it was admitted
                scope.cancel()
            deadline = anyio.current_time() + total if total is not None else math.inf
            try:
                with anyio.CancelScope(deadline=deadline) as limit:
                    await self._relay(call, tally, answer)
                if limit.cancelled_caught and total is not None:
                    answer.result = None
                    answer.failure = TotalTimeout(total)
            except Exception as exc:
                answer.failure = exc
            finally:
                self.in_flight.remove(scope)
                scope.cancel()
        return answer

    async def _relay(self, call: ApiCall, tally: Tally, answer: _Answer) -> None:
        """The client's call; a stream's events written to the client as they come."""
        answer.result = await call_client(
            self.client,
            call.path,
            call.body,
            call.upstream,
            self.timeout,
            call.size,
            call.prompt_tokens,
        )
        if not isinstance(answer.result, openai.AsyncStream):  # llmroute's for chat
            return
        exchange = call.exchange
        stream = answer.stream = answer.result
        tally.cache_hit = cache_hit(stream)
        await exchange.start(
            200,
            "text/event-stream; charset=utf-8",
            {"cache-control": "no-cache"} | answer_headers(stream, tally.cache_hit),
        )
        if call.path == RESPONSES:  # named events, as OpenAI sends them
            async for event in stream:
                answer.sequence = getattr(event, "sequence_number", answer.sequence)
                tally.event(event)
                await exchange.chunk(named_event(event))
        else:
            async for chunk in stream:
                tally.chunk(chunk)
                await exchange.chunk(b"data: " + dump_json(chunk) + b"\n\n")
        answer.complete = True

    async def _answer_back(self, call: ApiCall, tally: Tally, answer: _Answer) -> None:
        """After the call: the stream closed and ended (``[DONE]`` or an error event), the
        whole answer sent, or the failure as OpenAI's error."""
        exchange = call.exchange
        stream, result, failure = answer.stream, answer.result, answer.failure
        report = getattr(stream if stream is not None else result, "route", None)
        report = report if report is not None else getattr(failure, "report", None)
        if isinstance(report, RouteReport):
            exchange.report = report
        if exchange.stalled:
            self.metrics.rejections.labels(exchange.key, "write_timeout").inc()
        elif exchange.gone:
            self.metrics.disconnects.labels(exchange.key, exchange.label).inc()
        if stream is not None:
            tally.streamed(getattr(stream, "route", None))
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                try:
                    await stream.close()
                except Exception as exc:
                    log.warning(
                        "closing a stream: %s", self.errors.scrub(f"{type(exc).__name__}: {exc}")
                    )
        if exchange.gone:
            return
        if stream is not None:
            await self._end_stream(call, answer)
            return
        if failure is not None:
            raise self.errors.map_error(failure)
        if result is None and exchange.revoked:
            raise Refused(
                401, error_body("This key was revoked.", "invalid_request_error", "invalid_api_key")
            )
        if result is None:
            raise Refused(503, error_body("The gateway is shutting down.", "server_error"))
        assert isinstance(result, pydantic.BaseModel)
        tally.answered(result)
        headers = answer_headers(result, tally.cache_hit)
        await exchange.whole(200, dump_json(result), headers=headers)

    async def _end_stream(self, call: ApiCall, answer: _Answer) -> None:
        """A stream's last event: ``[DONE]`` (a Responses stream's own last event ends it), or,
        for one that broke, an error event in the API's shape, never a whole-looking end."""
        path, exchange = call.path, call.exchange
        if answer.complete:
            await exchange.body(b"" if path == RESPONSES else b"data: [DONE]\n\n")
            return
        self.metrics.stream_errors.labels(exchange.key, exchange.label).inc()
        exchange.failed = True
        if exchange.revoked:
            event = error_body(
                "This key was revoked; the answer is incomplete.",
                "invalid_request_error",
                "key_revoked",
            )
        elif answer.failure is None:
            event = error_body(
                "The gateway is shutting down; the answer is incomplete.",
                "server_error",
                "gateway_shutdown",
            )
        else:
            event = self.errors.stream_error(answer.failure)
        if path != RESPONSES:
            await exchange.body(b"data: " + self.errors.error_bytes(event) + b"\n\n")
            return
        sequence = answer.sequence
        error = event["error"]  # as the Responses API's own error event
        event = {
            "type": "error",
            "code": error["code"],
            "message": error["message"],
            "param": None,
            "sequence_number": sequence + 1 if isinstance(sequence, int) else None,
        }
        await exchange.body(b"event: error\ndata: " + self.errors.error_bytes(event) + b"\n\n")
