"""The hot path with vendor framing: one SSE event per HTTP/2 DATA frame and TLS record, long
events, buffered TLS reads without a deadline each, batched window updates, compiled chunk
construction and the cache-hit path. Correctness and counts only, never time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

import llmroute
from llmroute.protocols.openai import build_chunk
from llmroute.testing import Profile, Simulator
from llmroute.transport import Transport, _h2, _h2_stream

from ..conftest import KEY
from ..settle import stored

pytestmark = pytest.mark.anyio

MESSAGES: Any = [{"role": "user", "content": "Tell me a story."}]
TOKENS = 300


@pytest.fixture(scope="module")
def framed() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=TOKENS, frame_per_event=True)) as sim:
        yield sim


@pytest.fixture(scope="module")
def long_events() -> Iterator[Simulator]:
    profile = Profile(reply_tokens=20, token_bytes=4096, frame_per_event=True)
    with Simulator(profile=profile) as sim:
        yield sim


def _body() -> dict[str, Any]:
    return {"model": "sim-small", "messages": MESSAGES, "stream": True}


async def test_frame_per_event_sends_each_event_in_its_own_data_frame(framed: Simulator) -> None:
    url = httpx.URL(framed.base_url)
    transport = Transport(verify_by_origin={(url.host, url.port or 443): framed.ca_pem_path})
    headers = {"authorization": f"Bearer {KEY}"}
    frames: list[bytes] = []
    async with httpx.AsyncClient(transport=transport) as client:
        async with client.stream(
            "POST", framed.base_url + "/chat/completions", json=_body(), headers=headers
        ) as response:
            assert response.http_version == "HTTP/2"
            async for data in response.aiter_raw():  # one item per DATA frame
                frames.append(data)
    events = b"".join(frames).count(b"\n\n")
    assert events == TOKENS + 3  # the role chunk, a chunk per token, the finish chunk, [DONE]
    assert len(frames) == events
    assert all(f.startswith(b"data: ") and f.count(b"\n\n") == 1 for f in frames)


async def test_one_event_per_record_streams_exactly_without_a_deadline_per_record(
    framed: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records TLS already holds are read without an awaited receive (and its cancel scope);
    the answer is the same, every chunk in order."""
    waits = {"scoped": 0}
    real = _h2_stream._deadline.__enter__

    def counting(self: Any) -> None:
        waits["scoped"] += 1
        real(self)

    monkeypatch.setattr(_h2_stream._deadline, "__enter__", counting)
    reads = {"buffered": 0}
    real_buffered = _h2.HTTP2Connection._read_buffered

    def buffered(self: _h2.HTTP2Connection) -> bool:
        took = real_buffered(self)
        reads["buffered"] += took
        return took

    monkeypatch.setattr(_h2.HTTP2Connection, "_read_buffered", buffered)
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=framed.base_url, verify=framed.ssl_context()
    ) as client:
        texts = []
        for _ in range(2):
            stream: Any = await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=True
            )
            chunks = [chunk async for chunk in stream]
            assert len(chunks) == TOKENS + 2
            assert chunks[-1].choices[0].finish_reason == "stop"
            texts.append("".join(c.choices[0].delta.content or "" for c in chunks))
            assert stream.timings.tokens == TOKENS
    assert texts[0] == texts[1] and len(texts[0].split()) == TOKENS
    # Each of the ~600 records was read once, either way; a scope only for the awaited reads.
    assert waits["scoped"] + reads["buffered"] >= 2 * (TOKENS + 3)
    assert waits["scoped"] <= 2 * (TOKENS + 3) + 20


async def test_long_events_of_four_kilobytes(long_events: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=long_events.base_url, verify=long_events.ssl_context()
    ) as client:
        stream = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        contents = [c.choices[0].delta.content async for c in stream if c.choices]
    tokens = [c for c in contents if c]
    assert len(tokens) == 20
    assert all(len(t) == 4096 for t in tokens)


async def test_window_updates_are_batched_and_the_rest_returned_at_close(
    framed: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    acks: list[int] = []
    real = _h2.h2.connection.H2Connection.acknowledge_received_data

    def counting(self: Any, size: int, stream_id: int) -> None:
        if stream_id != 0:
            acks.append(size)
        real(self, size, stream_id)

    monkeypatch.setattr(_h2.h2.connection.H2Connection, "acknowledge_received_data", counting)
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=framed.base_url, verify=framed.ssl_context()
    ) as client:
        stream = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        async for _ in stream:
            pass
    body = sum(acks)
    # Every flow-controlled byte is returned, in a call per batch rather than one per frame.
    assert body > TOKENS * 100
    assert len([a for a in acks if a]) <= body // _h2_stream._ACK_BATCH + 3


def _chunk_data(content: object, **delta: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"content": content, **delta},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }


@pytest.mark.parametrize(
    "data",
    [
        _chunk_data("hi"),
        _chunk_data(None),
        _chunk_data(5),  # not a str: openai's own construction decides
        _chunk_data("x", role="assistant"),
        _chunk_data("x", tool_calls=[{"index": 0, "function": {"arguments": "{"}}]),
        {**_chunk_data("x"), "choices": "not a list"},
        {**_chunk_data("x"), "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
    ],
)
def test_compiled_construction_equals_openai_for_a_repeated_layout(data: dict[str, Any]) -> None:
    for _ in range(3):  # first, then compiled for the layout, then from the compiled plan
        copy = json.loads(json.dumps(data))
        ours = build_chunk(copy)
        theirs = construct_type(type_=ChatCompletionChunk, value=json.loads(json.dumps(data)))
        assert ours == theirs
        assert ours.model_fields_set == theirs.model_fields_set  # type: ignore[union-attr]


def _cached_config(sim: Simulator, backend: str, path: str | None = None) -> dict[str, Any]:
    cache: dict[str, Any] = {"backend": backend, "min_hits": 1}
    if path is not None:
        cache["path"] = path
    return {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
        "routing": {"explore": 0},
        "cache": cache,
    }


async def _ask(client: llmroute.AsyncOpenAI) -> tuple[str, bool]:
    stream: Any = await client.chat.completions.create(
        model="chat", messages=MESSAGES, temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert stream.route is not None
    return text, stream.route.cache_hit


@pytest.mark.parametrize("backend", ["memory", "disk"])
async def test_a_cache_hit_runs_nothing_of_routing_and_decodes_its_entry_once(
    sim: Simulator, backend: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmroute.cache import _cache
    from llmroute.routing.engine import Router

    path = str(tmp_path / "cache") if backend == "disk" else None
    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_cached_config(sim, backend, path)
    ) as client:
        live, hit = await _ask(client)
        assert not hit
        cache = client._cache
        assert cache is not None
        await stored(client)
        decoded = {"n": 0}
        real = _cache.CacheEntry.decode

        def counting(raw: bytes, key: str) -> Any:
            decoded["n"] += 1
            return real(raw, key)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the routing path ran for a cache hit")

        monkeypatch.setattr(_cache.CacheEntry, "decode", staticmethod(counting))
        for name in ("stream", "complete", "order", "_begin", "health", "load"):
            monkeypatch.setattr(Router, name, refuse)
        dispatch = client._llmroute
        monkeypatch.setattr(dispatch, "_background", refuse)
        for _ in range(5):
            text, hit = await _ask(client)
            assert hit and text == live
        assert decoded["n"] == 1
        # Bytes that changed under the same key (another process stored a new answer) are
        # decoded again, not served from the decoded copy.
        key = next(iter(cache._decoded))
        raw, entry = cache._decoded[key]
        cache._decoded[key] = (raw + b" ", entry)
        text, hit = await _ask(client)
        assert hit and text == live
        assert decoded["n"] == 2


async def test_a_cache_hit_is_answered_before_openais_create_builds_the_request(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat call whose arguments are plain JSON is answered from the cache before openai's
    ``create()`` transforms them (most of a hit's time); the answer was stored by the usual
    path, so both paths agree on its key. Any other call goes through openai's ``create()``
    and the seam, and still hits."""
    from openai.resources.chat.completions import completions

    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_cached_config(sim, "memory")
    ) as client:
        live, hit = await _ask(client)
        assert not hit
        await stored(client)
        cache = client._cache
        assert cache is not None
        through_openai = {"n": 0}
        real_transform = completions.async_maybe_transform

        async def counting(*args: Any, **kwargs: Any) -> Any:
            through_openai["n"] += 1
            return await real_transform(*args, **kwargs)

        whole_prompt = [{"role": "user", "content": "Answer in one piece."}]
        first: Any = await client.chat.completions.create(
            model="chat", messages=whole_prompt, temperature=0
        )
        await stored(client)
        monkeypatch.setattr(completions, "async_maybe_transform", counting)
        upstream = sim.stats()["chat_requests"]
        text, hit = await _ask(client)
        whole: Any = await client.chat.completions.create(
            model="chat", messages=whole_prompt, temperature=0, stream=False, n=openai.omit
        )
        assert hit and text == live and whole.route.cache_hit
        assert whole.choices[0].message.content == first.choices[0].message.content
        assert through_openai["n"] == 0
        # Arguments openai's machinery must see first: each goes through create(), and hits.
        stream: Any = await client.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            temperature=0,
            stream=True,
            extra_headers={"x-trace": "1"},
        )
        assert [c async for c in stream] and stream.route.cache_hit
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=whole_prompt, temperature=0
        )
        assert raw.parse().route.cache_hit
        tupled: Any = await client.chat.completions.create(
            model="chat", messages=tuple(whole_prompt), temperature=0
        )
        assert tupled.route.cache_hit
        assert through_openai["n"] == 3
        assert sim.stats()["chat_requests"] == upstream
        # A miss is looked up once, not again at the seam, and goes to the target.
        misses = cache._misses
        fresh: Any = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "A new prompt."}], temperature=0
        )
        assert not fresh.route.cache_hit and through_openai["n"] == 4
        assert cache._misses == misses + 1
        assert sim.stats()["chat_requests"] == upstream + 1


async def test_a_wrapper_on_openais_create_sees_cache_hits_too(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tracers and error reporters (OpenTelemetry's, Langfuse's, Sentry's openai integrations)
    wrap openai's ``AsyncCompletions.create``; with openai's client they see every call. The
    early cache check must not answer around them: while openai's ``create`` is wrapped, every
    call goes through it, and a hit is still a hit."""
    from openai.resources.chat import AsyncCompletions

    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_cached_config(sim, "memory")
    ) as client:
        live, _ = await _ask(client)
        await stored(client)
        seen: list[dict[str, Any]] = []
        real_create = AsyncCompletions.create

        async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(kwargs)
            return await real_create(self, *args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(AsyncCompletions, "create", traced)
            for _ in range(2):
                text, hit = await _ask(client)
                assert hit and text == live
            assert len(seen) == 2 and seen[0]["model"] == "chat"


async def test_the_early_check_answers_as_the_seam_does(sim: Simulator) -> None:
    """A hit answered before openai's create() and one answered at the seam (``extra_headers``
    send a call there) are the same to the caller: the answer, openai's ``_request_id``
    (``None``: no vendor answered; it raised AttributeError on a hit), the response, and a
    refused call is counted in the metrics either way (the early check did not count it)."""
    seam: Any = {"extra_headers": {"x-trace": "1"}}
    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_cached_config(sim, "memory")
    ) as client:
        live: Any = await client.chat.completions.create(
            model="chat", messages=MESSAGES, temperature=0
        )
        assert live._request_id
        await stored(client)
        early: Any = await client.chat.completions.create(
            model="chat", messages=MESSAGES, temperature=0
        )
        late: Any = await client.chat.completions.create(
            model="chat", messages=MESSAGES, temperature=0, **seam
        )
        for hit in (early, late):
            assert hit.route.cache_hit and hit._request_id is None
            assert hit.model_dump() == live.model_dump()
        streams: list[Any] = [
            await client.chat.completions.create(
                model="chat", messages=MESSAGES, temperature=0, stream=True, **extra
            )
            for extra in ({}, seam)
        ]
        chunks = [[c.model_dump() async for c in s] for s in streams]
        assert chunks[0] == chunks[1] and chunks[0]
        assert dict(streams[0].response.headers) == dict(streams[1].response.headers)
        bad = client.with_options(default_headers={"x-llmroute-cache-namespace": "a/b"})
        for extra in ({}, seam):
            with pytest.raises(llmroute.ConfigError, match="x-llmroute-cache-namespace"):
                await bad.chat.completions.create(
                    model="chat", messages=MESSAGES, temperature=0, **extra
                )
        errors = [
            line
            for line in client.metrics.exposition().decode().splitlines()
            if line.startswith("llmroute_requests_total{") and 'outcome="error"' in line
        ]
        assert errors == ['llmroute_requests_total{outcome="error",route="chat",source="live"} 2.0']


def test_only_a_body_known_without_openais_machinery_is_looked_up_early() -> None:
    from llmroute._client import plain_body

    base = {"model": "chat", "messages": MESSAGES}
    assert plain_body(base) == base
    assert plain_body({**base, "n": openai.omit, "top_p": openai.NOT_GIVEN}) == base
    assert plain_body({**base, "extra_headers": None, "extra_body": None}) == base
    assert plain_body({**base, "temperature": 0.5, "stop": ["x"]}) == {
        **base,
        "temperature": 0.5,
        "stop": ["x"],
    }
    for other in (
        {"messages": tuple(MESSAGES)},  # openai's transform makes lists of iterables
        {"extra_headers": {"x": "1"}},
        {"extra_body": {"x": 1}},
        {"timeout": 5.0},
        {"temprature": 0},  # a typo: openai's create() raises its TypeError
        {"response_format": ChatCompletionChunk},  # a class: openai's create() checks it
        {"metadata": {1: "x"}},
    ):
        assert plain_body({**base, **other}) is None, other
    assert plain_body({"model": "chat"}) is None  # openai's create() names what is missing
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    assert plain_body({**base, "stop": deep}) is None


async def test_a_typo_in_an_argument_is_still_openais_type_error(sim: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_cached_config(sim, "memory")
    ) as client:
        with pytest.raises(TypeError, match="temprature"):
            await client.chat.completions.create(  # type: ignore[call-overload]
                model="chat", messages=MESSAGES, temprature=0
            )
        assert isinstance(client.chat, openai.resources.chat.AsyncChat)
        assert isinstance(client.chat.completions, openai.resources.chat.AsyncCompletions)


async def test_each_cache_hit_gets_a_response_of_its_own(sim: Simulator) -> None:
    """The response a hit carries is built from a template: the same status, headers, request
    and empty body every time, and headers, extensions and history of its own."""
    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_cached_config(sim, "memory")
    ) as client:
        await _ask(client)
        cache = client._cache
        assert cache is not None
        await stored(client)
        responses: list[httpx.Response] = []
        for _ in range(2):
            stream: Any = await client.chat.completions.create(
                model="chat", messages=MESSAGES, temperature=0, stream=True
            )
            async with stream:
                assert stream.route.cache_hit
            responses.append(stream.response)
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES, temperature=0
        )
    first, second = responses
    assert first is not second and first.headers is not second.headers
    first.headers["x-mine"] = "1"
    first.extensions["mine"] = 1
    assert "x-mine" not in second.headers and "mine" not in second.extensions
    for response in (second, raw.http_response):
        assert response.status_code == 200 and response.content == b""
        assert response.headers["x-llmroute-cache"] == "hit"
        assert response.request.url == httpx.URL("llmroute://route/chat")
        assert response.history == [] and response.is_closed
    assert second.headers["content-type"] == "text/event-stream"
    assert raw.headers["content-type"] == "application/json"
    assert raw.parse().choices[0].message.content


async def test_a_routed_call_with_one_attempt_runs_it_in_the_callers_task(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan of one attempt without a hedge starts no task group and no task, and its request
    goes to llmroute's transport without httpx's client machinery; what the caller gets is
    the same: the answer, the route report, the raw response's headers and elapsed time."""
    from llmroute.routing import coordinator

    counts = {"task groups": 0, "client sends": 0}
    real_group = coordinator.anyio.create_task_group
    real_send = httpx.AsyncClient.send

    def group() -> Any:
        counts["task groups"] += 1
        return real_group()

    async def send(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> Any:
        counts["client sends"] += 1
        return await real_send(self, *args, **kwargs)

    config = _cached_config(sim, "off")
    async with llmroute.AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as client:
        monkeypatch.setattr(coordinator.anyio, "create_task_group", group)
        monkeypatch.setattr(httpx.AsyncClient, "send", send)
        for _ in range(3):
            completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert completion.choices[0].finish_reason == "stop"
            assert completion.route.winner == "sim:sim-small"  # type: ignore[attr-defined]
            assert [a.reason for a in completion.route.attempts] == ["first"]  # type: ignore[attr-defined]
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES
        )
        assert raw.headers["content-type"].startswith("application/json")
        assert raw.http_request.url == httpx.URL(sim.base_url + "/chat/completions")
        assert raw.elapsed.total_seconds() > 0
        assert raw.parse().choices[0].message.content
        stream: Any = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text and stream.route is not None and stream.route.winner == "sim:sim-small"
    assert counts == {"task groups": 0, "client sends": 0}


_COMPLETIONS = [
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "total_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        "system_fingerprint": "fp",
        "vendor_field": {"x": [1, 2]},
    },
    {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": []}]},
                "finish_reason": "tool_calls",
            }
        ],
    },
    {"id": "x", "choices": "not a list", "created": "yesterday"},
]


@pytest.mark.parametrize("body", _COMPLETIONS)
def test_whole_completions_are_built_as_openai_builds_them(body: dict[str, Any]) -> None:
    from openai.types.chat import ChatCompletion

    from llmroute.protocols.openai import parse_chat_completion

    request = httpx.Request("POST", "https://example.test/v1/chat/completions")
    for _ in range(3):  # the first time, then the compiled layout
        raw = json.dumps(body).encode()
        ours = parse_chat_completion(raw, request=request, target="t")
        theirs = construct_type(type_=ChatCompletion, value=json.loads(raw))
        assert type(ours) is type(theirs)
        assert ours == theirs
        assert ours.model_fields_set == theirs.model_fields_set  # type: ignore[union-attr]


class _ScanCounter(bytearray):
    """An SSE decoder buffer that counts the bytes its searches look at."""

    scanned = 0

    def rfind(self, sub: Any, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        _ScanCounter.scanned += len(self) - (start or 0)
        return super().rfind(sub, start, end)


def _event(content: str) -> bytes:
    chunk = _chunk_data(content)
    chunk["choices"][0]["finish_reason"] = "stop"
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


@pytest.mark.parametrize("size", [32 * 1024, 64 * 1024])
def test_an_event_split_at_every_byte_is_decoded_with_work_linear_in_its_size(size: int) -> None:
    from llmroute.protocols.openai import ChatStreamDecoder

    request = httpx.Request("POST", "https://example.test/v1/chat/completions")
    decoder = ChatStreamDecoder(request=request, target="t")
    decoder._sse._buf = _ScanCounter()  # type: ignore[attr-defined]
    _ScanCounter.scanned = 0
    stream = _event("x" * size)
    chunks: list[Any] = []
    for i in range(len(stream)):
        chunks += decoder.feed(stream[i : i + 1])
    assert len(chunks) == 1 and chunks[0].choices[0].delta.content == "x" * size
    assert decoder._sse.buffered == 0  # type: ignore[attr-defined]
    assert 0 < _ScanCounter.scanned <= 2 * len(stream)  # each byte looked at about once, not n^2


def test_a_one_megabyte_event_and_bad_events_give_output_or_typed_errors() -> None:
    from llmroute._errors import MalformedStreamError
    from llmroute.protocols.openai import ChatStreamDecoder

    request = httpx.Request("POST", "https://example.test/v1/chat/completions")
    big = _event("y" * (1024 * 1024))
    decoder = ChatStreamDecoder(request=request, target="t")
    chunks: list[Any] = []
    for i in range(0, len(big), 1000):
        chunks += decoder.feed(big[i : i + 1000])
        assert decoder._sse.buffered <= len(big)  # type: ignore[attr-defined]
    assert len(chunks) == 1 and len(chunks[0].choices[0].delta.content) == 1024 * 1024
    small = ChatStreamDecoder(request=request, target="t", max_event_bytes=64 * 1024)
    with pytest.raises(MalformedStreamError, match="max_event_bytes"):
        for i in range(0, len(big), 1000):
            small.feed(big[i : i + 1000])
    assert small._sse.buffered <= 64 * 1024 + 1000  # type: ignore[attr-defined]
    for bad, what in [(b"data: {\xff}\n\n", "UTF-8"), (b"data: {nope\n\n", "not valid JSON")]:
        decoder = ChatStreamDecoder(request=request, target="t")
        with pytest.raises(MalformedStreamError, match=what) as caught:
            decoder.feed(_event("ok") + bad)  # the good chunk first, the error at the next feed
            decoder.feed(b"")
        assert caught.value.target == "t"  # type: ignore[attr-defined]
