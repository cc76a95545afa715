"""The transport against the TLS + HTTP/2 simulator: multiplexing, resets, per-stream deadlines."""

from __future__ import annotations

import select
import socket

import anyio
import anyio.abc
import httpx
import pytest

import llmroute
from llmroute.testing import Simulator

from ..conftest import KEY
from ..settle import settled

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Say something."}]


def client_for(sim: Simulator, **kwargs: object) -> llmroute.AsyncOpenAI:
    return llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), **kwargs
    )


async def wait_for_stat(sim: Simulator, name: str, value: int, timeout: float = 30.0) -> None:
    with anyio.move_on_after(timeout):
        while sim.stats()[name] < value:  # noqa: ASYNC110 - the counter lives in another thread
            await anyio.sleep(0.01)
    assert sim.stats()[name] >= value, f"{name} stayed at {sim.stats()[name]}, expected {value}"


async def test_tls_target_speaks_http2(sim: Simulator) -> None:
    async with client_for(sim) as client:
        stream = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        async with stream:
            chunks = [chunk async for chunk in stream]
        assert stream.response.http_version == "HTTP/2"
        assert stream.timings.http_version == "HTTP/2"
        assert chunks[-1].choices[0].finish_reason == "stop"


async def test_fifty_concurrent_streams_share_one_connection(sim: Simulator) -> None:
    async with client_for(sim) as client:
        texts: list[str] = []

        async def one(i: int) -> None:
            stream = await client.chat.completions.create(
                model="sim-small",
                messages=[{"role": "user", "content": f"question {i}"}],
                stream=True,
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            texts.append("".join(parts))

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
        assert len(texts) == 50 and all(texts)
        assert client._transport is not None
        connections = client._transport.connections()
        assert len(connections) == 1
        assert connections[0].requests_served == 50


async def _first_chunk_then(sim: Simulator, how: str) -> None:
    async with client_for(sim) as client:
        await settled(sim)  # an earlier test's reset lands first
        before = sim.stats()
        stream = await client.chat.completions.create(
            model="sim-large", messages=MESSAGES, stream=True
        )
        if how == "break":
            async for _chunk in stream:
                break
            await stream.close()
        elif how == "close":
            await stream.__anext__()
            await stream.close()
        elif how == "cancel":
            with anyio.move_on_after(0.2):
                async for _chunk in stream:
                    pass
            await stream.close()
        await wait_for_stat(sim, "streams_cancelled", before["streams_cancelled"] + 1)
        # The connection survived the reset: the next request reuses it.
        completion = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        assert completion.timings.connection_reused is True
        assert client._transport is not None
        assert len(client._transport.connections()) == 1


@pytest.mark.parametrize("how", ["break", "close", "cancel"])
async def test_leaving_a_stream_early_resets_only_that_stream(
    sim_slow: Simulator, how: str
) -> None:
    await _first_chunk_then(sim_slow, how)


async def test_stalled_stream_times_out_beside_busy_streams(sim_slow: Simulator) -> None:
    async with client_for(sim_slow) as client:
        busy_done = 0

        async def busy() -> None:
            nonlocal busy_done
            stream = await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=True
            )
            async for _ in stream:
                pass
            busy_done += 1

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(busy)
            stream = await client.chat.completions.create(
                model="sim-small",
                messages=MESSAGES,
                stream=True,
                timeout=httpx.Timeout(30.0, read=1.0),
                extra_headers={"x-sim-fault": "stall-between:2:60"},
            )
            with pytest.raises(llmroute.StreamInterrupted) as info:
                async for _ in stream:
                    pass
            assert isinstance(info.value.cause, httpx.ReadTimeout)
            assert info.value.partial_text
        assert busy_done == 3
        assert client._transport is not None
        assert len(client._transport.connections()) == 1


async def test_plain_http_target_uses_http11_keepalive(sim_h1: Simulator) -> None:
    async with llmroute.AsyncOpenAI(api_key=KEY, base_url=sim_h1.base_url) as client:
        first = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        second = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        assert first.timings.http_version == "HTTP/1.1"
        assert first.timings.connection_reused is False
        assert second.timings.connection_reused is True
        await settled(sim_h1)  # an earlier test's reset lands first
        before = sim_h1.stats()["streams_cancelled"]
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "stall-between:2:60"},
        )
        await stream.__anext__()
        await stream.close()
        await wait_for_stat(sim_h1, "streams_cancelled", before + 1)


async def test_warmup_opens_the_connection_ahead(sim: Simulator) -> None:
    async with client_for(sim) as client:
        await client.warmup()
        completion = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        assert completion.timings.connection_reused is True
        assert completion.timings.connect == 0.0


async def test_warmup_of_an_unreachable_base_url_raises_the_connection_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"https://127.0.0.1:{port}/v1"
    async with llmroute.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0) as client:
        with pytest.raises(llmroute.APIConnectionError, match="cannot connect"):
            await client.warmup()  # itself, not an exception group


async def test_large_request_body_respects_flow_control(sim: Simulator) -> None:
    big = "word " * 300_000  # 1.5 MB, far beyond the initial HTTP/2 window
    async with client_for(sim) as client:
        completion = await client.chat.completions.create(
            model="sim-small", messages=[{"role": "user", "content": big}]
        )
        assert completion.choices[0].message.content
        assert sim.last_requests[-1]["json"]["messages"][0]["content"] == big


async def test_connection_closed_by_idle_server_is_replaced() -> None:
    """Vendors close idle connections; the next request must not fail because of it."""
    with Simulator(tls=True, keep_alive_timeout=0.3) as server:
        async with client_for(server, max_retries=0) as client:
            first = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
            assert client._transport is not None
            (conn,) = client._transport.connections()
            fd = conn._sock.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
            # Wait for the server's goodbye to reach the socket, rather than for a fixed time
            # (polled: asyncio lends no wait on a descriptor its transport owns).
            with anyio.fail_after(10):
                while not select.select([fd], [], [], 0)[0]:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            second = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
            assert first.choices[0].message.content == second.choices[0].message.content
            assert second.timings.connection_reused is False
            assert len(client._transport.connections()) == 1


async def test_ssl_context_shared_with_an_http1_client_still_gets_http2(sim: Simulator) -> None:
    import openai

    ctx = sim.ssl_context()
    other = openai.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, http_client=openai.DefaultAsyncHttpxClient(verify=ctx)
    )
    try:
        await other.chat.completions.create(model="sim-small", messages=MESSAGES)
        async with llmroute.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=ctx) as ours:
            completion = await ours.chat.completions.create(model="sim-small", messages=MESSAGES)
            assert completion.timings.http_version == "HTTP/2"
    finally:
        await other.close()


async def test_untrusted_certificate_is_a_connection_error(sim: Simulator) -> None:
    import openai

    async with llmroute.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, max_retries=0) as client:
        with pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert "certificate" in str(info.value.__cause__).lower()


def test_the_event_deadline_counts_waiting_not_reading() -> None:
    from llmroute.transport._events import EventDeadline

    # A slow loris, with CRLF line ends cut between chunks: one line end is not an event's end.
    loris = EventDeadline(1.0)
    with pytest.raises(httpx.ReadTimeout, match="no server-sent event ended"):
        for _ in range(100):
            for byte in b"data: a\r\n":
                loris.check(bytes([byte]), 0.1)
    # A blank line cut anywhere ends the event: CRLF CRLF, LF CR, CR CR.
    for first, second in ((b"x\r\n\r", b"\n"), (b"x\r\n", b"\r\n"), (b"x\r", b"\r")):
        events = EventDeadline(1.0)
        events.check(b"data: " + b"y" * 10, 0.9)
        events.check(first, 0.0)
        events.check(second, 0.05)
        events.check(b"data: z", 0.9)  # waited 0.9 s since the last event ended: in time
    # Time the application spends between reads never counts: only waiting for data does.
    slow_reader = EventDeadline(1.0)
    for _ in range(1000):
        slow_reader.check(b"data: part of one huge event", 0.0)


async def test_an_origin_can_have_its_own_tls_trust(sim: Simulator, sim_h1: Simulator) -> None:
    """``verify_by_origin`` (a provider's ``verify`` in the config) trusts the simulator's CA for
    its origin only; every other origin keeps the transport's own ``verify``."""
    from llmroute.transport import Transport

    url = httpx.URL(sim.base_url)
    origin = (url.host, url.port or 443)
    models = sim.base_url + "/models"
    headers = {"authorization": f"Bearer {KEY}"}
    own = Transport(verify_by_origin={origin: sim.ca_pem_path})
    async with httpx.AsyncClient(transport=own) as client:
        response = await client.get(models, headers=headers)
        assert response.status_code == 200 and response.http_version == "HTTP/2"
        assert own.ssl_context_for(*origin) is not own.ssl_context
        plain = await client.get(sim_h1.base_url + "/models", headers=headers)
        assert plain.status_code == 200
    other = Transport(verify_by_origin={("127.0.0.2", origin[1]): sim.ca_pem_path})
    async with httpx.AsyncClient(transport=other) as client:
        with pytest.raises(httpx.ConnectError, match=r"(?i)certificate"):
            await client.get(models, headers=headers)
    insecure = Transport(verify_by_origin={origin: False})
    async with httpx.AsyncClient(transport=insecure) as client:
        assert (await client.get(models, headers=headers)).status_code == 200
    later = Transport()  # a provider added at run time brings its own trust
    later.set_origin_verify(origin[0], origin[1], sim.ca_pem_path)
    async with httpx.AsyncClient(transport=later) as client:
        assert (await client.get(models, headers=headers)).status_code == 200
