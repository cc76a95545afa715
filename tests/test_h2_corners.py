"""HTTP/2 corners that real servers produce, driven by a scripted h2 server."""

from __future__ import annotations

import asyncio
import json

import anyio
import httpx
import openai
import pytest
from h2.errors import ErrorCodes

import llmroute
from llmroute.testing import Simulator

from .conftest import KEY
from .h2script import ScriptedServer, ScriptedStream, client_context, sse_chunk

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]
WORDS = [f"w{i} " for i in range(10)]


def client_for(server: ScriptedServer, **kwargs: object) -> llmroute.AsyncOpenAI:
    kwargs.setdefault("max_retries", 0)
    return llmroute.AsyncOpenAI(
        api_key=KEY, base_url=server.base_url, verify=client_context(), **kwargs
    )


async def stream_words(stream: ScriptedStream, *, goaway_at: int | None = None) -> None:
    stream.respond()
    for i, word in enumerate(WORDS):
        if i == goaway_at:
            stream.goaway(last_stream_id=stream.stream_id)
        stream.send(sse_chunk(word, finish="stop" if i == len(WORDS) - 1 else None))
        await asyncio.sleep(0.01)
    stream.send(b"data: [DONE]\n\n", end=True)


async def read_text(client: llmroute.AsyncOpenAI) -> str:
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with anyio.fail_after(10):
        return "".join([c.choices[0].delta.content or "" async for c in stream])


async def test_graceful_goaway_lets_the_stream_in_flight_finish() -> None:
    async def handler(stream: ScriptedStream) -> None:
        await stream_words(stream, goaway_at=3)

    with ScriptedServer(handler) as server:
        async with client_for(server) as client:
            assert await read_text(client) == "".join(WORDS)
            # The connection said goodbye: the next request opens a new one and succeeds.
            assert await read_text(client) == "".join(WORDS)
        assert server.connections == 2


async def test_answer_before_the_whole_upload_is_read() -> None:
    """A 401 with END_STREAM, then RST_STREAM(NO_ERROR), while a big body is still going out."""

    async def handler(stream: ScriptedStream) -> None:
        await asyncio.sleep(0.05)
        body = json.dumps({"error": {"message": "bad key", "type": "invalid_request_error"}})
        stream.respond(401, b"application/json")
        stream.send(body.encode(), end=True)
        stream.conn.reset_stream(stream.stream_id, ErrorCodes.NO_ERROR)
        stream.flush()

    big = "word " * 300_000  # far beyond the server's 64 KiB stream window
    with ScriptedServer(handler, early=True) as server:
        async with client_for(server, timeout=httpx.Timeout(30.0)) as client:
            # The answer, not the 30 s write timeout (that would be an APITimeoutError).
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": big}]
                )


async def test_pool_limit_holds_under_a_burst() -> None:
    async def handler(stream: ScriptedStream) -> None:
        await asyncio.sleep(0.05)
        await stream_words(stream)

    with ScriptedServer(handler, max_concurrent_streams=5) as server:
        transport = llmroute.transport.Transport(verify=client_context(), max_connections=2)
        http_client = httpx.AsyncClient(transport=transport)
        async with llmroute.AsyncOpenAI(
            api_key=KEY, base_url=server.base_url, http_client=http_client, max_retries=0
        ) as client:
            texts: list[str] = []

            async def one() -> None:
                texts.append(await read_text(client))

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(one)
        await http_client.aclose()
        assert texts == ["".join(WORDS)] * 30
        assert server.connections == 2


async def test_bad_header_value_fails_alone(sim: Simulator) -> None:
    """CR/LF in a header would make the server end the connection, with every stream on it."""
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), max_retries=0
    ) as client:
        other = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, extra_headers={"X-Tag": "a\r\nb"}
            )
        assert "x-tag" in str(info.value.__cause__).lower()
        async with other:
            chunks = [c async for c in other]
        assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_cancelled_read_never_looks_like_the_end(sim: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()
    ) as client:
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "stall-between:3:60"},
        )
        await stream.__anext__()
        with anyio.move_on_after(0.5):
            while True:
                await stream.__anext__()
        with pytest.raises(llmroute.StreamInterrupted) as info:
            async for _ in stream:
                pass
        assert info.value.partial_text
