"""The drop-in client's surface: constructor, options, errors, retries, timings, secrets."""

from __future__ import annotations

import gc
import inspect
import logging
import socket
import threading
import typing
import uuid
from typing import Any

import anyio
import httpx
import openai
import pytest

import llmroute
from llmroute.testing import Simulator

from ..conftest import KEY
from ..settle import settled

MESSAGES = [{"role": "user", "content": "Hello there"}]


def client_for(sim: Simulator, **kwargs: object) -> llmroute.AsyncOpenAI:
    kwargs.setdefault("api_key", KEY)
    return llmroute.AsyncOpenAI(base_url=sim.base_url, verify=sim.ssl_context(), **kwargs)


def test_missing_api_key_raises_openais_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(openai.OpenAIError, match="OPENAI_API_KEY"):
        llmroute.AsyncOpenAI()


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://example.invalid/v2")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-1")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    client = llmroute.AsyncOpenAI()
    assert client.api_key == KEY
    assert str(client.base_url) == "https://example.invalid/v2/"
    assert client.default_headers["OpenAI-Organization"] == "org-1"
    assert client.default_headers["OpenAI-Project"] == "proj-1"


@pytest.mark.parametrize("url", ["ftp://example.com/v1", "example.com/v1", "ws://host/v1"])
def test_base_url_must_be_http(url: str) -> None:
    with pytest.raises(ValueError, match="base_url") as info:
        llmroute.AsyncOpenAI(api_key=KEY, base_url=url)
    assert url in str(info.value)


def test_unknown_constructor_argument_is_named() -> None:
    with pytest.raises(TypeError, match="bogus"):
        llmroute.AsyncOpenAI(api_key=KEY, bogus=1)


def test_repr_never_shows_the_key() -> None:
    client = llmroute.AsyncOpenAI(api_key=KEY)
    assert KEY not in repr(client)
    assert KEY not in str(client)


@pytest.mark.anyio
async def test_every_parameter_and_extra_passes_through(sim: Simulator) -> None:
    async with client_for(
        sim, default_headers={"X-App": "demo"}, default_query={"tenant": "t1"}
    ) as client:
        await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            temperature=0.2,
            top_p=0.9,
            seed=7,
            user="u-1",
            logit_bias={"50256": -100},
            metadata={"k": "v"},
            extra_headers={"X-Extra": "1"},
            extra_query={"q": "2"},
            extra_body={"vendor_flag": True},
        )
    seen = sim.last_requests[-1]
    body = seen["json"]
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9 and body["seed"] == 7
    assert body["user"] == "u-1" and body["logit_bias"] == {"50256": -100}
    assert body["metadata"] == {"k": "v"} and body["vendor_flag"] is True
    headers = {k.lower(): v for k, v in seen["headers"].items()}
    assert headers["x-app"] == "demo" and headers["x-extra"] == "1"
    assert headers["authorization"] == f"Bearer {KEY}"
    assert seen["query"]["tenant"] == "t1" and seen["query"]["q"] == "2"


@pytest.mark.anyio
async def test_not_given_and_omit_are_dropped(sim: Simulator) -> None:
    async with client_for(sim) as client:
        await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, temperature=openai.NOT_GIVEN, top_p=openai.omit
        )
    body = sim.last_requests[-1]["json"]
    assert "temperature" not in body and "top_p" not in body


@pytest.mark.anyio
async def test_callable_api_key_is_awaited_per_request(sim: Simulator) -> None:
    calls = 0

    async def key() -> str:
        nonlocal calls
        calls += 1
        return f"{KEY}-{calls}"

    async with client_for(sim, api_key=key) as client:
        await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        await client.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert calls == 2
    headers = {k.lower(): v for k, v in sim.last_requests[-1]["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEY}-2"


@pytest.mark.anyio
async def test_with_options_changes_a_copy_and_shares_connections(sim: Simulator) -> None:
    async with client_for(sim) as client:
        other = client.with_options(max_retries=0, default_headers={"X-Copy": "yes"})
        assert other.max_retries == 0 and client.max_retries == 2
        await other.chat.completions.create(model="sim-small", messages=MESSAGES)
        headers = {k.lower(): v for k, v in sim.last_requests[-1]["headers"].items()}
        assert headers["x-copy"] == "yes"
        await other.close()  # a copy does not close the shared connections
        done = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        assert done.timings.connection_reused is True


@pytest.mark.parametrize("cls", [llmroute.AsyncOpenAI, llmroute.OpenAI])
def test_copy_takes_every_constructor_argument(cls: type[Any]) -> None:
    """openai's own client tests check this of its clients (test_copy_signature): every
    ``__init__`` parameter, llmroute's ``config`` and ``verify`` included, can be given to
    ``copy()`` (and so to ``with_options()``)."""
    client = cls(api_key=KEY)
    try:
        init = inspect.signature(client.__init__)
        for method in (client.copy, client.with_options):
            copy = inspect.signature(method)
            exclude = {"transport", "proxies", "_strict_response_validation"}
            missing = [n for n in init.parameters if n not in exclude and n not in copy.parameters]
            assert missing == [], f"copy() signature is missing {missing}"
        assert {"config", "verify"} <= set(init.parameters)
    finally:
        if isinstance(client, llmroute.OpenAI):
            client.close()


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(llmroute.AsyncOpenAI, openai.AsyncOpenAI), (llmroute.OpenAI, openai.OpenAI)],
)
def test_the_seam_shows_openais_overloads_of_request(ours: type[Any], theirs: type[Any]) -> None:
    """The seam overrides ``request()``; its overloads are openai's, in openai's order (the
    parameters, their kinds and defaults of each; the type variables are llmroute's own)."""

    def shape(cls: type[Any]) -> list[list[tuple[str, Any, Any]]]:
        return [
            [(p.name, p.kind, p.default) for p in inspect.signature(o).parameters.values()]
            for o in typing.get_overloads(cls.request)
        ]

    assert len(typing.get_overloads(theirs.request)) == 3
    assert shape(ours) == shape(theirs)


def routes_to(sim: Simulator) -> dict[str, Any]:
    return {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
    }


@pytest.mark.anyio
async def test_a_copy_given_a_config_has_its_own_routing_state(sim: Simulator) -> None:
    async with client_for(sim) as client:
        routed = client.with_options(config=routes_to(sim), max_retries=0)
        assert routed._llmroute is not client._llmroute and routed._client is not client._client
        assert routed.max_retries == 0 and routed.base_url == client.base_url
        done = await routed.chat.completions.create(model="chat", messages=MESSAGES)
        assert done.route is not None and done.route.winner == "sim:sim-small"
        plain = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert plain.route is None or plain.route.policy == "direct"  # no route of the original
        assert set(routed.stats()) == {"sim:sim-small"} and client.stats() == {}
        # A copy of it shares its state; a verify alone builds another from its config.
        again = routed.copy(timeout=5)
        assert again._llmroute is routed._llmroute
        trusting = routed.copy(verify=sim.ssl_context())
        assert trusting._llmroute is not routed._llmroute
        assert trusting._llmroute.config is routed._llmroute.config
        assert (await trusting.chat.completions.create(model="chat", messages=MESSAGES)).route
        await trusting.close()
        await routed.close()  # closes its own state, not the original's
        assert routed._llmroute.closed and not client._llmroute.closed
        done = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        assert done.choices[0].finish_reason == "stop"


@pytest.mark.anyio
async def test_stream_timings_are_ordered(sim: Simulator) -> None:
    async with client_for(sim) as client:
        stream = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        async for _ in stream:
            pass
    t = stream.timings
    assert t.headers is not None and t.first_byte is not None
    assert t.first_token is not None and t.total is not None
    assert 0 <= t.headers <= t.first_byte <= t.first_token <= t.total
    assert t.tokens == 20
    assert t.connection_reused is False and t.connect is not None and t.connect > 0


@pytest.mark.anyio
async def test_http_errors_raise_at_the_await(sim: Simulator) -> None:
    async with client_for(sim, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(
                model="sim-small",
                messages=MESSAGES,
                stream=True,
                extra_headers={"x-sim-fault": "429"},
            )
    err = info.value
    assert err.status_code == 429
    assert err.request_id
    assert isinstance(err.body, dict) and err.body.get("type")


@pytest.mark.anyio
async def test_html_error_body_from_a_proxy_is_kept_as_text(sim: Simulator) -> None:
    async with client_for(sim, max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, extra_headers={"x-sim-fault": "html502"}
            )
    assert info.value.status_code == 502
    assert isinstance(info.value.body, str) and "<html" in info.value.body.lower()


@pytest.mark.anyio
async def test_retries_follow_retry_after_and_max_retries(sim: Simulator) -> None:
    async with client_for(sim, max_retries=2) as client:
        before = sim.stats()["requests"]
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(
                model="sim-small",
                messages=MESSAGES,
                extra_headers={"x-sim-fault": "429", "x-sim-retry-after": "0.01"},
            )
        assert sim.stats()["requests"] - before == 3


@pytest.mark.anyio
async def test_connection_refused_is_an_api_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=f"https://127.0.0.1:{port}/v1", max_retries=0
    ) as client:
        with pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert KEY not in str(info.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("routed", [True, False], ids=["route", "direct"])
async def test_an_unreachable_target_is_named_in_the_error(scheme: str, routed: bool) -> None:
    """Plain HTTP said only 'All connection attempts failed' (routed) or openai's bare
    'Connection error.' (direct): which address failed was nowhere in the message."""
    port = _free_port()
    url = f"{scheme}://127.0.0.1:{port}/v1"
    config = {
        "providers": {"down": {"base_url": url, "api_key": KEY}},
        "models": {"chat": {"targets": ["down:m"]}},
    }
    options: dict[str, Any] = {"config": config} if routed else {"base_url": url}
    async with llmroute.AsyncOpenAI(api_key=KEY, max_retries=0, **options) as client:
        with anyio.fail_after(30), pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(model="chat" if routed else "m", messages=MESSAGES)
    text = str(info.value)  # "cannot connect to ADDRESS: ..." (trio: "all attempts to connect to")
    assert f"connect to 127.0.0.1:{port}" in text and KEY not in text


@pytest.mark.anyio
@pytest.mark.parametrize("routed", [True, False], ids=["route", "direct"])
async def test_an_untrusted_certificate_error_says_how_to_trust_it(
    sim: Simulator, routed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CERTIFICATE_VERIFY_FAILED alone did not say that a verify = (or --ca) fixes it."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    config = {
        "providers": {"private": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["private:sim-small"]}},
    }
    options: dict[str, Any] = {"config": config} if routed else {"base_url": sim.base_url}
    async with llmroute.AsyncOpenAI(api_key=KEY, max_retries=0, **options) as client:
        with anyio.fail_after(30), pytest.raises(openai.APIConnectionError) as info:
            await client.chat.completions.create(
                model="chat" if routed else "sim-small", messages=MESSAGES
            )
    text = str(info.value)
    assert f"127.0.0.1:{sim.port}" in text and "CERTIFICATE_VERIFY_FAILED" in text
    assert 'verify = "/path/to/ca.pem"' in text and "--ca FILE" in text
    assert isinstance(info.value, llmroute.AllTargetsFailed) == routed  # openai's class kept


@pytest.mark.anyio
async def test_timeout_is_an_api_timeout_error(sim: Simulator) -> None:
    async with client_for(sim, max_retries=0) as client:
        with anyio.fail_after(10):
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(
                    model="sim-small",
                    messages=MESSAGES,
                    timeout=0.3,
                    extra_headers={"x-sim-fault": "hang"},
                )


@pytest.mark.anyio
async def test_malformed_line_names_target_and_quotes_it(sim: Simulator) -> None:
    async with client_for(sim) as client:
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "malformed:2"},
        )
        with pytest.raises(llmroute.MalformedStreamError) as info:
            async for _ in stream:
                pass
    assert "127.0.0.1" in str(info.value)
    assert "{not json" in str(info.value)


@pytest.mark.anyio
async def test_drop_mid_stream_is_never_a_complete_answer(sim: Simulator) -> None:
    async with client_for(sim) as client:
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "drop:3"},
        )
        with anyio.fail_after(10), pytest.raises(llmroute.StreamInterrupted) as info:
            async for _ in stream:
                pass
    assert isinstance(info.value, openai.APIError)
    assert info.value.partial_text


@pytest.mark.anyio
async def test_key_never_in_logs_or_errors(
    sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    errors: list[BaseException] = []
    async with client_for(sim, max_retries=1) as client:
        for fault in ("429", "500", "html502", "malformed:1", "drop:2"):
            try:
                stream = await client.chat.completions.create(
                    model="sim-small",
                    messages=MESSAGES,
                    stream=True,
                    extra_headers={"x-sim-fault": fault, "x-sim-retry-after": "0.01"},
                )
                async for _ in stream:
                    pass
            except openai.APIError as exc:
                errors.append(exc)
    assert len(errors) == 5
    # The simulator runs in another thread of this process; its server-side logs are not ours.
    client_records = [r for r in caplog.records if r.thread == threading.get_ident()]
    assert any(r.name.startswith("hpack") for r in client_records), "expected debug records"
    retry_loggers = ("llmroute", "openai._base_client")
    assert any(r.name in retry_loggers for r in client_records), "expected retry records"
    for record in client_records:
        assert KEY not in record.getMessage()
    for exc in errors:
        assert KEY not in str(exc) and KEY not in repr(exc)
        assert KEY not in repr(getattr(exc, "body", ""))


def test_httpx_timeout_forms_are_accepted() -> None:
    client = llmroute.AsyncOpenAI(api_key=KEY, timeout=httpx.Timeout(3.0))
    assert client.timeout.read == 3.0
    client = llmroute.AsyncOpenAI(api_key=KEY, timeout=openai.Timeout(4.0, connect=1.0))
    assert client.timeout.read == 4.0 and client.timeout.connect == 1.0


async def _collect(stream: llmroute.AsyncStream[Any]) -> tuple[str, int]:
    text, roles = [], 0
    async for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            roles += delta.role == "assistant"
            text.append(delta.content or "")
    return "".join(text), roles


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["drop:0", "hang"])
async def test_failure_before_first_token_is_retried_seamlessly(sim: Simulator, fault: str) -> None:
    messages = [{"role": "user", "content": f"retry me {fault} {uuid.uuid4()}"}]
    async with client_for(sim, max_retries=2, timeout=httpx.Timeout(30, read=1.0)) as client:
        reference = await client.chat.completions.create(
            model="sim-small", messages=messages, stream=True
        )
        expected, _ = await _collect(reference)
        before = sim.stats()["chat_requests"]
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=messages,
            stream=True,
            extra_headers={
                "x-sim-fault": fault,
                "x-sim-fault-times": "1",
                "x-sim-fault-key": str(uuid.uuid4()),
            },
        )
        with anyio.fail_after(20):
            text, roles = await _collect(stream)
    assert text == expected
    assert roles == 1
    assert stream.timings.retries == 1
    assert sim.stats()["chat_requests"] - before == 2


@pytest.mark.anyio
async def test_failure_before_first_token_without_retries_left(sim: Simulator) -> None:
    async with client_for(sim, max_retries=1) as client:
        before = sim.stats()["chat_requests"]
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "drop:0"},
        )
        with anyio.fail_after(20), pytest.raises(openai.APIConnectionError) as info:
            await _collect(stream)
    assert not isinstance(info.value, llmroute.StreamInterrupted)
    assert sim.stats()["chat_requests"] - before == 2


async def _break_after_first_chunk(client: llmroute.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="sim-large",
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-sim-fault": "stall-between:2:60"},
    )
    async for _chunk in stream:
        break


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_plain_break_releases_the_stream_when_dropped(sim: Simulator) -> None:
    """No close(), no async with: dropping the stream after a break resets it (asyncio's
    async-generator finalizer runs our cleanup)."""
    async with client_for(sim) as client:
        await settled(sim)  # an earlier test's reset lands first
        before = sim.stats()["streams_cancelled"]
        await _break_after_first_chunk(client)
        gc.collect()
        with anyio.fail_after(30):  # a hang guard only
            while sim.stats()["streams_cancelled"] == before:  # noqa: ASYNC110 - other thread
                await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_a_stream_dropped_unread_is_reset_at_the_next_request(sim: Simulator) -> None:
    """Never iterated, never closed: the reset goes out with the connection's next request."""
    async with client_for(sim) as client:
        await settled(sim)  # an earlier test's reset lands first
        before = sim.stats()["streams_cancelled"]
        stream = await client.chat.completions.create(
            model="sim-large",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "stall-between:2:60"},
        )
        del stream
        for _ in range(3):
            gc.collect()
        await client.chat.completions.create(model="sim-large", messages=MESSAGES)
        with anyio.fail_after(30):  # a hang guard only
            while sim.stats()["streams_cancelled"] == before:  # noqa: ASYNC110 - other thread
                await anyio.sleep(0.01)
        assert sim.stats()["streams_cancelled"] == before + 1


def test_a_configured_proxy_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = llmroute.AsyncOpenAI(api_key=KEY, base_url="https://api.example.com/v1")
    assert client._transport is None  # httpx's transport, through the proxy
    monkeypatch.setenv("NO_PROXY", "api.example.com")
    client = llmroute.AsyncOpenAI(api_key=KEY, base_url="https://api.example.com/v1")
    assert client._transport is not None


@pytest.mark.anyio
async def test_openais_own_http_client_is_accepted(sim: Simulator) -> None:
    """openai >= 3 hands out httpx2 clients; code that passes one keeps working."""
    http_client = openai.DefaultAsyncHttpxClient(verify=sim.ssl_context())
    async with llmroute.AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, http_client=http_client, max_retries=0
    ) as client:
        completion = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
        assert completion.choices[0].message.content
        stream = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        text, _ = await _collect(stream)
        assert text == completion.choices[0].message.content
        with anyio.fail_after(10), pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(
                model="sim-small",
                messages=MESSAGES,
                timeout=0.3,
                extra_headers={"x-sim-fault": "hang"},
            )
        stream = await client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "drop:3"},
        )
        with anyio.fail_after(10), pytest.raises(llmroute.StreamInterrupted):
            await _collect(stream)
    await http_client.aclose()


@pytest.mark.anyio
async def test_the_connections_table_caps_streams_and_connections(sim_slow: Simulator) -> None:
    """``[connections]``: one stream per connection opens a second connection for a second
    stream; one connection per origin makes a second stream wait until the first is closed."""
    config = {"connections": {"max_streams": 1, "max_per_origin": 2}}
    async with client_for(sim_slow, config=config) as client:
        first = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        second = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        assert await anext(aiter(first)) is not None
        assert await anext(aiter(second)) is not None
        assert len(client._llmroute.transport.connections()) == 2  # type: ignore[attr-defined]
        await first.close()
        await second.close()

    events: list[str] = []
    config = {"connections": {"max_streams": 1, "max_per_origin": 1}}
    async with client_for(sim_slow, config=config) as client:
        held = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        await anext(aiter(held))

        async def another() -> None:
            stream = await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=True
            )
            events.append("second opened")
            await stream.close()

        transport = client._llmroute.transport  # type: ignore[attr-defined]
        with anyio.fail_after(30):  # a hang guard only
            async with anyio.create_task_group() as tg:
                tg.start_soon(another)
                for _ in range(3000):  # bounded: the transport's counter has no event
                    if transport.stream_waits or events:
                        break
                    await anyio.sleep(0.01)
                # The second request is waiting for a free stream, not on a second connection.
                assert transport.stream_waits == 1 and events == []
                events.append("first closed")
                await held.close()
        assert len(transport.connections()) == 1
        assert transport.stream_waits == 1  # woken once, by the close
    assert events == ["first closed", "second opened"]
