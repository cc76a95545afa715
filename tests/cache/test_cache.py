"""The response cache end to end: a client, a simulator over TLS + HTTP/2, and each store."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from llmroute import AsyncOpenAI, ConfigError, StreamInterrupted
from llmroute.cache import CacheRequest, CacheUnavailable, ResponseCache
from llmroute.testing import Profile, Simulator

from ..clock import FakeClock
from ..conftest import KEY
from ..settle import settled, stored

pytestmark = pytest.mark.anyio

HEADER = "x-llmroute-cache"


@pytest.fixture(scope="module")
def sim_paced() -> Iterator[Simulator]:
    """20 tokens 10 ms apart: streams that overlap when sent together."""
    with Simulator(profile=Profile(reply_tokens=20, inter_token=0.01), tls=True) as server:
        yield server


def messages() -> list[dict[str, str]]:
    """A prompt no other test asks."""
    return [{"role": "user", "content": f"cache test {uuid.uuid4().hex}"}]


def cache_config(sim: Simulator, **cache: Any) -> dict[str, Any]:
    return {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
        "routing": {"explore": 0},
        "cache": {"backend": "memory", **cache},
    }


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=cache_config(sim)
    ) as c:
        yield c


async def together(n: int, call: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``call()`` ``n`` times at once; the results in the order they finished."""
    results: list[Any] = []

    async def one() -> None:
        results.append(await call())

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return results


def upstream(sim: Simulator) -> int:
    return sim.stats()["chat_requests"]


async def ask(client: AsyncOpenAI, msgs: list[dict[str, str]], **params: Any) -> Any:
    params.setdefault("temperature", 0)
    return await client.chat.completions.create(model="chat", messages=msgs, **params)


async def ask_stream(client: AsyncOpenAI, msgs: list[dict[str, str]], **params: Any) -> Any:
    stream = await ask(client, msgs, stream=True, **params)
    chunks = [chunk async for chunk in stream]
    return stream, chunks


def text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def dumps(chunks: list[Any]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in chunks]


async def test_a_popular_stream_is_stored_on_its_second_ask_and_replayed_exactly(
    client: AsyncOpenAI, sim: Simulator
) -> None:
    msgs = messages()
    before = upstream(sim)
    first, _ = await ask_stream(client, msgs)
    second, live = await ask_stream(client, msgs)
    assert upstream(sim) == before + 2  # asked once: not popular yet; the second ask stores it
    assert not first.route.cache_hit and not second.route.cache_hit
    third, replayed = await ask_stream(client, msgs)
    assert upstream(sim) == before + 2
    assert third.route.cache_hit and third.route.winner == "cache" and not third.route.attempts
    assert dumps(replayed) == dumps(live)
    assert replayed[0].choices[0].delta.role == "assistant"
    assert replayed[-1].choices[0].finish_reason == "stop"
    assert third.timings.first_token is not None and third.timings.tokens == 20
    assert third.response.headers["x-llmroute-cache"] == "hit"


async def test_non_streamed_answers_are_cached_and_cross_over(
    client: AsyncOpenAI, sim: Simulator
) -> None:
    msgs = messages()
    before = upstream(sim)
    await ask(client, msgs)
    live = await ask(client, msgs)
    hit = await ask(client, msgs)
    assert upstream(sim) == before + 2
    assert hit.route.cache_hit and hit.to_dict() == live.to_dict()
    assert hit.timings.total is not None
    # The same prompt streamed: the stored completion unfolds into chunks.
    stream, chunks = await ask_stream(client, msgs)
    assert stream.route.cache_hit and upstream(sim) == before + 2
    assert text(chunks) == live.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1


async def test_a_stream_recorded_without_usage_does_not_answer_a_request_for_usage(
    client: AsyncOpenAI, sim: Simulator
) -> None:
    msgs = messages()
    before = upstream(sim)
    await ask_stream(client, msgs)
    await ask_stream(client, msgs)
    stream, chunks = await ask_stream(client, msgs, stream_options={"include_usage": True})
    assert not stream.route.cache_hit and upstream(sim) == before + 3
    assert chunks[-1].usage is not None
    # Now stored with usage, it answers both kinds of request.
    with_usage, replayed = await ask_stream(client, msgs, stream_options={"include_usage": True})
    assert with_usage.route.cache_hit and dumps(replayed) == dumps(chunks)
    plain, replayed = await ask_stream(client, msgs)
    assert plain.route.cache_hit and all(c.choices for c in replayed)
    completion = await ask(client, msgs)
    assert completion.route.cache_hit and completion.usage is not None
    assert upstream(sim) == before + 3


async def test_only_deterministic_requests_are_cached_unless_asked(
    client: AsyncOpenAI, sim: Simulator
) -> None:
    msgs = messages()
    before = upstream(sim)
    for _ in range(3):
        await ask(client, msgs, temperature=0.7)
    assert upstream(sim) == before + 3
    for _ in range(3):
        answer = await ask(client, msgs, temperature=0.7, extra_headers={HEADER: "on"})
    assert answer.route.cache_hit and upstream(sim) == before + 5
    seeded = messages()
    for _ in range(3):
        answer = await ask(client, seeded, temperature=1, seed=42)
    assert answer.route.cache_hit and upstream(sim) == before + 7


async def test_the_cache_header_turns_it_off_or_read_only_and_is_never_sent(
    client: AsyncOpenAI, sim: Simulator
) -> None:
    msgs = messages()
    before = upstream(sim)
    for _ in range(3):
        answer = await ask(client, msgs, extra_headers={HEADER: "read-only"})
        assert not answer.route.cache_hit
    assert upstream(sim) == before + 3  # read-only never stores
    await ask(client, msgs)
    await ask(client, msgs)
    assert (await ask(client, msgs, extra_headers={HEADER: "read-only"})).route.cache_hit
    assert not (await ask(client, msgs, extra_headers={HEADER: "off"})).route.cache_hit
    off_client = client.with_options(default_headers={HEADER: "off"})
    assert not (await ask(off_client, msgs)).route.cache_hit
    assert (await ask(off_client, msgs, extra_headers={HEADER: None})).route.cache_hit
    sent = [r["headers"] for r in sim.last_requests]
    assert sent and not any(k.lower().startswith("x-llmroute") for h in sent for k in h)
    with pytest.raises(ConfigError, match="x-llmroute-cache: expected one of"):
        await ask(client, msgs, extra_headers={HEADER: "sometimes"})
    with pytest.raises(ConfigError, match="x-llmroute-cache-namespace"):
        await ask(client, msgs, extra_headers={"x-llmroute-cache-namespace": "a/b"})


async def test_tenants_never_see_each_others_answers(sim: Simulator, tmp_path: Path) -> None:
    def make(key: str, **cache: Any) -> AsyncOpenAI:
        config = cache_config(sim, backend="disk", path=str(tmp_path), **cache)
        config["providers"]["sim"]["api_key"] = key
        return AsyncOpenAI(api_key=key, config=config, verify=sim.ssl_context())

    msgs = messages()
    async with make(KEY) as a, make(KEY + "-other") as b, make(KEY) as a_again:
        await ask(a, msgs)
        await ask(a, msgs)
        await stored(a)
        assert (await ask(a, msgs)).route.cache_hit
        assert not (await ask(b, msgs)).route.cache_hit
        assert (await ask(a_again, msgs)).route.cache_hit  # same key, another client: same tenant
        # An explicit namespace is shared by whoever names it, whatever their key.
        for c in (a, b):
            await ask(c, msgs, extra_headers={"x-llmroute-cache-namespace": "team"})
            await stored(c)
        assert (
            await ask(b, msgs, extra_headers={"x-llmroute-cache-namespace": "team"})
        ).route.cache_hit
    assert not files_containing(tmp_path, KEY.encode())


async def test_a_key_known_only_when_openai_sends_the_call_never_shares_answers(
    sim: Simulator, tmp_path: Path
) -> None:
    """openai's API key provider (a callable, called as each request is sent) leaves
    ``api_key`` empty until then: two tenants with providers looked the same to the cache, and
    one got the other's answers. Their direct calls are cached only in a namespace they name."""
    keys = {"a": KEY, "b": KEY + "-other"}

    def make(tenant: str) -> AsyncOpenAI:
        async def provide() -> str:
            return keys[tenant]

        config = {"cache": {"backend": "disk", "path": str(tmp_path), "min_hits": 1}}
        return AsyncOpenAI(
            api_key=provide, base_url=sim.base_url, config=config, verify=sim.ssl_context()
        )

    msgs: Any = messages()
    async with make("a") as a, make("b") as b:
        for extra in (None, {"x-trace": "1"}):  # the early check, and the seam
            for c in (a, b, a, b):
                answer: Any = await c.chat.completions.create(
                    model="sim-small", messages=msgs, temperature=0, extra_headers=extra
                )
                await stored(c)
                assert not getattr(answer.route, "cache_hit", False), (extra, c is a)
        sent = [r["headers"].get("authorization") for r in sim.last_requests[-8:]]
        assert sent == [f"Bearer {keys[t]}" for t in "abab" * 2]
        # A namespace the calls name is shared, as any client's is.
        named = {"x-llmroute-cache-namespace": "team"}
        for c in (a, b):
            await c.chat.completions.create(
                model="sim-small", messages=msgs, temperature=0, extra_headers=named
            )
            await stored(c)
        again: Any = await b.chat.completions.create(
            model="sim-small", messages=msgs, temperature=0, extra_headers=named
        )
        assert again.route.cache_hit
    assert not files_containing(tmp_path, KEY.encode())


def files_containing(root: Path, secret: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


async def test_twenty_identical_requests_make_one_upstream_call(
    sim_paced: Simulator,
) -> None:
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY,
        verify=sim_paced.ssl_context(),
        config=cache_config(sim_paced),
    ) as c:
        before = upstream(sim_paced)
        results = await together(20, lambda: ask_stream(c, msgs))
        assert upstream(sim_paced) == before + 1
        assert len(results) == 20
        answers = {str(dumps(chunks)) for _, chunks in results}
        assert len(answers) == 1 and len(results[0][1]) >= 20
        shared = [s for s, _ in results if s.route.shared]
        assert len(shared) == 19
        assert all(s.timings.first_token is not None for s, _ in results)
        # Asked 20 times: popular, so stored; the next ask is a hit.
        stream, chunks = await ask_stream(c, msgs)
        assert stream.route.cache_hit and dumps(chunks) == dumps(results[0][1])
        assert upstream(sim_paced) == before + 1


async def test_identical_non_streamed_requests_share_one_call(sim_paced: Simulator) -> None:
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY, verify=sim_paced.ssl_context(), config=cache_config(sim_paced)
    ) as c:
        before = upstream(sim_paced)
        results = await together(10, lambda: ask(c, msgs))
        assert upstream(sim_paced) == before + 1
        assert len({r.choices[0].message.content for r in results}) == 1
        assert sum(1 for r in results if r.route.shared) == 9


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "stream"])
@pytest.mark.parametrize("backend", ["disk", "redis"])
async def test_the_ask_right_after_the_popular_one_goes_no_further_than_the_store(
    sim: Simulator, tmp_path: Path, request: pytest.FixtureRequest, backend: str, stream: bool
) -> None:
    """Three asks back to back, no pause: the third finds the second's answer, stored or
    still being stored (a real store writes in a worker, after the caller has its answer)."""
    config = cache_config(sim, backend=backend, path=str(tmp_path))
    if backend == "redis":
        prefix = f"test-{uuid.uuid4().hex[:8]}"
        config["redis"] = {"url": request.getfixturevalue("redis_url"), "prefix": prefix}
    msgs = messages()
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
        before = upstream(sim)
        answers = []
        for _ in range(2):
            answers.append(await ask_stream(c, msgs) if stream else await ask(c, msgs))
        second = upstream(sim)
        answers.append(await ask_stream(c, msgs) if stream else await ask(c, msgs))
        assert upstream(sim) == second <= before + 2  # the third ask sent nothing
        third = answers[-1][0] if stream else answers[-1]
        assert third.route.cache_hit and not third.route.shared
        if stream:
            assert dumps(answers[-1][1]) == dumps(answers[1][1])
        else:
            assert third.to_dict() == answers[1].to_dict()
        await stored(c)
        assert c._cache is not None
        await c._cache.clear()


@pytest.mark.parametrize("early", [True, False], ids=["early-check", "seam"])
async def test_a_lookup_that_missed_an_answer_then_stored_looks_again(
    sim: Simulator, early: bool
) -> None:
    """The third ask's lookup misses while the second's answer is being stored, and that
    store ends (its call forgotten) before the third could join it: the third looks again and
    hits, where it would have called upstream (before openai's machinery, or at the seam)."""
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=cache_config(sim)) as c:
        cache = c._cache
        assert cache is not None
        store: Any = cache.store
        writing, release = anyio.Event(), anyio.Event()
        store_set, store_get = store.set, store.get

        async def held_set(key: str, value: bytes, *, ttl: float) -> None:
            writing.set()
            await release.wait()
            await store_set(key, value, ttl=ttl)

        async def racing_get(key: str) -> bytes | None:
            value = await store_get(key)
            if value is None and writing.is_set() and not release.is_set():
                release.set()  # the store ends now, after this lookup missed
                for _ in range(1000):  # turns of the loop until the call is forgotten
                    if not cache._flights:
                        break
                    await anyio.lowlevel.checkpoint()
                assert not cache._flights
            return value

        store.set, store.get = held_set, racing_get
        headers = {} if early else {"extra_headers": {HEADER: "auto"}}
        msgs = messages()
        before = upstream(sim)
        with anyio.fail_after(30):  # a hang guard only
            await ask(c, msgs, **headers)
            live = await ask(c, msgs, **headers)
            await writing.wait()
            third = await ask(c, msgs, **headers)
        assert release.is_set()  # the third ask's lookup did miss during the store
        assert upstream(sim) == before + 2
        assert third.route.cache_hit and third.to_dict() == live.to_dict()


async def test_an_ask_after_an_answer_ended_waits_for_its_store_and_hits() -> None:
    """Between an answer's end and its entry's arrival in the store, an identical ask does not
    read the ended call (a cache hit the admission rule never counted): it waits for the
    store, and hits once the entry is in."""
    from openai.types.chat import ChatCompletion

    from llmroute.cache._stores import MemoryStore

    class HeldStore(MemoryStore):
        """A store whose writes wait until the test lets them through."""

        def __init__(self) -> None:
            super().__init__(2**20)
            self.writing = anyio.Event()
            self.release = anyio.Event()

        async def set(self, key: str, value: bytes, *, ttl: float) -> None:
            self.writing.set()
            await self.release.wait()
            await super().set(key, value, ttl=ttl)

    store = HeldStore()
    cache = ResponseCache(store, ttl=60, min_hits=1, window=60, max_entry_bytes=2**20)
    request = CacheRequest(
        key="ns/k", stream=False, include_usage=False, read=True, write=True, share=True
    )
    answer = ChatCompletion.model_validate(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
    )
    calls: list[int] = []

    async def call() -> ChatCompletion:
        calls.append(1)
        return answer

    hits: list[Any] = []
    with anyio.fail_after(30):  # a hang guard only
        seat, leader = cache.join(request, call)
        assert leader and (await seat.opened()) is answer
        seat.leave()
        await store.writing.wait()  # the answer is complete, its entry not in the store yet
        pending = cache.pending(request)
        assert pending is not None and pending.ended and not pending.joinable
        assert await cache.lookup(request) is None

        async def next_ask() -> None:
            hits.append(await cache.after_miss(request, pending))

        async with anyio.create_task_group() as tg:
            tg.start_soon(next_ask)
            await anyio.lowlevel.checkpoint()
            assert not hits  # waiting for the store
            store.release.set()
        await cache.aclose()
    assert calls == [1]
    assert hits[0] is not None and hits[0].completion.to_dict() == answer.to_dict()
    assert not cache._flights  # forgotten once stored


@pytest.mark.parametrize("early", [True, False], ids=["early-check", "seam"])
async def test_the_ask_after_an_unpopular_answer_ended_is_a_new_ask(
    sim: Simulator, early: bool
) -> None:
    """Three asks one after another (min_hits 2), the second while the first is still being
    counted (a disk or Redis store counts in a worker, after the caller has its answer). The
    second is the prompt's second ask: it goes upstream and is counted, and the third is a
    hit. (It used to read the first's ended call: ``shared``, counted neither as a hit nor as
    an ask, so the README's example printed False False False with the disk store.)"""
    async with AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=cache_config(sim, min_hits=2)
    ) as c:
        assert c._cache is not None
        store: Any = c._cache.store
        counting, release = anyio.Event(), anyio.Event()
        store_hit, store_get = store.hit, store.get

        async def held_hit(key: str, *, window: float) -> int:
            if not release.is_set():
                counting.set()
                await release.wait()
            return int(await store_hit(key, window=window))

        async def racing_get(key: str) -> bytes | None:
            value = await store_get(key)
            if value is None and counting.is_set():
                release.set()  # the first ask's count ends after this lookup missed
            return value

        store.hit, store.get = held_hit, racing_get
        headers = {} if early else {"extra_headers": {HEADER: "auto"}}
        msgs = messages()
        before = upstream(sim)
        with anyio.fail_after(30):  # a hang guard only
            answers = [await ask(c, msgs, **headers) for _ in range(3)]
        assert release.is_set()  # the second ask came while the first was being counted
        assert [(a.route.cache_hit, a.route.shared) for a in answers] == [
            (False, False),
            (False, False),
            (True, False),
        ]
        assert upstream(sim) == before + 2


async def test_a_reader_that_leaves_early_does_not_disturb_the_others(
    sim_paced: Simulator,
) -> None:
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY, verify=sim_paced.ssl_context(), config=cache_config(sim_paced)
    ) as c:
        before = upstream(sim_paced)
        first = await ask(c, msgs, stream=True)
        second = await ask(c, msgs, stream=True)
        async for _ in first:
            break
        await first.close()
        chunks = [chunk async for chunk in second]
        assert upstream(sim_paced) == before + 1
        assert chunks[-1].choices[0].finish_reason == "stop" and len(chunks) >= 20


async def test_when_every_reader_leaves_the_upstream_stream_is_cancelled(
    sim_paced: Simulator,
) -> None:
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY, verify=sim_paced.ssl_context(), config=cache_config(sim_paced)
    ) as c:
        await settled(sim_paced)  # an earlier test's reset lands first
        cancelled = sim_paced.stats()["streams_cancelled"]
        streams = [await ask(c, msgs, stream=True) for _ in range(3)]
        for stream in streams:
            async for _ in stream:
                break
            await stream.close()
        with anyio.move_on_after(10):
            while sim_paced.stats()["streams_cancelled"] == cancelled:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert sim_paced.stats()["streams_cancelled"] == cancelled + 1
        # Nothing was stored: the next ask goes upstream.
        before = upstream(sim_paced)
        stream, _ = await ask_stream(c, msgs)
        assert not stream.route.cache_hit and upstream(sim_paced) == before + 1


async def test_errors_and_interrupted_streams_are_never_stored(
    client: AsyncOpenAI, sim: Simulator
) -> None:
    msgs = messages()
    fault = {"x-sim-fault": "drop:5"}
    for _ in range(3):
        stream = await ask(client, msgs, stream=True, extra_headers=fault)
        with pytest.raises(StreamInterrupted):
            async for _ in stream:
                pass
    before = upstream(sim)
    stream, chunks = await ask_stream(client, msgs)
    assert not stream.route.cache_hit and upstream(sim) == before + 1
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_damaged_entry_is_a_miss_logged_once(
    client: AsyncOpenAI, sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    msgs = messages()
    await ask(client, msgs)
    await ask(client, msgs)
    cache = client._cache
    assert cache is not None
    store: Any = cache.store
    keys = list(store._entries)
    for key in keys:
        await store.set(key, b'{"v": 1, "garbage', ttl=60)
    before = upstream(sim)
    with caplog.at_level(logging.WARNING, logger="llmroute"):
        first = await ask(client, msgs)
        second = await ask(client, msgs)
    assert not first.route.cache_hit
    assert second.route.cache_hit  # stored again, correctly
    assert upstream(sim) == before + 1
    damaged = [r for r in caplog.records if "damaged entry" in r.getMessage()]
    assert len(damaged) == 1


async def test_paced_replay_is_asked_for_by_a_header(
    sim_paced: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []
    replay = ResponseCache.replay

    def recording(self: ResponseCache, hit: Any, request: CacheRequest) -> Any:
        asked.append(request.paced)
        return replay(self, hit, request)

    monkeypatch.setattr(ResponseCache, "replay", recording)
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY, verify=sim_paced.ssl_context(), config=cache_config(sim_paced)
    ) as c:
        await ask_stream(c, msgs)
        _, live_chunks = await ask_stream(c, msgs)
        paced, chunks = await ask_stream(
            c, msgs, extra_headers={"x-llmroute-cache-replay": "paced"}
        )
    # The rhythm itself is checked on a fake clock below; here, that the header asks for it.
    assert paced.route.cache_hit and len(chunks) == len(live_chunks) >= 20
    assert asked[-1] is True and not any(asked[:-1])


async def test_paced_replay_sleeps_the_recorded_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmroute.cache._cache import Hit
    from llmroute.cache._stores import MemoryStore

    clock = FakeClock()
    slept: list[float] = []

    async def sleep(delay: float) -> None:  # time passes only as the replay asks
        slept.append(delay)
        clock.advance(delay)

    monkeypatch.setattr(anyio, "sleep", sleep)
    cache = ResponseCache(
        MemoryStore(2**20), ttl=60, min_hits=1, window=60, max_entry_bytes=2**20, clock=clock
    )
    chunks: list[Any] = ["a", "b", "c", "d"]
    offsets = [0.25, 0.375, 0.375, 0.875]  # recorded from the request's start (exact in binary)

    async def replay(paced: bool, work: float = 0.0) -> list[Any]:
        request = CacheRequest("k", True, False, True, True, True, paced=paced)
        hit = Hit(entry=None, chunks=iter(zip(offsets, chunks, strict=True)))  # type: ignore[arg-type]
        out: list[Any] = []
        async for chunk in cache.replay(hit, request):
            out.append(chunk)
            clock.advance(work)  # the caller's own time per chunk
        return out

    assert await replay(paced=False) == chunks
    assert slept == []  # at once
    assert await replay(paced=True) == chunks
    assert slept == [0.125, 0.5]  # the recorded gaps after the first chunk, none for a tie
    slept.clear()
    assert await replay(paced=True, work=0.0625) == chunks
    # Time the caller spent counts against the gaps, and a gap already spent is not slept.
    assert slept == [0.0625, 0.375]


async def test_an_unreachable_redis_means_no_cache_and_one_warning(
    sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = cache_config(sim, backend="redis")
    config["redis"] = {"url": f"redis://:hunter2@127.0.0.1:{port}/0"}
    msgs = messages()
    with caplog.at_level(logging.DEBUG, logger="llmroute"):
        async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
            for _ in range(3):
                answer = await ask(c, msgs)
                assert answer.choices[0].finish_reason == "stop"
                assert not answer.route.cache_hit
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "without the cache" in warnings[0].getMessage()
    assert "hunter2" not in caplog.text


async def test_app_instances_share_answers_through_redis(sim: Simulator, redis_url: str) -> None:
    config = cache_config(sim, backend="redis")
    config["redis"] = {"url": redis_url, "prefix": f"test-{uuid.uuid4().hex[:8]}"}
    msgs = messages()
    async with (
        AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as a,
        AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as b,
    ):
        await ask(a, msgs)
        await stored(a)
        await ask(b, msgs)  # the second ask of the fleet: popular, stored
        await stored(b)
        stream, _ = await ask_stream(a, msgs)
        assert stream.route.cache_hit
        assert a._cache is not None
        stats = await a._cache.stats()
        assert (stats.entries, stats.hits) == (1, 1), stats
        await a._cache.clear()


async def test_a_plain_model_is_cached_under_its_base_url(sim: Simulator, tmp_path: Path) -> None:
    config = {"cache": {"backend": "disk", "path": str(tmp_path)}}
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config
    ) as c:
        for _ in range(3):
            answer = await c.chat.completions.create(
                model="sim-small", messages=msgs, temperature=0
            )
            await stored(c)
        assert answer.route is not None and answer.route.cache_hit
        assert answer.route.policy == "direct"
    assert os.stat(tmp_path).st_mode & 0o777 == 0o700


async def test_app_instances_share_live_ttft_stats_through_redis(
    sim: Simulator, redis_url: str
) -> None:
    config = cache_config(sim)
    del config["cache"]
    config["routing"] = {"explore": 0, "stats_backend": "redis", "stats_sync": "10ms"}
    config["redis"] = {"url": redis_url, "prefix": f"test-{uuid.uuid4().hex[:8]}"}
    async with (
        AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as a,
        AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as b,
    ):
        for _ in range(5):
            await ask(a, messages(), stream=True)
        await ask(a, messages())
        assert a.stats()["sim:sim-small"].n == 5  # the non-streamed one is a latency sample
        # Publish what a recorded: a background sync may be under way (one started after an
        # earlier request, still running on a loaded machine): wait for it, then run one.
        sync = a._stats_sync
        for _ in range(3000):  # a hang guard only (30 s)
            if not sync._running:
                break
            await anyio.sleep(0.01)
        await sync.sync()
        with anyio.move_on_after(60):  # a hang guard only: the assertion follows
            while "sim:sim-small" not in b.stats() or b.stats()["sim:sim-small"].n < 5:
                await ask(b, messages(), extra_headers={HEADER: "off"})
                await anyio.sleep(0.02)
        learned = b.stats()["sim:sim-small"]
        assert learned.n >= 5 and learned.ttft_p95 is not None
        assert a.stats()["sim:sim-small"].n == 5  # nothing came back to its sender twice


async def test_a_key_given_per_call_is_its_own_tenant(client: AsyncOpenAI, sim: Simulator) -> None:
    msgs = messages()
    other = {"Authorization": "Bearer sk-another-tenant"}
    await ask(client, msgs)
    await ask(client, msgs)
    await stored(client)
    assert (await ask(client, msgs)).route.cache_hit
    assert not (await ask(client, msgs, extra_headers=other)).route.cache_hit
    plain = client.with_options()
    for _ in range(2):
        await plain.chat.completions.create(model="sim-small", messages=msgs, temperature=0)
        await stored(plain)
    hit = await plain.chat.completions.create(model="sim-small", messages=msgs, temperature=0)
    assert hit.route.cache_hit
    miss = await plain.chat.completions.create(
        model="sim-small", messages=msgs, temperature=0, extra_headers=other
    )
    assert miss.route is None  # a live answer of a plain model: no route


async def test_changing_a_routes_targets_changes_its_answers(
    sim: Simulator, tmp_path: Path
) -> None:
    msgs = messages()
    config = cache_config(sim, backend="disk", path=str(tmp_path))
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
        for _ in range(2):
            await ask(c, msgs)
            await stored(c)
        assert (await ask(c, msgs)).route.cache_hit
    config["models"]["chat"]["targets"] = ["sim:sim-large"]
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
        answer = await ask(c, msgs)
        assert not answer.route.cache_hit and answer.model == "sim-large"


async def test_followers_get_their_own_copy_of_a_shared_completion(sim_paced: Simulator) -> None:
    msgs = messages()
    async with AsyncOpenAI(
        api_key=KEY, verify=sim_paced.ssl_context(), config=cache_config(sim_paced)
    ) as c:
        results = await together(3, lambda: ask(c, msgs))
        original = results[1].choices[0].message.content
        results[0].choices[0].message.content = "changed by one caller"
        assert results[1].choices[0].message.content == original
        assert results[2].choices[0].message.content == original


async def test_an_unusable_disk_path_means_no_cache_not_no_client(
    sim: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = cache_config(sim, backend="disk", path=str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="llmroute"):
        async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
            assert c._cache is None
            answer = await ask(c, messages())
            assert answer.choices[0].finish_reason == "stop"
    assert "without a cache" in caplog.text


async def test_closing_a_client_with_its_own_http_client_closes_the_cache(
    sim: Simulator, tmp_path: Path
) -> None:
    import httpx

    from llmroute.cache import DiskStore

    config = cache_config(sim, backend="disk", path=str(tmp_path))
    http = httpx.AsyncClient(verify=sim.ssl_context())
    async with AsyncOpenAI(api_key=KEY, http_client=http, config=config) as c:
        await ask(c, messages())
        copy = c.with_options(timeout=30)
        await copy.close()  # a copy shares the cache: closing it leaves the cache open
        await ask(c, messages())
    await http.aclose()
    store = DiskStore(tmp_path, max_bytes=2**20)
    stats = await store.stats()
    await store.aclose()
    assert stats.misses == 2  # flushed when the client closed


class DeadStore:
    """A store whose every call fails, counting the calls."""

    kind = "redis"

    def __init__(self) -> None:
        self.calls = 0

    async def _fail(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        await anyio.sleep(0.01)
        raise CacheUnavailable("redis at redis://127.0.0.1:1/0 is unavailable: refused")

    get = set = delete = hit = add_stats = stats = clear = _fail

    async def aclose(self) -> None:
        pass


async def test_while_the_store_is_down_one_request_probes_it_and_the_rest_go_straight_on() -> None:
    clock = FakeClock()
    store = DeadStore()
    cache = ResponseCache(
        store,  # type: ignore[arg-type]
        ttl=60,
        min_hits=2,
        window=60,
        max_entry_bytes=2**20,
        clock=clock,
    )
    request = CacheRequest(
        key="ns/k", stream=False, include_usage=False, read=True, write=True, share=True
    )
    assert await cache.lookup(request) is None
    assert store.calls == 1  # the failure that marked it down

    await together(20, lambda: cache.lookup(request))
    assert store.calls == 1  # down: nobody waits on it
    clock.advance(5.1)
    await together(20, lambda: cache.lookup(request))
    assert store.calls == 2  # one probe after the pause, the others went on without it
    clock.advance(1)
    await together(20, lambda: cache.lookup(request))
    assert store.calls == 2


async def test_the_cache_and_the_shared_stats_share_a_redis_prefix(
    sim: Simulator, redis_url: str
) -> None:
    config = cache_config(sim, backend="redis")
    config["routing"] = {"explore": 0, "stats_backend": "redis", "stats_sync": "10ms"}
    config["redis"] = {"url": redis_url, "prefix": f"test-{uuid.uuid4().hex[:8]}"}
    msgs = messages()
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as c:
        for _ in range(3):
            await ask(c, msgs)
            await stored(c)
            await anyio.sleep(0.02)
        assert (await ask(c, msgs)).route.cache_hit
        assert c._cache is not None and c._stats_sync is not None
        stats = await c._cache.stats()
        assert stats.entries == 1 and stats.hits == 2 and stats.misses == 2
        assert c._stats_sync.available
        await c._cache.clear()


async def test_stats_wait_for_a_flush_under_way() -> None:
    """A background flush that took the lookup counters but has not added them to the store
    yet (a slow Redis) is waited for: stats() counts every lookup made before it."""
    from llmroute.cache._stores import MemoryStore

    class SlowStatsStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__(2**20)
            self.adding = anyio.Event()
            self.release = anyio.Event()

        async def add_stats(self, *, hits: int, misses: int) -> None:
            self.adding.set()
            await self.release.wait()
            await super().add_stats(hits=hits, misses=misses)

    store = SlowStatsStore()
    cache = ResponseCache(store, ttl=60, min_hits=1, window=60, max_entry_bytes=2**20)
    request = CacheRequest(
        key="ns/k", stream=False, include_usage=False, read=True, write=True, share=True
    )
    assert await cache.lookup(request) is None  # one miss, counted here
    seen: list[Any] = []

    async def read_stats() -> None:
        seen.append(await cache.stats())

    with anyio.fail_after(30):  # a hang guard only
        async with anyio.create_task_group() as tg:
            tg.start_soon(cache.flush_stats)  # as _maybe_flush spawns it
            await store.adding.wait()  # it holds the miss, the store has not counted it
            tg.start_soon(read_stats)
            for _ in range(20):  # turns of the loop: enough for stats() to finish if it could
                await anyio.lowlevel.checkpoint()
            assert seen == []  # waiting for the flush under way
            store.release.set()
    assert [(s.hits, s.misses) for s in seen] == [(0, 1)]


async def test_closing_the_cache_waits_for_an_answer_being_stored() -> None:
    """A process that got its answer and closes at once still counts its ask and stores the
    answer (its popularity count is shared with the next process)."""
    from openai.types.chat import ChatCompletion

    from llmroute.cache._stores import MemoryStore

    class SlowCountingStore(MemoryStore):
        async def hit(self, key: str, *, window: float) -> int:
            for _ in range(20):  # a store slow to count: 20 trips to the event loop and back
                await anyio.sleep(0.01)
            return await super().hit(key, window=window)

    store = SlowCountingStore(2**20)
    cache = ResponseCache(store, ttl=60, min_hits=1, window=60, max_entry_bytes=2**20)
    request = CacheRequest(
        key="ns/k", stream=False, include_usage=False, read=True, write=True, share=True
    )
    answer = ChatCompletion.model_validate(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
    )

    async def call() -> ChatCompletion:
        return answer

    seat, leader = cache.join(request, call)
    assert leader and (await seat.opened()) is answer
    seat.leave()
    await cache.aclose()  # at once: the store is still counting
    assert await store.get("ns/k") is not None


@pytest.mark.parametrize(("kind", "kept"), [("openai", False), ("vllm", True)])
async def test_a_continued_answer_is_stored_only_when_vendors_counted_every_break(
    sim: Simulator, kind: str, kept: bool
) -> None:
    # A break counted one token a delta (no usage on the cut stream) is continued on a low
    # count: the answer may run past max_tokens, and is not kept to be replayed as whole.
    # Counted by the vendor's usage on every chunk (vLLM), it is exact, and kept.
    whole: dict[str, Any] = {"kind": kind, "base_url": sim.base_url, "api_key": KEY}
    if kind != "vllm":  # the catalog's vllm entry has its own continuation fields
        whole["continuation"] = {}
    cfg = {
        "providers": {"cut": {**whole, "headers": {"x-sim-fault": "drop:5"}}, "whole": whole},
        "models": {"chat": {"targets": ["cut:sim-small", "whole:sim-small"], "policy": "failover"}},
        "routing": {"explore": 0, "breaker_failures": 1_000_000},
        "cache": {"backend": "memory", "min_hits": 1},
    }
    msgs = messages()
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        routes = []
        for _ in range(2):
            stream = await client.chat.completions.create(
                model="chat", messages=msgs, stream=True, temperature=0, max_tokens=12
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert len(text.split()) == 12
            routes.append(stream.route)
            await stored(client)
    assert routes[0].continued_on == ["whole:sim-small"] and not routes[0].cache_hit
    assert routes[1].cache_hit is kept
