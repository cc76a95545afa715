"""Simulated providers in virtual time: the routing engine's own code, no sockets, no waiting.

A :class:`VirtualSender` answers the engine's requests as the simulator would (the same
:class:`Profile`, seeded, one generator per target drawing in the order requests reach it: the
fault, then the TTFT), as an event stream that sleeps its TTFT on the event loop's clock. Under
trio's ``MockClock(autojump_threshold=0)`` those sleeps take no time, so a fresh client's first
hundreds of requests, hedges, races and explorations included, run in well under a second of
CPU, and every figure is exact and repeatable: counted, never timed. :func:`drive` runs the
requests; :func:`probe` draws each target's own TTFT for every request (independent generators
of the same profiles), for the best fixed schedule of the same weather.

Modelled: the TTFT and its stall tail, the prompt's prefill cost, 429 / 500 / 503 answers,
hangs, streams dropped mid-answer, and profile changes at given times. Not modelled: the
transport, TLS, HTTP/2 and the client's CPU (the simulator processes are for those).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import httpx
import openai

from .._types import RouteReport, Timings
from . import _reply
from ._profile import Profile

__all__ = [
    "Phase",
    "Request",
    "VirtualRun",
    "VirtualSender",
    "VirtualTarget",
    "drive",
    "probe",
    "run_fresh_client",
]


@dataclass(frozen=True)
class Phase:
    """``seconds`` of a run, with these profile changes (by target) applied as it starts."""

    seconds: float
    changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class VirtualTarget:
    """One simulated provider: its profile (changed by a run's phases), its own seeded
    generator, and the requests it received."""

    profile: Profile
    seed: int
    requests: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def change(self, fields: Mapping[str, Any]) -> None:
        self.profile = dataclasses.replace(self.profile, **fields)

    def draw(self, prompt_tokens: int) -> tuple[float, str | None]:
        """The next request's fault (``None``: none) and TTFT, drawn as the simulator does:
        no TTFT for a request answered with an error status at once."""
        fault = self.profile.sample_fault(self.rng)
        if fault in ("429", "500", "503"):
            return 0.0, fault
        return self.profile.sample_ttft(self.rng, prompt_tokens), fault

    def first_token(self, prompt_tokens: int) -> float:
        """The next request's time to its first token (``inf`` when it gets none)."""
        ttft, fault = self.draw(prompt_tokens)
        return math.inf if fault in ("429", "500", "503", "hang") else ttft


def _event(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-virtual",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class _Body(httpx.AsyncByteStream):
    """An event stream: nothing for ``ttft`` seconds, then ``tokens`` words ``inter`` apart;
    a hang sends nothing more and breaks after ``profile.hang_max``; a drop ends the stream
    after ``profile.fault_after`` words, without its end. Read through :meth:`receive` (the
    engine's reader, ``transport.body_receiver``, takes it from the response's
    ``llmroute.body`` extension, as from llmroute's own transport): no generator is left
    open when an attempt is cancelled."""

    def __init__(self, model: str, ttft: float, profile: Profile, fault: str | None) -> None:
        self._model, self._ttft, self._profile, self._fault = model, ttft, profile, fault
        self._sent = -1  # -1: nothing yet
        self._words = profile.reply_tokens
        if fault == "drop":
            self._words = min(self._words, profile.fault_after)
        self.events: Any = None  # the reader's event deadline (unused: no read timeout here)

    async def receive(self) -> bytes | None:
        profile = self._profile
        if self._sent == -1:
            await anyio.sleep(self._ttft)
            if self._fault == "hang":
                await anyio.sleep(profile.hang_max)
                raise httpx.RemoteProtocolError("the stream was reset")
        elif self._sent >= self._words:
            if self._fault == "drop":
                raise httpx.RemoteProtocolError("the stream was reset")
            if self._sent > self._words:
                return None
            self._sent += 1
            return _event(self._model, {}, "stop") + b"data: [DONE]\n\n"
        elif profile.inter_token:
            await anyio.sleep(profile.inter_token)
        i = max(0, self._sent)
        self._sent = i + 1
        delta = {"content": f"w{i} "}
        return _event(self._model, {"role": "assistant", **delta} if i == 0 else delta)

    async def __aiter__(self) -> AsyncIterator[bytes]:  # httpx's own reading (unused here)
        while (data := await self.receive()) is not None:
            yield data

    async def aclose(self) -> None:
        return None


_ERRORS: dict[str, type[openai.APIStatusError]] = {
    "429": openai.RateLimitError,
    "500": openai.InternalServerError,
    "503": openai.InternalServerError,
}


class VirtualSender:
    """The engine's :class:`~llmroute.routing.engine.Sender` over virtual targets, keyed by
    provider name; every call is counted in its target's ``requests``."""

    def __init__(self, targets: Mapping[str, VirtualTarget], clock: Callable[[], float]) -> None:
        self.targets = dict(targets)
        self._clock = clock

    async def __call__(
        self, target: Any, body: dict[str, Any], *, stream: bool, continuation: bool
    ) -> tuple[httpx.Response, Timings]:
        virtual = self.targets[target.provider]
        virtual.requests += 1
        profile = virtual.profile
        ttft, fault = virtual.draw(_reply.prompt_tokens(body.get("messages") or []))
        request = httpx.Request("POST", f"https://{target.provider}.test/v1/chat/completions")
        timings = Timings(started_at=self._clock())
        if fault in _ERRORS:
            headers = {"retry-after": f"{profile.retry_after:g}"} if fault != "500" else {}
            response = httpx.Response(int(fault), headers=headers, request=request)
            # (openai 3 types its errors' response for httpx2; the engine reads either)
            raise _ERRORS[fault](f"status {fault}", response=cast(Any, response), body=None)
        body_stream = _Body(target.model, ttft, profile, fault)
        response = httpx.Response(
            200, stream=body_stream, request=request, extensions={"llmroute.body": body_stream}
        )
        return response, timings


@dataclass
class Request:
    """One caller request of a run: when it started (seconds after the run began), its prompt's
    index, its TTFT (``None``: it failed) and its route report."""

    started: float
    index: int
    ttft: float | None = None
    report: RouteReport | None = None
    error: str | None = None


async def drive(
    router: Any,
    route: Any,
    sender: VirtualSender,
    prompt: Callable[[int], list[dict[str, Any]]],
    *,
    concurrency: int = 8,
    count: int | None = None,
    phases: Sequence[Phase] = (),
) -> list[Request]:
    """Requests through ``router``'s ``route``, ``concurrency`` at a time, each stream read to
    its end: ``count`` of them, or as many as the ``phases`` last (each phase's changes
    applied to the sender's targets as it starts). A request's TTFT is its route report's."""
    if count is None and not phases:
        raise ValueError("give a count of requests or phases that end")
    requests: list[Request] = []
    began = anyio.current_time()
    end = began + sum(p.seconds for p in phases) if count is None else math.inf

    async def worker() -> None:
        while (count is None or len(requests) < count) and anyio.current_time() < end:
            request = Request(anyio.current_time() - began, len(requests))
            requests.append(request)
            body = {"model": route.name, "messages": prompt(request.index)}
            try:
                routed = await router.stream(route, body, sender)
                request.report = routed.report
                async for _ in routed.chunks(lambda response: None):
                    pass
                request.ttft = routed.report.ttft
            except openai.APIError as exc:
                request.error = type(exc).__name__

    async def weather() -> None:
        at = began
        for phase in phases:
            for name, fields in phase.changes.items():
                sender.targets[name].change(fields)
            at += phase.seconds
            await anyio.sleep_until(at)

    async with anyio.create_task_group() as tg:
        tg.start_soon(weather)
        for _ in range(concurrency):
            tg.start_soon(worker)
    return requests


def probe(
    profiles: Mapping[str, Profile],
    requests: Sequence[Request],
    prompt: Callable[[int], list[dict[str, Any]]],
    *,
    seed: int,
    phases: Sequence[Phase] = (),
) -> dict[str, list[float]]:
    """Each target's own time to first token for every request of a run (at the time it
    started, under that phase's profile), from generators independent of the run's: what a
    probe sending every prompt to every target measures. ``inf`` for a request a target
    answered with an error or never answered."""
    targets = {
        name: VirtualTarget(profile, seed * 7919 + k)
        for k, (name, profile) in enumerate(profiles.items())
    }
    bounds: list[tuple[float, Mapping[str, Mapping[str, Any]]]] = []
    at = 0.0
    for phase in phases:
        bounds.append((at, phase.changes))
        at += phase.seconds
    out: dict[str, list[float]] = {name: [] for name in targets}
    applied = 0
    for request in sorted(requests, key=lambda r: r.started):
        while applied < len(bounds) and bounds[applied][0] <= request.started:
            for name, fields in bounds[applied][1].items():
                targets[name].change(fields)
            applied += 1
        tokens = _reply.prompt_tokens(prompt(request.index))
        for name, target in targets.items():
            out[name].append(target.first_token(tokens))
    return out


@dataclass
class VirtualRun:
    """A fresh client's run in virtual time: its requests in the order they were made, and
    the requests each target received (hedges, races, probes and failovers included)."""

    requests: list[Request]
    received: dict[str, int]

    @property
    def amplification(self) -> float:
        """Requests the targets received per request of the caller."""
        return sum(self.received.values()) / len(self.requests) if self.requests else math.nan

    def ttfts(self, start: int = 0, stop: int | None = None) -> list[float]:
        """The TTFT of the requests ``start:stop`` (``inf`` for one that failed)."""
        return [r.ttft if r.ttft is not None else math.inf for r in self.requests[start:stop]]


def _seed(profile: Profile, seed: int, index: int) -> int:
    return profile.seed if profile.seed is not None else seed * 10 + index


def run_fresh_client(
    config: Mapping[str, Any],
    profiles: Mapping[str, Profile],
    prompt: Callable[[int], list[dict[str, Any]]],
    *,
    seed: int,
    route: str = "chat",
    concurrency: int = 8,
    count: int | None = None,
    phases: Sequence[Phase] = (),
) -> VirtualRun:
    """A fresh client of ``config`` (its providers named as ``profiles``' keys; their base URLs
    and keys are never used) sending ``prompt(i)`` for i = 0, 1, ... (see :func:`drive`), in
    trio's virtual time: the router's clock and every wait are the event loop's, which jumps
    ahead whenever every task waits. ``seed`` seeds the router; each target's generator is
    seeded with its profile's ``seed`` (as a simulator process is), or from ``seed`` when the
    profile has none."""
    import trio
    import trio.testing

    from .._routes import build_router
    from ..config import Config, resolve

    resolved = resolve(Config.model_validate(dict(config)), {})
    out: dict[str, Any] = {}

    async def main() -> None:
        router = build_router(
            resolved, max_retries=2, clock=trio.current_time, rng=random.Random(seed)
        )
        targets = {
            name: VirtualTarget(profile, _seed(profile, seed, k))
            for k, (name, profile) in enumerate(profiles.items())
        }
        sender = VirtualSender(targets, trio.current_time)
        out["requests"] = await drive(
            router,
            router.routes[route],
            sender,
            prompt,
            concurrency=concurrency,
            count=count,
            phases=phases,
        )
        out["received"] = {name: t.requests for name, t in targets.items()}

    with _scheduling_seeded(seed):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return VirtualRun(out["requests"], out["received"])


@contextlib.contextmanager
def _scheduling_seeded(seed: int) -> Iterator[None]:
    """Trio shuffles the order in which tasks ready at the same instant run, from its own
    generator (``trio._core._run._r``, the one Hypothesis seeds); in virtual time many are
    ready at once, and that order decides which request gets a target's next draw. Seeded
    for the run (and restored after it), a run is the same for the same seed."""
    import trio._core._run as trio_run

    generator: random.Random | None = getattr(trio_run, "_r", None)
    if generator is None:  # another trio: runs may then differ by their scheduling
        yield
        return
    state = generator.getstate()
    generator.seed(seed)
    try:
        yield
    finally:
        generator.setstate(state)
