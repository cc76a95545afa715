"""Background trials of open circuits: the schedule (an injectable clock), and a flapping primary
against real simulators over TLS + HTTP/2 on a compressed time scale."""

from __future__ import annotations

import contextvars
import gc
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import openai
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI, StreamInterrupted
from llmroute._types import Timings
from llmroute.routing.engine import Route, Router, RouteTarget
from llmroute.routing.health import CircuitBreaker, TargetHealth, failure_party
from llmroute.routing.policies import FailoverPolicy
from llmroute.routing.trials import CircuitTrials
from llmroute.testing import Profile, Simulator

from ..clock import FakeClock
from ..conftest import KEY

MESSAGES: Any = [{"role": "user", "content": "Tell me about routing."}]
PRIMARY, FALLBACK = "primary:sim-small", "fallback:sim-small"


def background_breaker(
    cooldown: float = 5.0, max_cooldown: float = 10.0
) -> tuple[CircuitBreaker, FakeClock, list[float]]:
    """A breaker whose probes are background trials, open; and the clock times it opened at."""
    clock = FakeClock()
    opened: list[float] = []
    breaker = CircuitBreaker(1, cooldown, max_cooldown, clock)
    breaker.trials_in_background(on_open=lambda: opened.append(clock.now))
    breaker.record_failure()
    return breaker, clock, opened


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "https://vendor.test/v1/chat/completions")
    response = httpx.Response(status, headers=headers, request=request)
    return openai.APIStatusError(f"Error code: {status}", response=response, body=None)  # type: ignore[arg-type]


async def eventually(done: Callable[[], bool], seconds: float = 30.0) -> None:
    """Wait until ``done()``, looking every 10 ms, for ``seconds`` at most (a hang guard)."""
    with anyio.fail_after(seconds):
        for _ in range(int(seconds / 0.01)):
            if done():
                return
            await anyio.sleep(0.01)
    raise AssertionError("not done in time")


# -- the schedule ----------------------------------------------------------------------------
def test_trials_are_due_one_cooldown_after_opening_then_every_doubled_cooldown_up_to_the_cap() -> (
    None
):
    breaker, clock, opened = background_breaker(cooldown=5.0, max_cooldown=10.0)
    assert opened == [clock.now] and breaker.trial_due_in() == 5.0
    clock.advance(4.0)
    assert breaker.trial_due_in() == 1.0 and not breaker.acquire_trial()
    waits: list[float] = []
    for _ in range(6):  # a long outage: every trial fails
        due = breaker.trial_due_in()
        assert due is not None
        waits.append(due)
        clock.advance(due)
        assert breaker.acquire_trial()
        breaker.record_failure()
    assert waits == [1.0, 10.0, 10.0, 10.0, 10.0, 10.0]  # never more than 10 s apart
    assert len(opened) == 7  # each re-opening says so (the trials' task is already running)


def test_one_trial_is_in_flight_at_most_and_its_success_closes_the_circuit() -> None:
    breaker, clock, _ = background_breaker()
    clock.advance(5.0)
    assert breaker.acquire_trial()
    assert breaker.state == "half-open" and breaker.trial_due_in() is None
    assert [breaker.acquire_trial() for _ in range(3)] == [False] * 3
    breaker.record_success()
    assert breaker.state == "closed" and breaker.trial_due_in() is None
    assert not breaker.acquire_trial()  # nothing to try
    assert breaker.available() and breaker.acquire()


def test_no_request_goes_to_a_target_while_its_circuit_waits_for_a_trial() -> None:
    breaker, clock, _ = background_breaker()
    assert not breaker.available() and not breaker.acquire()
    clock.advance(60.0)  # long past the cooldown: still only the trial may go
    assert not breaker.available() and not breaker.acquire()
    assert breaker.acquire_trial()
    assert not breaker.available() and not breaker.acquire()


def test_a_trial_without_a_verdict_waits_one_cooldown_and_a_cancelled_one_goes_again() -> None:
    breaker, clock, _ = background_breaker(cooldown=5.0, max_cooldown=10.0)
    clock.advance(5.0)
    assert breaker.acquire_trial()
    breaker.postpone()  # a 400 or a 429: no verdict on the target's health
    assert breaker.state == "open" and breaker.trial_due_in() == 5.0  # not doubled
    clock.advance(5.0)
    assert breaker.acquire_trial()
    breaker.release()  # cancelled (the client closing): another may go at once
    assert breaker.trial_due_in() == 0.0 and breaker.acquire_trial()


def test_a_retry_after_holds_the_next_trial_back() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1, 5.0, 10.0, clock)
    breaker.trials_in_background()
    health = TargetHealth(breaker, clock)
    assert health.trial_due_in() is None  # closed: no trial
    breaker.record_failure()
    health.cool_down(20.0)
    assert health.trial_due_in() == 20.0
    assert health.describe() == (
        "circuit open after 1 failure, next trial in 5.0 s; cooling down for 20.0 s after a 429"
    )
    clock.advance(20.0)
    assert health.trial_due_in() == 0.0 and breaker.acquire_trial()
    assert health.describe() == "circuit half-open after 1 failure, a trial is out"


def test_a_partys_own_breaker_keeps_request_probes() -> None:
    """A single tenant's failures open its own breaker only; a trial (nobody's request) cannot
    tell whether that tenant's requests work again, so its next request is the probe."""
    clock = FakeClock()
    breaker = CircuitBreaker(2, 5.0, 10.0, clock)
    breaker.trials_in_background()

    def as_party(action: Any) -> Any:
        def run() -> Any:
            failure_party.set("tenant-a")
            return action()

        return contextvars.copy_context().run(run)

    as_party(breaker.record_failure)
    as_party(breaker.record_failure)
    assert breaker.shared_state == "closed" and as_party(lambda: breaker.state) == "open"
    assert breaker.trial_due_in() is None  # no background trial for it
    clock.advance(5.0)
    assert as_party(breaker.acquire)  # the party's next request probes its own breaker
    assert breaker.acquire()  # everyone else was never stopped


def test_the_router_gives_each_trial_its_verdict() -> None:
    clock = FakeClock()
    router = Router(
        {}, breaker_failures=1, breaker_cooldown=5.0, breaker_max_cooldown=10.0, clock=clock
    )
    health = router.health("a:m")
    breaker = health.breaker
    breaker.record_failure()
    clock.advance(5.0)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", status_error(503)) == "failed"
    assert breaker.state == "open" and breaker.trial_due_in() == 10.0
    clock.advance(10.0)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", status_error(429, {"retry-after": "30"})) == "none"
    assert breaker.state == "open" and health.trial_due_in() == pytest.approx(30.0, abs=1.0)
    clock.advance(30.0)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", TimeoutError()) == "failed"  # a hang is no recovery
    clock.advance(10.0)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", status_error(401)) == "failed"  # a wrong key
    assert health.misconfiguration is not None
    assert health.trial_due_in() == router.misconfigured_cooldown  # not every 10 s
    clock.advance(router.misconfigured_cooldown)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", None) == "closed"
    assert breaker.state == "closed" and health.available()
    snap = router.stats.target("a:m").snapshot()
    assert sum(snap.outcomes.values()) == 5  # counted as outcomes, never as TTFT samples
    assert snap.ttft_p50 is None and snap.latency_p50 is None


def trial_router(cooldown: float = 5.0) -> tuple[Router, FakeClock]:
    clock = FakeClock()
    router = Router(
        {}, breaker_failures=1, breaker_cooldown=cooldown, breaker_max_cooldown=10.0, clock=clock
    )
    return router, clock


@pytest.mark.parametrize("status", [400, 413, 422, 408])
def test_any_answer_but_a_server_error_or_a_429_proves_the_server_up(status: int) -> None:
    """A trial the server refuses (a 400: it will not take ``max_tokens``) still says the server
    answers: the circuit closes (else it stayed open for good, every request refused)."""
    router, clock = trial_router()
    breaker = router.health("a:m").breaker
    breaker.record_failure()
    clock.advance(5.0)
    assert breaker.acquire_trial()
    verdict = router.record_trial("a:m", status_error(status))
    if status == 408:  # a request timeout is the server's trouble: no recovery
        assert verdict == "failed" and breaker.state == "open"
    else:
        assert verdict == "closed" and breaker.state == "closed" and breaker.acquire()


def test_a_401_closes_the_circuit_of_a_target_whose_callers_bring_the_key() -> None:
    """A provider without a key of its own (callers send theirs in ``extra_headers``): the
    trial, sent with no caller's headers, gets 401, which proves the server up. With a key of
    its own a 401 says the key is wrong; a 404 says the model is unknown either way."""
    router, clock = trial_router()
    health = router.health("a:m")
    breaker = health.breaker
    for status in (401, 403):
        breaker.record_failure()
        clock.advance(5.0)
        assert breaker.acquire_trial()
        assert router.record_trial("a:m", status_error(status), keyed=False) == "closed"
        assert breaker.state == "closed" and health.misconfiguration is None
    breaker.record_failure()
    clock.advance(5.0)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", status_error(404), keyed=False) == "failed"
    assert health.misconfiguration is not None and breaker.state == "open"
    clock.advance(router.misconfigured_cooldown)
    assert breaker.acquire_trial()
    assert router.record_trial("a:m", status_error(401), keyed=True) == "failed"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("embeddings", {"model": "m", "input": "Hi"}),
        ("responses", {"model": "m", "input": "Hi", "max_output_tokens": 16}),
        ("completions", {"model": "m", "prompt": "Hi", "max_tokens": 1}),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    ],
)
async def test_a_trial_is_a_call_of_the_kind_whose_failure_opened_the_circuit(
    kind: str, body: dict[str, Any]
) -> None:
    """An embeddings model answers a chat completion 404: its trial must be an embeddings call
    (else it is found misconfigured and its circuit never closes)."""
    router = Router({}, breaker_failures=1, breaker_cooldown=0.01, breaker_max_cooldown=0.01)
    sent: list[tuple[str, dict[str, Any]]] = []

    def senders(endpoint: str) -> Any:
        async def send(
            target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
        ) -> tuple[httpx.Response, Timings]:
            sent.append((endpoint, body))
            request = httpx.Request("POST", "https://vendor.test/v1/x")
            return httpx.Response(200, json={}, request=request), Timings(started_at=0.0)

        return send

    trials = CircuitTrials(router, senders)
    router.record_call("a:m", elapsed=None, exc=status_error(503), kind=kind)
    assert router.health("a:m").breaker.state == "open"
    trials.start(RouteTarget("a", "m"))
    await eventually(lambda: not trials.running)
    await trials.aclose()
    assert sent == [(kind, body)] and router.health("a:m").breaker.state == "closed"


# -- against real servers ------------------------------------------------------------------------
@pytest.fixture
def primary() -> Iterator[Simulator]:
    """A primary that answers 503 to everything until its profile is changed."""
    with Simulator(profile=Profile(reply_tokens=5, rate_503=1.0), tls=True) as server:
        yield server


@pytest.fixture
def fallback() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=5), tls=True) as server:
        yield server


def flapping_config(primary: Simulator, fallback: Simulator) -> dict[str, Any]:
    """An ordered primary -> fallback route on a compressed time scale: trials 0.2 s after the
    circuit opens, then at most 0.4 s apart (5 s and 10 s by default)."""
    return {
        "providers": {
            "primary": {"base_url": primary.base_url, "api_key": KEY},
            "fallback": {"base_url": fallback.base_url, "api_key": KEY},
        },
        "models": {
            "chat": {
                "targets": [PRIMARY, FALLBACK],
                "policy": "failover",
                "server_error_retries": 0,
            }
        },
        "routing": {
            "explore": 0,
            "breaker_failures": 2,
            "breaker_cooldown": "200ms",
            "breaker_max_cooldown": "400ms",
        },
    }


async def change_profile(sim: Simulator, **fields: Any) -> None:
    """``POST /_sim/profile``: the simulator's provider recovers (or fails) now."""
    url = sim.base_url.removesuffix("/v1") + "/_sim/profile"
    async with httpx.AsyncClient(verify=sim.ssl_context()) as http:
        response = await http.post(url, json=fields)
    assert response.status_code == 200


@pytest.mark.anyio
async def test_a_flapping_primary_answers_again_after_the_first_trial_since_its_recovery(
    primary: Simulator, fallback: Simulator
) -> None:
    """failoverbench's flapping primary, 20x faster: 503s until the circuit opens and trials
    fail, then healthy. The first trial sent after the recovery closes the circuit (so the
    primary is back within one trial interval of it), the next request is the primary's, and
    no caller's request went to the primary while its circuit was open or saw a trial fail."""
    cfg = flapping_config(primary, fallback)
    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None and router.trials is client._llmroute.trials
        trials, health = client._llmroute.trials, router.health(PRIMARY)
        reports: list[Any] = []

        async def ask() -> Any:
            completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
            report = completion.route  # type: ignore[attr-defined]
            reports.append(report)
            return report

        with anyio.fail_after(120):  # a hang guard only
            for _ in range(10):  # 2 failures open the circuit
                await ask()
                if health.breaker.shared_state != "closed":
                    break
            opened = len(reports)
            assert health.breaker.shared_state == "open" and PRIMARY in trials.running
            for _ in range(400):  # the outage goes on: trials fail, requests go to the fallback
                if trials.verdicts[PRIMARY, "failed"] >= 2:
                    break
                await ask()
                await anyio.sleep(0.05)
            await change_profile(primary, rate_503=0.0)  # the primary recovered
            sent_at_recovery = trials.sent[PRIMARY]
            for _ in range(400):  # a request every 50 ms until the primary answers one
                if (await ask()).winner == PRIMARY:
                    break
                await anyio.sleep(0.05)
    assert trials.verdicts[PRIMARY, "closed"] == 1
    # At most one trial after the recovery (a trial in flight then may already have closed it).
    assert trials.sent[PRIMARY] - sent_at_recovery <= 1
    # While the circuit was open, the primary received the trials and nothing else.
    before = sum(a.target == PRIMARY for r in reports[:opened] for a in r.attempts)
    assert primary.stats()["chat_requests"] == before + trials.sent[PRIMARY] + 1
    # Every caller's request was answered, by the fallback alone while the circuit was open.
    assert all(r.winner == FALLBACK for r in reports[:-1])
    assert all([a.target for a in r.attempts] == [FALLBACK] for r in reports[opened:-1])
    assert [(a.target, a.outcome) for a in reports[-1].attempts] == [(PRIMARY, "won")]
    assert not trials.running  # the circuit closed: its task ended
    registry = client.metrics.registry
    trial_counts = {
        verdict: registry.get_sample_value(
            "llmroute_circuit_trials_total", {"target": PRIMARY, "verdict": verdict}
        )
        for verdict in ("closed", "failed")
    }
    assert trial_counts == {"closed": 1.0, "failed": float(trials.verdicts[PRIMARY, "failed"])}


@pytest.mark.anyio
async def test_closing_the_client_ends_a_trial_in_flight(
    primary: Simulator, fallback: Simulator
) -> None:
    cfg = flapping_config(primary, fallback)
    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None and router.trials is client._llmroute.trials
        trials = client._llmroute.trials
        with anyio.fail_after(60):  # a hang guard only
            for _ in range(10):
                await client.chat.completions.create(model="chat", messages=MESSAGES)
                if router.health(PRIMARY).breaker.shared_state != "closed":
                    break
            await change_profile(primary, rate_503=0.0, rate_hang=1.0)  # trials now hang
            for _ in range(3000):  # until the next trial hangs at the primary
                if primary.stats()["in_flight"]:
                    break
                await anyio.sleep(0.02)
        assert trials.running == {PRIMARY} and router.health(PRIMARY).breaker.state == "half-open"
    assert not trials.running  # closing cancelled the trial and ended its task
    sent = trials.sent[PRIMARY]
    trials.start(router.routes["chat"].targets[0])  # a closed client starts nothing
    assert not trials.running and trials.sent[PRIMARY] == sent


@pytest.mark.anyio
async def test_a_request_whose_every_target_awaits_a_trial_asks_one_once_without_waiting(
    primary: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No request waits on a trial: with the only target's circuit open, a request does not
    sleep until the trial is due, nor is it refused (refusing cannot give an answer): it asks
    the target once, at once (failing open), and means what the target said (a 503)."""
    cfg = flapping_config(primary, primary)
    cfg["models"]["chat"] = {"targets": [PRIMARY], "policy": "fastest"}
    cfg["routing"].update(breaker_failures=1, breaker_cooldown="1s", breaker_max_cooldown="1s")
    slept: list[float] = []
    real_sleep = anyio.sleep

    async def recording(delay: float, *args: Any, **kwargs: Any) -> None:
        slept.append(delay)
        await real_sleep(delay, *args, **kwargs)

    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=2) as client:
        router = client._router
        assert router is not None
        router._clock = FakeClock()  # the trial is due in 1 s of a clock that does not move
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert router.health(PRIMARY).breaker.state == "open"
        sent = primary.stats()["chat_requests"]
        monkeypatch.setattr(anyio, "sleep", recording)
        with pytest.raises(AllTargetsFailed, match="503") as raised:
            await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert primary.stats()["chat_requests"] == sent + 1  # once, whatever max_retries says
    assert router.health(PRIMARY).breaker.state == "open"
    attempts = raised.value.report.attempts
    assert [(a.target, a.outcome, a.failed_open) for a in attempts] == [(PRIMARY, "error", True)]
    assert [s for s in slept if s > 0] == []  # no retry round for a target asked that way
    # It means what the target said (a 503), for openai-style retry code to see.
    assert isinstance(raised.value, openai.InternalServerError)
    assert raised.value.status_code == 503 and isinstance(raised.value.last, openai.APIStatusError)


def single_target_config(server: Simulator, **provider: Any) -> dict[str, Any]:
    """One route, ``pro``, on the primary alone; its circuit opens at the first failure."""
    cfg = flapping_config(server, server)
    cfg["providers"]["primary"].update(provider)
    cfg["models"] = {"pro": {"targets": [PRIMARY], "policy": "fastest", "server_error_retries": 0}}
    cfg["routing"]["breaker_failures"] = 1
    return cfg


async def until_closed(breaker: CircuitBreaker) -> None:
    await eventually(lambda: breaker.shared_state == "closed")


@pytest.mark.anyio
async def test_a_target_used_for_responses_is_tried_with_a_responses_call(
    primary: Simulator,
) -> None:
    """A Responses-only model (chat/completions 404) had chat trials: never closed."""
    cfg = single_target_config(primary, responses=True)
    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0) as client:
        trials, breaker = client._llmroute.trials, client._llmroute.router.health(PRIMARY).breaker
        with pytest.raises(openai.InternalServerError):
            await client.responses.create(model="pro", input="Hi")
        assert breaker.shared_state == "open"
        await change_profile(primary, rate_503=0.0)
        await until_closed(breaker)
        await client.responses.create(model="pro", input="Hi")
    stats = primary.stats()
    assert trials.verdicts[PRIMARY, "closed"] == 1
    assert stats["chat_requests"] == 0
    assert stats["responses_requests"] == 2 + trials.sent[PRIMARY]
    trial = [r["json"] for r in primary.last_requests if r["json"].get("max_output_tokens")]
    assert trial[-1] == {"model": "sim-small", "input": "Hi", "max_output_tokens": 16}


class Forwarding(httpx.AsyncBaseTransport):
    """The application's only way out (a proxy, say): every request goes to ``server``."""

    def __init__(self, server: Simulator) -> None:
        self.port = httpx.URL(server.base_url).port
        self.inner = httpx.AsyncHTTPTransport(verify=server.ssl_context())
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        request.url = request.url.copy_with(host="127.0.0.1", port=self.port)
        request.headers["host"] = f"127.0.0.1:{self.port}"
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.anyio
async def test_trials_go_through_the_applications_own_http_client(primary: Simulator) -> None:
    cfg = single_target_config(primary)
    cfg["providers"]["primary"]["base_url"] = "https://vendor.invalid/v1"  # only via the app
    via = Forwarding(primary)
    async with (
        httpx.AsyncClient(transport=via) as http,
        AsyncOpenAI(config=cfg, http_client=http, max_retries=0) as client,
    ):
        trials, breaker = client._llmroute.trials, client._llmroute.router.health(PRIMARY).breaker
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="pro", messages=MESSAGES)
        await change_profile(primary, rate_503=0.0)
        await until_closed(breaker)
        await client.chat.completions.create(model="pro", messages=MESSAGES)
    assert trials.verdicts[PRIMARY, "closed"] == 1
    assert via.paths == ["/v1/chat/completions"] * (2 + trials.sent[PRIMARY])
    assert primary.stats()["chat_requests"] == len(via.paths)


async def open_the_primarys_circuit(client: AsyncOpenAI) -> None:
    router = client._llmroute.router
    for _ in range(10):
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        if router.health(PRIMARY).breaker.shared_state != "closed":
            return
    raise AssertionError("the primary's circuit did not open")


@pytest.mark.anyio
async def test_a_client_dropped_without_close_sends_no_more_trials(
    primary: Simulator, fallback: Simulator
) -> None:
    """openai's client starts no background work, so code never needed ``close()``: a dropped
    client's trials must not go on for ever (holding its state and connections)."""
    cfg = flapping_config(primary, fallback)
    client = AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0)
    dispatch = client._llmroute
    trials = dispatch.trials
    try:
        with anyio.fail_after(60):  # a hang guard only
            await open_the_primarys_circuit(client)
            assert PRIMARY in trials.running
            del client
            gc.collect()
            await eventually(lambda: not trials.running)  # at its next turn (0.4 s at most)
        sent, seen = trials.sent[PRIMARY], primary.stats()["chat_requests"]
        await anyio.sleep(0.5)  # past the next trials' due times
        assert trials.sent[PRIMARY] == sent and primary.stats()["chat_requests"] == seen
    finally:
        await dispatch.aclose()


@pytest.mark.anyio
async def test_trials_stop_when_nobody_asks_for_the_target_and_a_request_restarts_them(
    primary: Simulator, fallback: Simulator
) -> None:
    cfg = flapping_config(primary, fallback)
    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0) as client:
        trials = client._llmroute.trials
        trials.idle = 0.3
        with anyio.fail_after(60):  # a hang guard only
            await open_the_primarys_circuit(client)
            await eventually(lambda: not trials.running)
            assert client._llmroute.router.health(PRIMARY).breaker.shared_state != "closed"
            await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert trials.running == {PRIMARY}


@pytest.mark.anyio
async def test_trials_stop_after_a_while_without_requests_however_long_the_outage() -> None:
    """A failed trial re-opens the circuit: that is no request, and does not keep the trials
    of a target nobody asks for going (nor those of a dropped client)."""
    target = RouteTarget("a", "m")
    route = Route("chat", (target,), FailoverPolicy())
    router = Router(
        {"chat": route}, breaker_failures=1, breaker_cooldown=0.01, breaker_max_cooldown=0.01
    )
    clock = FakeClock()
    trials = CircuitTrials(router, failing_senders, idle=10.0, clock=clock)
    router.record_call("a:m", elapsed=None, exc=status_error(503))
    trials.start(target)  # a request planned over it, at 1000 s
    await eventually(lambda: trials.verdicts["a:m", "failed"] >= 1)
    clock.advance(6.0)
    failed = trials.verdicts["a:m", "failed"]
    await eventually(lambda: trials.verdicts["a:m", "failed"] > failed)  # re-opened at 1006 s
    clock.advance(6.0)  # 12 s after the last request planned: the task ends at its next turn
    await eventually(lambda: not trials.running)
    assert router.health("a:m").breaker.shared_state == "open"
    trials.start(target)  # the next request planned over it starts them again
    assert trials.running == {"a:m"}
    await trials.aclose()


def failing_senders(endpoint: str) -> Any:
    async def send(
        target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
    ) -> tuple[httpx.Response, Timings]:
        raise status_error(503)

    return send


def test_trials_go_on_in_a_second_event_loop() -> None:
    """A client used across two ``asyncio.run()`` calls: the first loop ends while a trial's
    task waits for its next turn; in the second, the task that a planned request starts again
    must not wait on an event of the first loop (``bound to a different event loop``). (The
    trials' own machinery, with a stand-in sender: llmroute's transport keeps its connections
    to one loop.)"""
    router = Router({}, breaker_failures=1, breaker_cooldown=0.05, breaker_max_cooldown=0.05)
    answers = [503, 503, 200]
    sent: list[int] = []

    def senders(endpoint: str) -> Any:
        async def send(
            target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
        ) -> tuple[httpx.Response, Timings]:
            status = answers[min(len(sent), len(answers) - 1)]
            sent.append(status)
            if status >= 400:
                raise status_error(status)
            request = httpx.Request("POST", "https://vendor.test/v1/chat/completions")
            return httpx.Response(200, json={}, request=request), Timings(started_at=0.0)

        return send

    trials = CircuitTrials(router, senders)
    target = RouteTarget("a", "m")

    async def until(done: Callable[[], bool]) -> None:
        trials.start(target)  # as each planned request does
        await eventually(done)

    router.record_call("a:m", elapsed=None, exc=status_error(503))
    anyio.run(until, lambda: trials.verdicts["a:m", "failed"] >= 1, backend="asyncio")
    # The first loop ended while the task waited for its next trial (the task ended with it).
    anyio.run(until, lambda: trials.verdicts["a:m", "closed"] == 1, backend="asyncio")
    assert router.health("a:m").breaker.state == "closed" and sent == [503, 503, 200]


@pytest.mark.anyio
async def test_a_circuit_opened_by_broken_streams_names_the_break(primary: Simulator) -> None:
    """A circuit opened by streams that broke mid-answer (no continuation possible on a route of
    one target): a request while it is open asks the target once more (failing open, it is the
    only target) and means what broke (a connection error: the server reset it), not a bare
    AllTargetsFailed."""
    cfg = single_target_config(primary, headers={"x-sim-fault": "drop:3"})
    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None
        router._clock = FakeClock()  # no trial comes due while the test runs
        with pytest.raises(StreamInterrupted):
            stream = await client.chat.completions.create(
                model="pro", messages=MESSAGES, stream=True
            )
            async for _ in stream:
                pass
        assert router.health(PRIMARY).breaker.state == "open"
        with pytest.raises(AllTargetsFailed) as raised:
            await client.chat.completions.create(model="pro", messages=MESSAGES)
    assert isinstance(raised.value, openai.APIConnectionError)
    assert isinstance(raised.value.last, openai.APIConnectionError)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["openai", "dashscope"])
async def test_a_vendor_that_deprecated_max_tokens_is_tried_with_max_completion_tokens(
    primary: Simulator, kind: str
) -> None:
    """OpenAI's reasoning models refuse max_tokens and Model Studio (DashScope) deprecated it:
    the trial a target of theirs gets carries max_completion_tokens, as their catalog files say."""
    cfg = single_target_config(primary, kind=kind)
    async with AsyncOpenAI(config=cfg, verify=primary.ssl_context(), max_retries=0) as client:
        trials, breaker = client._llmroute.trials, client._llmroute.router.health(PRIMARY).breaker
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="pro", messages=MESSAGES)
        await change_profile(primary, rate_503=0.0)
        await until_closed(breaker)
    assert trials.verdicts[PRIMARY, "closed"] == 1
    chats = [r["json"] for r in primary.last_requests if r["path"] == "/v1/chat/completions"]
    tried = [body for body in chats if body["messages"][0]["content"] == "Hi"]
    assert tried and tried[-1] == {
        "model": "sim-small",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_completion_tokens": 1,
    }
