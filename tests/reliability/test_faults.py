"""Every fault a target can show, and the exact outcome the caller gets.

Each case runs twice: with a healthy target beside the faulty one (the caller must get the whole,
correct answer) and with the faulty target alone (the caller must get a typed error naming the
cause, within its deadline). Faults come from the simulator (``x-sim-fault``), applied to the
first request of a unique key only, so the target that fails over or continues is served.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from llmroute import (
    AllTargetsFailed,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncOpenAI,
    FirstTokenTimeout,
    MalformedStreamError,
    RateLimitError,
    StreamInterrupted,
)
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me about faults."}]
TIMEOUT = httpx.Timeout(10.0, read=1.0)  # the read timeout is also the deadline between events


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the same transport and engine run on trio in tests/routing/test_routing.py


@pytest.fixture(scope="module")
def target() -> Iterator[Simulator]:
    """20-token replies, 10 ms apart; a hang lasts at most 20 s (the tests give up far sooner)."""
    profile = Profile(reply_tokens=20, inter_token=0.01, hang_max=20.0)
    with Simulator(profile=profile, tls=True) as server:
        yield server


def once(kind: str) -> dict[str, str]:
    """The simulator fails only the first request with these headers."""
    return {"x-sim-fault": kind, "x-sim-fault-times": "1", "x-sim-fault-key": uuid.uuid4().hex}


def routed(first: str, *, second: str | None = None, **route: Any) -> dict[str, Any]:
    providers: dict[str, Any] = {"bad": {"base_url": first, "api_key": KEY, "continuation": {}}}
    targets = ["bad:sim-small"]
    if second is not None:
        providers["good"] = {"base_url": second, "api_key": KEY, "continuation": {}}
        targets.append("good:sim-small")
    return {
        "providers": providers,
        "models": {"chat": {"targets": targets, "policy": "failover", **route}},
        "routing": {"explore": 0},
    }


async def expected(target: Simulator) -> str:
    async with AsyncOpenAI(
        api_key=KEY, base_url=target.base_url, verify=target.ssl_context()
    ) as client:
        whole = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
    return whole.choices[0].message.content or ""


async def stream_text(client: AsyncOpenAI, **kwargs: Any) -> tuple[str, Any]:
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, **kwargs
    )
    parts: list[str] = []
    async with stream:
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
    return "".join(parts), stream.route


def dead_url() -> str:
    with socket.socket() as sock:  # nobody listens on it once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"https://127.0.0.1:{port}/v1"


# -- mid-stream and first-token faults of a live target ---------------------------------------

STREAM_FAULTS = {
    # fault: (how the lone target fails, what the error says)
    "drop:3": (StreamInterrupted, "broke after 3 tokens"),
    "truncate:3": (StreamInterrupted, "no \\[DONE\\] and no finish_reason"),
    "malformed:3": (MalformedStreamError, "not valid JSON"),
    "stall-between:3:30": (StreamInterrupted, "timed out"),
    "loris:3:0.2": (StreamInterrupted, "timed out"),
}


@pytest.mark.parametrize("kind", list(STREAM_FAULTS))
async def test_a_break_mid_answer_is_continued_on_a_healthy_target(
    target: Simulator, kind: str
) -> None:
    cfg = routed(target.base_url, second=target.base_url)
    async with AsyncOpenAI(
        config=cfg, verify=target.ssl_context(), timeout=TIMEOUT, max_retries=0
    ) as client:
        with anyio.fail_after(10):
            text, route = await stream_text(client, extra_headers=once(kind))
    assert text == await expected(target)
    assert route.continued_on == ["good:sim-small"]
    assert route.attempts[0].outcome == "interrupted"


@pytest.mark.parametrize("kind", list(STREAM_FAULTS))
async def test_a_break_mid_answer_alone_is_never_returned_as_complete(
    target: Simulator, kind: str
) -> None:
    error, says = STREAM_FAULTS[kind]
    async with AsyncOpenAI(
        api_key=KEY,
        base_url=target.base_url,
        verify=target.ssl_context(),
        timeout=TIMEOUT,
        max_retries=0,
    ) as client:
        with anyio.fail_after(10), pytest.raises(error, match=says) as caught:
            stream = await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=True, extra_headers=once(kind)
            )
            async for _ in stream:
                pass
    if isinstance(caught.value, StreamInterrupted):
        whole = await expected(target)
        partial = caught.value.partial_text
        assert partial and whole.startswith(partial) and partial != whole
    # The 1 s deadline ended it, not the 20 s hang: fail_after(10) above would have said so.


async def test_a_slow_reader_of_a_big_event_is_not_taken_for_a_slow_loris(
    target: Simulator,
) -> None:
    async with AsyncOpenAI(
        api_key=KEY,
        base_url=target.base_url,
        verify=target.ssl_context(),
        timeout=TIMEOUT,
        max_retries=0,
    ) as client:
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers=once("oversized:2:300000"),  # one 300 kB event, many DATA frames
        )
        chunks = 0
        async with stream:
            async for _ in stream:
                chunks += 1
                if chunks == 3:
                    await anyio.sleep(1.5)  # longer than the 1 s read timeout: our own pause
    assert chunks > 20  # the whole answer, the big event skipped as an unknown chunk


async def test_an_oversized_event_is_refused_without_buffering_it(target: Simulator) -> None:
    async with AsyncOpenAI(
        api_key=KEY, base_url=target.base_url, verify=target.ssl_context(), max_retries=0
    ) as client:
        with anyio.fail_after(20), pytest.raises(MalformedStreamError, match="max_event_bytes"):
            stream = await client.chat.completions.create(
                model="sim-small",
                messages=MESSAGES,
                stream=True,
                extra_headers=once("oversized:2:12000000"),  # 12 MB, over the 8 MiB limit
            )
            async for _ in stream:
                pass


@pytest.mark.parametrize(
    ("kind", "error"),
    [("hang", FirstTokenTimeout), ("loris:0:0.2", APITimeoutError)],
)
async def test_no_first_token_fails_over_within_the_deadline(
    target: Simulator, kind: str, error: type[Exception]
) -> None:
    cfg = routed(target.base_url, second=target.base_url, first_token_timeout="1s")
    async with AsyncOpenAI(
        config=cfg, verify=target.ssl_context(), timeout=TIMEOUT, max_retries=0
    ) as client:
        with anyio.fail_after(10):
            text, route = await stream_text(client, extra_headers=once(kind))
        assert text == await expected(target)
        assert [a.outcome for a in route.attempts] == ["timeout", "won"]  # within fail_after
        alone = routed(target.base_url, first_token_timeout="1s")
        async with AsyncOpenAI(
            config=alone, verify=target.ssl_context(), timeout=TIMEOUT, max_retries=0
        ) as lone:
            with anyio.fail_after(10), pytest.raises(AllTargetsFailed) as caught:
                await stream_text(lone, extra_headers=once(kind))
    assert isinstance(caught.value.errors["bad:sim-small"], error)


# -- faults before an answer: status errors, connections, TLS, DNS -----------------------------


@pytest.mark.parametrize(
    ("kind", "status", "error"),
    [("429", 429, RateLimitError), ("500", 500, APIStatusError), ("html502", 502, APIStatusError)],
)
async def test_a_status_error_fails_over_and_alone_is_typed(
    target: Simulator, kind: str, status: int, error: type[APIStatusError]
) -> None:
    # An ordered route that retries nothing in place (tests/routing/test_retry_rules.py has the
    # retries).
    cfg = routed(target.base_url, second=target.base_url, retry_after_max=0, server_error_retries=0)
    async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
        text, route = await stream_text(client, extra_headers=once(kind))
        assert text == await expected(target)
        assert route.winner == "good:sim-small"
    alone = routed(target.base_url, retry_after_max=0, server_error_retries=0)
    async with AsyncOpenAI(config=alone, verify=target.ssl_context(), max_retries=0) as c:
        with pytest.raises(AllTargetsFailed) as caught:
            await stream_text(c, extra_headers=once(kind))
    cause = caught.value.errors["bad:sim-small"]
    assert isinstance(cause, error) and cause.status_code == status
    assert isinstance(caught.value, error) and caught.value.status_code == status


async def test_a_429_storm_cools_the_target_down_for_its_retry_after(target: Simulator) -> None:
    cfg = routed(target.base_url, second=target.base_url)
    storm = {"x-sim-fault": "429", "x-sim-retry-after": "30"}
    async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
        with pytest.raises(AllTargetsFailed) as caught:  # both targets are the same storm
            await stream_text(client, extra_headers=storm)
        assert all(isinstance(e, RateLimitError) for e in caught.value.errors.values())
        # Cooling down: the next request asks nobody (the simulator counts no request) and
        # says why, without waiting out the 30 s (the deadline only guards against a hang).
        asked = target.stats()["chat_requests"]
        with anyio.fail_after(10), pytest.raises(AllTargetsFailed, match="cool"):
            await stream_text(client)
        assert target.stats()["chat_requests"] == asked


async def test_a_short_cooldown_is_waited_out_instead_of_failing(
    target: Simulator, sleeps: list[float]
) -> None:
    cfg = routed(target.base_url, retry_after_max=0)  # the 429 is not waited out in place
    async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
        with pytest.raises(AllTargetsFailed):
            await stream_text(client, extra_headers={**once("429"), "x-sim-retry-after": "0.4"})
        sleeps.clear()
        text, route = await stream_text(client)  # the only target cools down for 0.4 s
    assert text == await expected(target)
    # The retry waited for what was left of the cooldown (some of it passed in between).
    assert [s for s in sleeps if s > 0] and all(0 < s <= 0.4 for s in sleeps if s > 0)
    outcomes = [(a.reason, a.outcome) for a in route.attempts]
    assert outcomes == [("first", "error"), ("retry", "won")]


async def test_retry_after_is_waited_before_retrying_a_lone_target(
    target: Simulator, sleeps: list[float]
) -> None:
    headers = {**once("429"), "x-sim-retry-after": "0.5"}
    async with AsyncOpenAI(
        api_key=KEY, base_url=target.base_url, verify=target.ssl_context(), max_retries=1
    ) as client:
        text, _ = await stream_text_plain(client, headers)
    assert text == await expected(target)
    assert 0.5 in sleeps  # the Retry-After, waited before the retry


async def stream_text_plain(client: AsyncOpenAI, headers: dict[str, str]) -> tuple[str, Any]:
    stream = await client.chat.completions.create(
        model="sim-small", messages=MESSAGES, stream=True, extra_headers=headers
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    return "".join(parts), stream


async def test_a_5xx_burst_opens_the_breaker_and_traffic_moves(target: Simulator) -> None:
    with Simulator(profile=Profile(rate_503=1.0, retry_after=0.0), tls=True) as broken:
        cfg = routed(broken.base_url, second=target.base_url, server_error_retries=0)
        cfg["routing"]["breaker_failures"] = 3
        async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
            for _ in range(3):
                text, route = await stream_text(client)
                assert text == await expected(target)
                assert [a.outcome for a in route.attempts] == ["error", "won"]
            assert client.stats()["bad:sim-small"].breaker == "open"
            asked = broken.stats()["chat_requests"]
            text, route = await stream_text(client)
            assert route.winner == "good:sim-small"
            assert broken.stats()["chat_requests"] == asked  # the open circuit is not asked


async def test_every_cause_is_kept_when_no_target_can_answer(
    target: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Simulator(tls=False) as plain:  # an https:// URL to a plain-HTTP server: TLS fails
        tls_broken = plain.base_url.replace("http://", "https://")
        real = socket.getaddrinfo

        def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
            if host == "dns-fails.invalid":
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", resolve)
        cfg = {
            "providers": {
                "refused": {"base_url": dead_url(), "api_key": KEY},
                "tls": {"base_url": tls_broken, "api_key": KEY},
                "dns": {"base_url": "https://dns-fails.invalid/v1", "api_key": KEY},
                "html": {"base_url": target.base_url, "api_key": KEY},
            },
            "models": {
                "chat": {
                    "targets": ["refused:m", "tls:m", "dns:m", "html:sim-small"],
                    "policy": "failover",
                }
            },
            "routing": {"explore": 0},
        }
        async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
            with anyio.fail_after(20), pytest.raises(AllTargetsFailed) as caught:
                await stream_text(client, extra_headers={"x-sim-fault": "html502"})
    errors = caught.value.errors
    assert set(errors) == {"refused:m", "tls:m", "dns:m", "html:sim-small"}
    assert isinstance(errors["refused:m"], APIConnectionError)
    assert "cannot connect" in str(errors["refused:m"])
    assert isinstance(errors["tls:m"], APIConnectionError)
    assert "SSL" in str(errors["tls:m"]) or "TLS" in str(errors["tls:m"])
    assert isinstance(errors["dns:m"], APIConnectionError)
    assert "dns-fails.invalid" in str(errors["dns:m"])
    assert isinstance(errors["html:sim-small"], APIStatusError)
    assert errors["html:sim-small"].status_code == 502
    message = str(caught.value)
    for name in errors:
        assert name in message  # one message names every target's cause


# -- the caller leaving ------------------------------------------------------------------------


async def test_a_cancelled_reader_releases_the_upstream_stream_at_once() -> None:
    profile = Profile(reply_tokens=500, inter_token=0.01)
    with Simulator(profile=profile, tls=True) as slow:
        async with AsyncOpenAI(config=routed(slow.base_url), verify=slow.ssl_context()) as c:
            # The reader is cancelled once its stream is under way (not after 0.3 s, which a
            # loaded machine may spend before the request reaches the simulator at all).
            read = 0
            with anyio.CancelScope() as scope:
                stream = await c.chat.completions.create(
                    model="chat", messages=MESSAGES, stream=True
                )
                async with stream:
                    async for chunk in stream:
                        read += 1
                        if chunk.choices and chunk.choices[0].delta.content:
                            scope.cancel()
            assert scope.cancelled_caught and read < 100
            with anyio.move_on_after(30):  # a hang guard only
                while slow.stats()["streams_cancelled"] < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            stats = slow.stats()
    assert stats["streams_cancelled"] == 1
    assert stats["streams_completed"] == 0


async def test_a_stall_between_chunks_is_continued_on_another_target(target: Simulator) -> None:
    """The stream stops after 5 tokens with its socket open; the route's deadline between
    chunks notices it (not the 600 s read timeout) and the answer ends on the other target."""
    # 2 s: far below the 20 s stall, far above a pause of a loaded machine between chunks.
    cfg = routed(target.base_url, second=target.base_url, stall_timeout="2s")
    async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
        text, route = await stream_text(client, extra_headers=once("stall-between:5:20"))
    assert text == await expected(target)
    assert route.continued_on == ["good:sim-small"]
    first = route.attempts[0]
    assert (first.target, first.outcome) == ("bad:sim-small", "interrupted")
    assert "StallTimeout" in (first.error or "") and "stall" in (first.error or "")


async def test_the_stall_deadline_follows_live_pauses_between_chunks(target: Simulator) -> None:
    from llmroute.routing.answer import stall_deadline_of
    from llmroute.routing.stats import STALL_FLOOR, STALL_PRIOR

    cfg = routed(target.base_url, second=target.base_url)  # stall_timeout = "auto"
    async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None
        stats = router.stats.target("bad:sim-small")
        assert stats.gap_quantile(0.99) is None  # no streams yet: the prior
        chat = router.routes["chat"]
        assert stall_deadline_of(chat, stats) == STALL_PRIOR
        for _ in range(5):
            await stream_text(client)
        gap = stats.gap_quantile(0.99)
        assert gap is not None and gap < STALL_FLOOR / 4  # 10 ms between tokens
        assert stall_deadline_of(chat, stats) == STALL_FLOOR
        text, route = await stream_text(client, extra_headers=once("stall-between:5:20"))
    assert text == await expected(target)
    assert route.continued_on == ["good:sim-small"]


async def test_a_fresh_client_sets_the_stall_deadline_from_the_streams_own_pauses(
    target: Simulator,
) -> None:
    """No stream of the target measured yet (the 10 s prior): after a few pauses of ~10 ms
    the stream's own rule gives the floor, 4 s, and the stall is continued on that."""
    from llmroute.routing.stats import STALL_STREAM_FLOOR, STALL_STREAM_GAPS

    cfg = routed(target.base_url, second=target.base_url)  # stall_timeout = "auto"
    async with AsyncOpenAI(config=cfg, verify=target.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None
        assert router.stats.target("bad:sim-small").gap_quantile(0.99) is None  # fresh
        tokens = STALL_STREAM_GAPS + 4  # the stall comes after that many pauses
        text, route = await stream_text(client, extra_headers=once(f"stall-between:{tokens}:20"))
    assert text == await expected(target)  # whole and exact: nothing lost, nothing repeated
    assert route.continued_on == ["good:sim-small"]
    first = route.attempts[0]
    assert (first.target, first.outcome) == ("bad:sim-small", "interrupted")
    assert f"for {STALL_STREAM_FLOOR:.3g} s (a stall)" in (first.error or "")  # not the prior


async def test_a_stall_over_http1_is_noticed_by_the_engines_own_deadline() -> None:
    """Plain HTTP/1.1 bodies have no bounded wait of their own: the engine's scope is used."""
    profile = Profile(reply_tokens=20, inter_token=0.01, hang_max=20.0)
    with Simulator(profile=profile, tls=False) as plain:
        cfg = routed(plain.base_url, second=plain.base_url, stall_timeout="2s")
        async with AsyncOpenAI(config=cfg, max_retries=0) as client:
            text, route = await stream_text(client, extra_headers=once("stall-between:5:20"))
        assert text == await expected(plain)
    assert route.continued_on == ["good:sim-small"]
    assert "StallTimeout" in (route.attempts[0].error or "")
