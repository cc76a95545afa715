"""``llmroute bench``'s probes: the prompts of each length class, and one request sent and measured
(directly to one target, or through a route), its failure a line without the target's keys.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from .._streaming import AsyncStream
from ._format import error_text

if TYPE_CHECKING:
    from .. import AsyncOpenAI


LENGTHS: dict[str, int] = {"short": 50, "medium": 1000, "long": 4000}
"""The prompt-length classes and their approximate prompt size in tokens (4 characters each)."""

_QUESTIONS = (
    "Summarize the text above in one sentence.",
    "Which component does the text above describe first?",
    "Name one risk the text above mentions.",
    "What would you measure first, after reading the text above?",
)


_WORDS = (
    "request target vendor stream token latency prefill decode queue server client window "
    "percentile hedge route cache failover connection handshake stall budget prompt answer "
    "region replica batch scheduler kernel memory throughput deadline retry breaker probe"
).split()


def _filler(tokens: int) -> str:
    """Fixed text of about ``tokens`` tokens (the same on every run)."""
    rng = random.Random(tokens)
    words: list[str] = []
    chars = 0
    while chars < tokens * 4:
        word = rng.choice(_WORDS)
        words.append(word)
        chars += len(word) + 1
    return " ".join(words)


def prompt_for(length: str, index: int, nonce: str | None) -> list[dict[str, str]]:
    """The messages of probe ``index`` of a length class: fixed text, then a question.

    With a ``nonce`` the prompt starts with it, so no two probes share a prefix."""
    tokens = LENGTHS[length]
    head = f"[probe {nonce}] " if nonce else ""
    question = _QUESTIONS[index % len(_QUESTIONS)]
    body = _filler(max(tokens - 20, 8))
    return [{"role": "user", "content": f"{head}{body}\n\n{question}"}]


@dataclass(slots=True)
class Probe:
    """One probe: where it went, and what it measured (seconds; ``None`` when it failed)."""

    target: str
    length: str
    index: int
    prompt_chars: int
    started: float
    """Seconds after the bench began."""
    ttft: float | None = None
    total: float | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    http_version: str | None = None
    error: str | None = None
    route: dict[str, Any] | None = None
    """A routed probe's route report, compactly (:func:`compact_report`); ``None`` for a probe
    sent to one target directly."""
    cost: str | None = None
    """A routed probe's cost (``route.cost``, every attempt), an exact decimal; ``None`` when
    unknown (no price for a target's model) or not routed."""
    currency: str | None = None


def compact_report(report: Any) -> dict[str, Any]:
    """What the picture of a routed run needs of a :class:`~llmroute.RouteReport`: who served
    it, its hedges, continuations, cache hit, and each attempt (times in seconds)."""

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    attempts: list[dict[str, Any]] = []
    for attempt in report.attempts:
        item: dict[str, Any] = {
            "target": attempt.target,
            "reason": attempt.reason,
            "outcome": attempt.outcome,
            "started": rounded(attempt.started),
            "ttft": rounded(attempt.ttft),
        }
        if attempt.error:
            item["error"] = " ".join(str(attempt.error).split())[:120]
        attempts.append(item)
    return {
        "winner": report.winner,
        "ttft": rounded(report.ttft),
        "hedges": report.hedges,
        "cache_hit": report.cache_hit,
        "shared": report.shared,
        "continued_on": list(report.continued_on),
        "attempts": attempts,
    }


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """How to reach one target directly."""

    target: str
    model: str
    client_args: dict[str, Any]
    secrets: tuple[str, ...] = ()


async def _probe(
    client: AsyncOpenAI, endpoint: _Endpoint, sample: Probe, messages: Any, args: Any
) -> None:
    if getattr(args, "routed", None) is not None:
        await _routed_probe(client, endpoint, sample, messages, args)
        return
    try:
        with anyio.fail_after(args.timeout):
            stream = await _open_stream(client, endpoint, messages, args)
            await _drain(stream)
        assert isinstance(stream, AsyncStream)  # llmroute's: it carries its timings
        timings = stream.timings
        sample.ttft = timings.first_token
        sample.total = timings.total
        sample.tokens = timings.tokens
        sample.http_version = timings.http_version
        if timings.first_token is None:
            sample.error = "NoToken: the stream ended without a token"
        elif timings.total is not None and timings.tokens > 1:
            decode = timings.total - timings.first_token
            if decode > 0:
                sample.tokens_per_s = (timings.tokens - 1) / decode
    except TimeoutError:
        sample.error = f"Timeout: no complete answer within {args.timeout:g} s"
    except Exception as exc:
        # One probe's failure, whatever it is (OpenAIError or anything else), is its error and
        # never ends the run; KeyboardInterrupt and cancellation are no Exceptions, so they do.
        sample.error = _error_line(exc, endpoint)


async def _drain(stream: Any) -> None:
    """Read ``stream`` to its end (its timings and route report are complete then), and close it."""
    async with stream:
        async for _ in stream:
            pass


async def _routed_probe(
    client: AsyncOpenAI, endpoint: _Endpoint, sample: Probe, messages: Any, args: Any
) -> None:
    """One request through the route: TTFT as the caller saw it (hedges included, a cache hit's
    replay), ``total`` from ``create()`` to the end (or to the failure), and the route report."""
    began = time.perf_counter()
    stream: Any = None
    report: Any = None
    try:
        with anyio.fail_after(args.timeout):
            stream = await _open_stream(client, endpoint, messages, args)
            await _drain(stream)
        report = stream.route
        timings = stream.timings
        sample.tokens = timings.tokens
        sample.http_version = timings.http_version
        sample.ttft = report.ttft if report is not None else timings.first_token
        if sample.ttft is None:
            sample.error = "NoToken: the stream ended without a token"
    except TimeoutError:
        sample.error = f"Timeout: no complete answer within {args.timeout:g} s"
    except Exception as exc:  # as in _probe: one request's failure never ends the run
        sample.error = _error_line(exc, endpoint)
        report = getattr(exc, "report", None)
    sample.total = time.perf_counter() - began
    if report is None and stream is not None:
        report = getattr(stream, "route", None)
    if report is not None:
        sample.route = compact_report(report)
        cost = report.cost
        if cost is not None and cost.amount is not None:
            sample.cost, sample.currency = str(cost.amount), cost.currency
    replayed = sample.route is not None and (sample.route["cache_hit"] or sample.route["shared"])
    if sample.ttft is not None and sample.error is None and sample.tokens > 1 and not replayed:
        decode = sample.total - sample.ttft
        if decode > 0:
            sample.tokens_per_s = (sample.tokens - 1) / decode


async def _open_stream(client: AsyncOpenAI, endpoint: _Endpoint, messages: Any, args: Any) -> Any:
    """One streamed request of the run's shape (the caller reads it, and keeps it when the
    read fails: its timings and route report are on it)."""
    return await client.chat.completions.create(
        model=endpoint.model,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
    )


def _error_line(exc: BaseException, endpoint: _Endpoint) -> str:
    """A probe's failure as one line, without the endpoint's secrets."""
    message = _scrub(error_text(exc), endpoint.secrets)
    return f"{type(exc).__name__}: {message[:300]}"


def _scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` without ``secrets`` (longest first), also as JSON escapes them."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "<key>")
        escaped = json.dumps(secret)[1:-1]
        if escaped != secret:
            text = text.replace(escaped, "<key>")
    return text


async def _warm(client: AsyncOpenAI) -> None:
    try:
        with anyio.fail_after(15):
            await client.warmup()
    except Exception:  # also an ExceptionGroup: the probes will say what failed
        pass
