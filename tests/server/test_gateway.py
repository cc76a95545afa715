"""``llmroute serve``'s gateway end to end: the official openai client in front, simulators
behind."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
import trustme
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

import llmroute
from llmroute.cache import NAMESPACE_PATTERN
from llmroute.cache._stores import MemoryStore
from llmroute.config import ConfigError, load_config
from llmroute.server import Gateway, GatewayApp, KeyRing, dump_json
from llmroute.server._keys import key_namespace
from llmroute.testing import Profile, Simulator
from llmroute.testing._wire import masked_key

from ..settle import settled

# Under trio, openai's own AsyncStream leaves its SSE generators to the garbage collector when it
# stops at [DONE] or is closed (as for httpx's in pyproject.toml); llmroute's streams do not.
pytestmark = pytest.mark.filterwarnings("ignore:Async generator 'openai:ResourceWarning")

UPSTREAM_KEY = "sk-upstream-0123456789-NEVER-SHOWN"
GW_KEY = "gw-ci-key-0123456789abcdef"
OTHER_KEY = "gw-other-key-fedcba9876543210"
ENVIRON = {"GW_KEY_CI": GW_KEY, "GW_KEY_OTHER": OTHER_KEY}
MESSAGES = [{"role": "user", "content": "Tell me about gateways."}]
DEADLINE = 10.0  # seconds any bounded wait may take


def gateway_config(sim: Simulator, slow: Simulator, **gateway: Any) -> dict[str, Any]:
    provider = {"base_url": sim.base_url, "api_key": UPSTREAM_KEY}
    return {
        "providers": {
            "sim": provider,
            "slow": {"base_url": slow.base_url, "api_key": UPSTREAM_KEY},
            "broken": {**provider, "headers": {"x-sim-fault": "drop:3"}},
            "failing": {**provider, "headers": {"x-sim-fault": "500"}},
            "hanging": {
                "base_url": slow.base_url,
                "api_key": UPSTREAM_KEY,
                "headers": {"x-sim-fault": "hang"},
            },
        },
        "models": {
            "chat": {"targets": ["sim:sim-small"]},
            "slow": {"targets": ["slow:sim-small"]},
            "broken": {"targets": ["broken:sim-small"], "continue_on_break": False},
            "failing": {"targets": ["failing:sim-small"]},
            "hanging": {"targets": ["hanging:sim-small"]},
        },
        "routing": {"explore": 0},
        "cache": {"backend": "memory", "min_hits": 1},
        "gateway": {
            "keys": {"ci": "GW_KEY_CI", "other": "GW_KEY_OTHER"},
            "max_body_bytes": "64KiB",
            **gateway,
        },
    }


@pytest.fixture(scope="module")
def slow() -> Iterator[Simulator]:
    """Its own simulator (tokens every 10 ms), so its cancel counter is this module's alone."""
    with Simulator(profile=Profile(reply_tokens=300, inter_token=0.01)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(sim: Simulator, slow: Simulator) -> Iterator[Gateway]:
    """A plain-HTTP gateway (HTTP/1.1) on an ephemeral port."""
    config = gateway_config(sim, slow)
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as server:
        yield server


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, trustme.CA]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    folder = tmp_path_factory.mktemp("gateway-tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return str(cert), str(key), ca


@pytest.fixture(scope="module")
def tls_gateway(
    sim: Simulator, slow: Simulator, tls_files: tuple[str, str, trustme.CA]
) -> Iterator[Gateway]:
    """The same gateway over TLS: HTTP/2 by ALPN."""
    cert, key, _ = tls_files
    config = gateway_config(sim, slow)
    with Gateway(
        config,
        certfile=cert,
        keyfile=key,
        environ=ENVIRON,
        verify=sim.ssl_context(),
        max_retries=0,
    ) as server:
        yield server


def client_for(gateway: Gateway, key: str = GW_KEY, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, **options)


def root(gateway: Gateway) -> str:
    return gateway.base_url.removesuffix("/v1")


async def direct_reply(sim: Simulator, messages: list[dict[str, str]] = MESSAGES) -> str:
    async with openai.AsyncOpenAI(
        base_url=sim.base_url,
        api_key=UPSTREAM_KEY,
        http_client=httpx.AsyncClient(verify=sim.ssl_context()),
    ) as client:
        done = await client.chat.completions.create(model="sim-small", messages=messages)
    return done.choices[0].message.content or ""


async def wait_for(predicate: Callable[[], bool], seconds: float = DEADLINE) -> None:
    """Poll ``predicate`` (bounded in time); the assertion after it decides the test."""
    with anyio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 - the counters have no event to wait on
            await anyio.sleep(0.02)


def scan(text: str) -> None:
    assert UPSTREAM_KEY not in text
    assert UPSTREAM_KEY[:16] not in text


# -- the official client, every endpoint ---------------------------------------------------------


@pytest.mark.anyio
async def test_chat_completion_is_the_upstream_answer(gateway: Gateway, sim: Simulator) -> None:
    expected = await direct_reply(sim)
    async with client_for(gateway) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES
        )
        done = raw.parse()
    assert done.choices[0].message.content == expected
    assert done.choices[0].finish_reason == "stop"
    assert raw.headers["x-request-id"].startswith("gw-")
    sent = sim.last_requests[-1]
    assert sent["json"]["model"] == "sim-small"
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert all(GW_KEY not in value for value in sent["headers"].values())


@pytest.mark.anyio
async def test_chat_stream_is_the_upstream_answer(gateway: Gateway, sim: Simulator) -> None:
    expected = await direct_reply(sim)
    async with client_for(gateway) as client:
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert isinstance(chunks[0], ChatCompletionChunk)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sync_client_completions_embeddings_and_models(gateway: Gateway, sim: Simulator) -> None:
    with openai.OpenAI(base_url=gateway.base_url, api_key=GW_KEY, max_retries=0) as client:
        completion = client.completions.create(model="chat", prompt="Say hi", max_tokens=4)
        assert len(completion.choices[0].text.split()) == 4
        assert completion.choices[0].finish_reason == "length"
        pieces = list(
            client.completions.create(model="chat", prompt="Say hi", max_tokens=4, stream=True)
        )
        assert "".join(p.choices[0].text for p in pieces if p.choices).split() == (
            completion.choices[0].text.split()
        )
        floats = client.embeddings.create(model="chat", input=["a", "b"])
        assert len(floats.data) == 2 and isinstance(floats.data[0].embedding[0], float)
        assert sim.last_requests[-1]["json"]["encoding_format"] == "base64"  # openai's default
        asked = client.embeddings.create(model="chat", input="a", encoding_format="float")
        assert asked.data[0].embedding == floats.data[0].embedding
        models = client.models.list()
        assert [m.id for m in models.data] == ["chat", "slow", "broken", "failing", "hanging"]
        assert client.models.retrieve("chat").owned_by == "llmroute"
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("gpt-9")
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError, match="gpt-9") as far:
            client.chat.completions.create(model="gpt-9", messages=MESSAGES)
        # No near miss: the key's models, as GET /v1/models lists them. (openai 2.x words its
        # .message as the whole body, 3.x as the error's message: the hint is in both.)
        hint = "(the models you can use here: 'chat', 'slow', 'broken', 'failing', 'hanging')"
        assert hint in str(far.value)


@pytest.mark.anyio
async def test_body_fields_named_like_call_options_stay_in_the_body(
    gateway: Gateway, sim: Simulator
) -> None:
    """``extra_headers``, ``timeout`` ... in a JSON body are fields sent upstream as they are,
    never options of the gateway's own call (a client cannot set upstream headers)."""
    body = {
        "model": "chat",
        "messages": MESSAGES,
        "extra_headers": {"x-sim-fault": "500"},
        "extra_query": {"q": "1"},
        "timeout": 0.000001,
    }
    async with httpx.AsyncClient() as plain:
        answer = await plain.post(
            f"{gateway.base_url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {GW_KEY}", "x-sim-fault": "500"},
        )
    assert answer.status_code == 200, answer.text
    sent = sim.last_requests[-1]
    assert "x-sim-fault" not in sent["headers"] and sent["query"] == {}
    assert sent["json"]["extra_headers"] == {"x-sim-fault": "500"}
    assert sent["json"]["timeout"] == 0.000001


@pytest.mark.anyio
async def test_a_latency_goal_in_the_body_is_the_routings_and_never_sent_upstream(
    gateway: Gateway, sim: Simulator
) -> None:
    """The gateway hands a routed body to the client's dispatch itself (not through openai's
    post()): the ``llmroute`` options are still read there, checked before anything is sent,
    and never forwarded."""
    run = os.urandom(4).hex()  # this run's requests only (the module's simulator is shared)
    good = [{"role": "user", "content": f"A goal the routing reads ({run})."}]
    bad = [{"role": "user", "content": f"A goal that is not a number ({run})."}]
    headers = {"authorization": f"Bearer {GW_KEY}"}
    async with httpx.AsyncClient() as plain:
        answer = await plain.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": "chat", "messages": good, "llmroute": {"ttft_target_ms": 300}},
            headers=headers,
        )
        refused = await plain.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": "chat", "messages": bad, "llmroute": {"ttft_target_ms": "soon"}},
            headers=headers,
        )
    assert answer.status_code == 200, answer.text
    bodies = [r["json"] or {} for r in sim.last_requests]  # a GET has no JSON body
    sent = [body for body in bodies if body.get("messages") == good]
    assert len(sent) == 1 and "llmroute" not in sent[0]
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "llmroute.ttft_target_ms"
    assert not [body for body in bodies if body.get("messages") == bad]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_model_that_is_not_a_route_goes_to_the_default_provider(
    sim: Simulator, slow: Simulator, stream: bool
) -> None:
    """Only calls on a route are handed to the dispatch directly; any other model name (with
    ``default_provider``) still takes the client's own path, to that provider."""
    config = {**gateway_config(sim, slow), "default_provider": "sim"}
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as server:
        async with client_for(server) as client:
            if stream:
                chunks = await client.chat.completions.create(
                    model="sim-small", messages=MESSAGES, stream=True
                )
                text = "".join([c.choices[0].delta.content or "" async for c in chunks])
            else:
                done = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
                text = done.choices[0].message.content or ""
    assert text == await direct_reply(sim)
    assert sim.last_requests[-1]["json"]["model"] == "sim-small"


@pytest.mark.anyio
async def test_llmroute_options_never_go_to_the_default_provider(
    sim: Simulator, slow: Simulator
) -> None:
    """A model that is not a route takes openai's own path with the body as the gateway read
    it: its ``llmroute`` options are taken out there too."""
    config = {**gateway_config(sim, slow), "default_provider": "sim"}
    run = os.urandom(4).hex()
    asked = [{"role": "user", "content": f"A goal on a plain model ({run})."}]
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as server:
        async with httpx.AsyncClient() as plain:
            answer = await plain.post(
                f"{server.base_url}/chat/completions",
                json={"model": "sim-small", "messages": asked, "llmroute": {"ttft_target_ms": 300}},
                headers={"authorization": f"Bearer {GW_KEY}"},
            )
    assert answer.status_code == 200, answer.text
    sent = [r["json"] for r in sim.last_requests if (r["json"] or {}).get("messages") == asked]
    assert len(sent) == 1 and "llmroute" not in sent[0]


@pytest.mark.anyio
async def test_sse_events_are_the_upstream_events(gateway: Gateway, sim: Simulator) -> None:
    body = {"model": "sim-small", "messages": MESSAGES, "stream": True}
    async with httpx.AsyncClient(verify=sim.ssl_context()) as direct:
        upstream = await direct.post(
            f"{sim.base_url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {UPSTREAM_KEY}"},
        )
    async with httpx.AsyncClient() as plain:
        through = await plain.post(
            f"{gateway.base_url}/chat/completions",
            json={**body, "model": "chat"},
            headers={"authorization": f"Bearer {GW_KEY}"},
        )
    assert through.headers["content-type"].startswith("text/event-stream")

    def events(text: str) -> list[str]:
        return [line[6:] for line in text.splitlines() if line.startswith("data: ")]

    want, got = events(upstream.text), events(through.text)
    assert got[-1] == "[DONE]" and want[-1] == "[DONE]"
    assert len(got) == len(want)
    for ours, theirs in zip(got[:-1], want[:-1], strict=True):
        mine, original = json.loads(ours), json.loads(theirs)
        for volatile in ("id", "created"):
            assert volatile in mine
            mine.pop(volatile)
            original.pop(volatile)
        assert mine == original  # same keys (none invented, none lost) and values


def test_dump_json_keeps_vendor_fields_and_invents_none() -> None:
    wire = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hi", "vendor_delta": 1}}],
        "vendor_field": {"nested": [1, 2]},
    }
    chunk = construct_type(type_=ChatCompletionChunk, value=wire)
    assert isinstance(chunk, ChatCompletionChunk)
    assert json.loads(dump_json(chunk)) == wire


# -- auth, limits -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_gateway_keys_are_required_and_never_echoed(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as plain:
        missing = await plain.get(f"{gateway.base_url}/models")
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        health = await plain.get(f"{root(gateway)}/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        metrics = await plain.get(f"{root(gateway)}/metrics")
        assert metrics.status_code == 401
        metrics = await plain.get(
            f"{root(gateway)}/metrics", headers={"authorization": f"Bearer {OTHER_KEY}"}
        )
        assert metrics.status_code == 200
    wrong = "gw-wrong-key-which-must-not-be-echoed"
    async with client_for(gateway, key=wrong) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert wrong not in str(refused.value) and wrong not in refused.value.response.text
    assert GW_KEY[:8] not in refused.value.response.text
    async with client_for(gateway, key=OTHER_KEY) as client:
        page = await client.models.list()
    assert page.data[0].id == "chat"
    assert 'llmroute_gateway_requests_total{key="-",path="/v1/models",status="401"}' in metrics.text
    assert 'llmroute_gateway_rejections_total{key="-",reason="unauthorized"}' in metrics.text
    assert GW_KEY not in metrics.text and OTHER_KEY not in metrics.text


def test_key_ring_matches_by_name_only() -> None:
    ring = KeyRing({"a": "key-one", "b": "key-two"})
    assert ring.match("Bearer key-two") == "b"
    assert ring.match("bearer key-one") == "a"
    assert ring.match("Bearer key-three") is None
    assert ring.match("Bearer ") is None
    assert ring.match("key-one") is None
    assert ring.match(None) is None
    assert "key-one" not in repr(ring)


def test_a_key_a_client_cannot_send_is_refused_at_load(sim: Simulator, slow: Simulator) -> None:
    """Header values reach the app decoded as latin-1: a UTF-8 key (or one with a control
    character) would be accepted and never match, so it is refused, naming the variable."""
    for bad in ("gw-clé-0123456789", "gw-key-\x01-0123456789", "gw-key-\u00a0-0123456789"):
        with pytest.raises(ConfigError, match="GW_KEY_OTHER") as refused:
            Gateway(gateway_config(sim, slow), environ={**ENVIRON, "GW_KEY_OTHER": bad})
        assert "printable ASCII" in str(refused.value)
        assert bad not in str(refused.value) and bad[:10] not in str(refused.value)
        with pytest.raises(ValueError, match="printable ASCII") as direct:
            KeyRing({"a": bad})
        assert bad not in str(direct.value)
    # Printable ASCII, spaces and punctuation included, is fine (and matches).
    ring = KeyRing({"a": "gw key with spaces & ~punctuation!"})
    assert ring.match("Bearer gw key with spaces & ~punctuation!") == "a"


def test_a_long_key_name_gets_a_cache_namespace_that_fits() -> None:
    assert key_namespace("ci") == "gateway.ci"  # short names: the namespaces they always had
    assert key_namespace("k" * 56) == "gateway." + "k" * 56
    long_names = ["k" * 57, "k" * 64, "a" * 64]
    spaces = [key_namespace(name) for name in long_names]
    assert len(set(spaces)) == 3
    for space in spaces:
        assert space.startswith("gateway-") and len(space) <= 64
        assert NAMESPACE_PATTERN.fullmatch(space)
    assert spaces[0] == key_namespace("k" * 57)  # stable


@pytest.mark.anyio
async def test_the_per_key_cache_works_with_a_64_character_key_name(
    sim: Simulator, slow: Simulator
) -> None:
    config = gateway_config(sim, slow, cache_namespace_per_key=True)
    config["gateway"]["keys"] = {"k" * 64: "GW_KEY_CI"}
    messages = [{"role": "user", "content": f"long key name {time.time_ns()}"}]
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as gateway:
        async with client_for(gateway) as client:
            answers = [
                await client.chat.completions.with_raw_response.create(
                    model="chat", messages=messages, temperature=0
                )
                for _ in range(2)
            ]
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.headers["x-llmroute-cache"] for a in answers] == ["miss", "hit"]


@pytest.mark.anyio
async def test_secret_header_values_of_providers_are_scrubbed(sim: Simulator) -> None:
    azure, anthropic, token = "azure-secret-0123456789", "ant-secret-987654321", "tok-5555-abcd"
    headers = {"api-key": azure, "X-Api-Key": anthropic, "Authorization": f"Bearer {token}"}
    config = {
        "providers": {
            "sim": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY, "headers": headers},
        },
        "models": {"chat": {"targets": ["sim:sim-small"]}},
        "gateway": {"keys": {"ci": "GW_KEY_CI"}},
    }
    app = GatewayApp(config, environ=ENVIRON)
    try:
        text = app._scrub(  # pyright: ignore[reportPrivateUsage]
            f"upstream said: bad api-key {azure}, x-api-key {anthropic}, bearer {token}, "
            f"key {UPSTREAM_KEY}; trace-id 1234"
        )
    finally:
        await app.aclose()
    for secret in (azure, anthropic, token, UPSTREAM_KEY):
        assert secret not in text
    assert text.count("[redacted]") == 4 and "trace-id 1234" in text


def masked_forms_of(key: str) -> list[str]:
    """The forms vendors echo a key in: first 8 and last 4 around stars (OpenAI's 401),
    ``sk-...`` and the last 4, an ellipsis, the head alone with stars."""
    return [
        masked_key(key),
        f"{key[:3]}...{key[-4:]}",
        f"{key[:4]}\u2026{key[-4:]}",
        f"****{key[-4:]}",
        f"{key[:6]}****",
    ]


def test_masked_forms_of_upstream_keys_are_scrubbed(gateway: Gateway) -> None:
    app = gateway.app
    for form in masked_forms_of(UPSTREAM_KEY):
        text = app._scrub(f"Incorrect API key provided: {form}. See your account.")
        assert form not in text and UPSTREAM_KEY[-4:] not in text
        assert text == "Incorrect API key provided: [redacted]. See your account."
    # Ordinary text keeps its dots, stars and words that merely end like the key.
    plain = "Loading... done ** 5 items, x-request-id abc, SHOWN, ends with HOWN"
    assert app._scrub(plain) == plain


@pytest.mark.parametrize("text", ["x" * 20_000, "sk-u" * 5_000, ("a" * 40 + "...") * 500])
def test_finding_masked_keys_takes_work_linear_in_the_text(text: str) -> None:
    """``[\\w-]*`` then a mask of x's, read forwards, took n**3 steps for n x's with no key's
    tail after them: 1,000 x's in an error held the gateway's event loop 10 s, and a client's
    unknown URL of 5,000 x's, echoed in its 404, held it for many minutes. Run in a subprocess
    with a generous deadline (milliseconds now; hours before)."""
    code = (
        "import sys\n"
        "from llmroute._secrets import masked_forms, scrub\n"
        f"secrets = [{UPSTREAM_KEY!r}]\n"
        "text = sys.stdin.read()\n"
        "print(len(scrub(text, secrets, '[redacted]', masked_forms(secrets))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(llmroute.__file__).parent.parent)},
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert int(done.stdout) == len(text)  # nothing in it is a key


def test_the_request_and_its_call_show_neither_key_nor_prompt_in_a_repr(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the gateway passes along a request's path (its ``Request``, its checked
    ``ApiCall``) names the path and model in a repr, never the key or the prompt."""
    relay = gateway.app.relay
    answer = relay.answer
    shown: list[str] = []

    async def seen(call: Any, tally: Any) -> None:
        shown.extend((repr(call), repr(call.request)))
        await answer(call, tally)

    monkeypatch.setattr(relay, "answer", seen)
    client = openai.OpenAI(base_url=gateway.base_url, api_key=GW_KEY, max_retries=0)
    client.chat.completions.create(model="chat", messages=MESSAGES)  # type: ignore[arg-type]
    assert len(shown) == 2
    assert "'chat'" in shown[0] and "/v1/chat/completions" in shown[1]
    for text in shown:
        assert GW_KEY not in text and "gateways" not in text


@pytest.mark.anyio
async def test_an_upstream_401_echoing_the_masked_key_leaks_it_nowhere(
    sim: Simulator, slow: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    """The simulator's 401 quotes the key as OpenAI's does (sk-upstr****...HOWN): not in the
    502's message, a stream's answer, the logs, /metrics, /health or the cache's entries."""
    caplog.set_level(logging.DEBUG)
    config = gateway_config(sim, slow)
    denied = {"base_url": sim.base_url, "api_key": UPSTREAM_KEY, "headers": {"x-sim-fault": "401"}}
    config["providers"]["denied"] = denied
    config["models"]["denied"] = {"targets": ["denied:sim-small"]}
    config["models"]["fallback"] = {
        "targets": ["denied:sim-small", "sim:sim-small"],
        "policy": "failover",
    }
    config["gateway"]["metrics_public"] = True
    masked = masked_key(UPSTREAM_KEY)
    texts: list[str] = []
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as gateway:
        async with client_for(gateway) as client:
            with pytest.raises(openai.APIStatusError) as failed:
                await client.chat.completions.create(model="denied", messages=MESSAGES)
            assert failed.value.status_code == 502
            assert "denied:sim-small" in failed.value.message  # the cause is still named
            texts.append(failed.value.response.text)
            messages = [{"role": "user", "content": f"masked {time.time_ns()}"}]
            stream = await client.chat.completions.create(
                model="fallback", messages=messages, stream=True, temperature=0
            )
            texts.append("".join([c.model_dump_json() async for c in stream]))
        async with httpx.AsyncClient() as plain:
            for path in ("/metrics", "/health"):
                answer = await plain.get(root(gateway) + path)
                assert answer.status_code == 200
                texts.append(answer.text)
        cache = gateway.app.client._llmroute.cache  # pyright: ignore[reportPrivateUsage]
        assert cache is not None
        store = cache.store
        assert isinstance(store, MemoryStore)
        entries = store._entries  # pyright: ignore[reportPrivateUsage]
        for _ in range(100):  # stored in the background once the stream ended
            if entries:
                break
            await anyio.sleep(0.05)
        assert entries  # the fallback's answer was stored
        texts.extend(repr(value) for value in entries.values())
    records = [r for r in caplog.records if r.name.startswith(("llmroute", "hypercorn"))]
    texts.append("\n".join(r.getMessage() for r in records))
    # The upstream did echo it: the direct answer carries the masked key.
    async with openai.AsyncOpenAI(
        base_url=sim.base_url,
        api_key=UPSTREAM_KEY,
        max_retries=0,
        default_headers={"x-sim-fault": "401"},
        http_client=httpx.AsyncClient(verify=sim.ssl_context()),
    ) as direct:
        with pytest.raises(openai.AuthenticationError) as refused:
            await direct.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert masked in refused.value.message
    for text in texts:
        scan(text)
        assert masked not in text and UPSTREAM_KEY[-4:] not in text


@pytest.mark.anyio
async def test_a_body_over_the_limit_is_413(gateway: Gateway) -> None:
    big = [{"role": "user", "content": "x" * (65 * 1024)}]
    async with client_for(gateway) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model="chat", messages=big)
    assert refused.value.status_code == 413
    assert refused.value.code == "request_too_large"
    assert "larger than the gateway allows (64 KiB)" in str(refused.value)  # not 65536 bytes
    async with httpx.AsyncClient() as plain:  # no Content-Length: counted as it arrives

        async def body() -> Any:
            for _ in range(70):
                yield b"x" * 1024

        chunked = await plain.post(
            f"{gateway.base_url}/chat/completions",
            content=body(),
            headers={"authorization": f"Bearer {GW_KEY}"},
        )
        assert chunked.status_code == 413
        bad = await plain.post(
            f"{gateway.base_url}/chat/completions",
            content=b"{not json",
            headers={"authorization": f"Bearer {GW_KEY}"},
        )
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        missing = await plain.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": "chat"},
            headers={"authorization": f"Bearer {GW_KEY}"},
        )
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
        deep = await plain.post(
            f"{gateway.base_url}/chat/completions",
            content=b'{"model": "chat", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
            headers={"authorization": f"Bearer {GW_KEY}"},
        )
        assert deep.status_code == 400, deep.text
        wrong_method = await plain.get(
            f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {GW_KEY}"}
        )
        assert wrong_method.status_code == 405


@pytest.mark.anyio
async def test_per_key_concurrency_is_refused_with_429(sim: Simulator, slow: Simulator) -> None:
    config = gateway_config(sim, slow, max_concurrency_per_key=1)
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context()) as gateway:
        async with client_for(gateway) as client, client_for(gateway, key=OTHER_KEY) as other:
            stream = await client.chat.completions.create(
                model="slow", messages=MESSAGES, stream=True
            )
            async with stream:
                await stream.__anext__()
                with pytest.raises(openai.RateLimitError) as refused:
                    await client.chat.completions.create(model="chat", messages=MESSAGES)
                assert refused.value.response.headers["retry-after"] == "1"
                answered = await other.chat.completions.create(model="chat", messages=MESSAGES)
                assert answered.choices[0].message.content
            again: Any = None
            with anyio.move_on_after(DEADLINE):
                while again is None:
                    try:
                        again = await client.models.list()
                    except openai.RateLimitError:
                        await anyio.sleep(0.02)
            assert again is not None


# -- streams: disconnects, failures, shutdown --------------------------------------------------


@pytest.mark.anyio
async def test_a_client_that_leaves_cancels_the_upstream_http1(
    gateway: Gateway, slow: Simulator
) -> None:
    await settled(slow)  # earlier tests' cancels are counted first
    before = slow.stats()["streams_cancelled"]
    async with client_for(gateway) as client:
        stream = await client.chat.completions.create(model="slow", messages=MESSAGES, stream=True)
        await stream.__anext__()
        await stream.__anext__()
        await stream.close()
    await wait_for(lambda: slow.stats()["streams_cancelled"] > before)
    assert slow.stats()["streams_cancelled"] == before + 1
    counted = 'llmroute_gateway_client_disconnects_total{key="ci",path="/v1/chat/completions"}'
    await wait_for(lambda: counted in gateway.app.metrics.exposition().decode())
    assert counted in gateway.app.metrics.exposition().decode()


@pytest.mark.anyio
async def test_a_client_that_leaves_cancels_the_upstream_http2(
    tls_gateway: Gateway, slow: Simulator, tls_files: tuple[str, str, trustme.CA]
) -> None:
    ctx = ssl.create_default_context()
    tls_files[2].configure_trust(ctx)
    await settled(slow)  # earlier tests' cancels are counted first
    before = slow.stats()["streams_cancelled"]
    async with llmroute.AsyncOpenAI(
        base_url=tls_gateway.base_url, api_key=GW_KEY, verify=ctx, max_retries=0
    ) as client:
        stream = await client.chat.completions.create(model="slow", messages=MESSAGES, stream=True)
        assert stream.timings.http_version == "HTTP/2"
        await stream.__anext__()
        await stream.close()  # llmroute resets the HTTP/2 stream; the connection stays
        await wait_for(lambda: slow.stats()["streams_cancelled"] > before)
        assert slow.stats()["streams_cancelled"] == before + 1
        done = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert done.choices[0].finish_reason == "stop"


@pytest.mark.anyio
async def test_the_official_client_over_http2(
    tls_gateway: Gateway, sim: Simulator, tls_files: tuple[str, str, trustme.CA]
) -> None:
    ctx = ssl.create_default_context()
    tls_files[2].configure_trust(ctx)
    expected = await direct_reply(sim)
    http = openai.DefaultAsyncHttpxClient(http2=True, verify=ctx)
    async with client_for(tls_gateway, http_client=http) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES
        )
        assert raw.http_response.http_version == "HTTP/2"
        assert raw.parse().choices[0].message.content == expected
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == expected


@pytest.mark.anyio
async def test_a_client_that_leaves_before_the_first_token_cancels_the_upstream(
    gateway: Gateway, slow: Simulator
) -> None:
    await settled(slow)  # earlier tests' cancels are counted first
    before = slow.stats()["streams_cancelled"]
    async with client_for(gateway, timeout=0.5) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="hanging", messages=MESSAGES, stream=True)
    await wait_for(lambda: slow.stats()["streams_cancelled"] > before)
    assert slow.stats()["streams_cancelled"] == before + 1


@pytest.mark.anyio
async def test_a_stream_that_breaks_upstream_does_not_look_complete(gateway: Gateway) -> None:
    async with client_for(gateway) as client:
        stream = await client.chat.completions.create(
            model="broken", messages=MESSAGES, stream=True
        )
        seen: list[str] = []
        with pytest.raises(openai.APIError) as broke:
            async for chunk in stream:
                seen.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert broke.value.code == "stream_interrupted"  # type: ignore[attr-defined]
    assert 1 <= len(seen) <= 4
    async with httpx.AsyncClient() as plain:
        raw = await plain.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": "broken", "messages": MESSAGES, "stream": True},
            headers={"authorization": f"Bearer {GW_KEY}"},
        )
    events = [line[6:] for line in raw.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["type"] == "server_error"
    scan(raw.text)


@pytest.mark.anyio
async def test_upstream_errors_are_openai_errors_without_secrets(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with client_for(gateway) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model="failing", messages=MESSAGES)
    assert failed.value.status_code == 502  # every target failed: a bad gateway
    assert failed.value.code == "all_targets_failed"
    assert "failing:sim-small" in failed.value.message  # each target's cause is named
    scan(failed.value.response.text)
    scan(str(dict(failed.value.response.headers)))
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {GW_KEY}"}) as plain:
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", "/v1/models/chat"),
            ("GET", "/v1/nowhere"),
            ("GET", "/nowhere"),
            ("GET", "/health"),
            ("GET", "/metrics"),
        ]:
            answer = await plain.request(method, root(gateway) + path)
            scan(answer.text)
            scan(str(dict(answer.headers)))
    # hpack logs header values at DEBUG (on both ends, the simulator's too): only ours are read.
    ours = [r for r in caplog.records if r.name.startswith(("llmroute.server", "hypercorn"))]
    assert any(r.name == "llmroute.server" for r in ours)
    scan("\n".join(r.getMessage() for r in ours))
    scan(repr(gateway.app.keys))


def test_error_messages_are_scrubbed_of_upstream_keys(gateway: Gateway) -> None:
    request = httpx.Request("POST", "https://upstream.invalid/v1/chat/completions")
    leaked = openai.BadRequestError(
        f"Error code: 400 - bad key {UPSTREAM_KEY}",
        response=httpx.Response(400, request=request),
        body={"message": f"Incorrect API key provided: {UPSTREAM_KEY}", "type": "x"},
    )
    refused = gateway.app._map_error(leaked)
    assert refused.status == 400
    text = gateway.app._error_bytes(refused.body).decode()
    scan(text)
    assert "[redacted]" in text
    denied = openai.AuthenticationError(
        "Error code: 401", response=httpx.Response(401, request=request), body=None
    )
    assert gateway.app._map_error(denied).status == 502  # the gateway's fault, not the client's
    invalid = llmroute.AllTargetsFailed(
        "chat", {"a:m": leaked, "b:m": leaked}, request
    )  # every target refused the request itself: the client's fault, said as the target said it
    assert gateway.app._map_error(invalid).status == 400
    mixed = llmroute.AllTargetsFailed("chat", {"a:m": leaked, "b:m": denied}, request)
    assert gateway.app._map_error(mixed).status == 502


@pytest.mark.anyio
async def test_the_cache_answers_behind_the_gateway(gateway: Gateway, sim: Simulator) -> None:
    messages = [{"role": "user", "content": f"cache me {time.time_ns()}"}]
    async with client_for(gateway) as client:
        first = await client.chat.completions.with_raw_response.create(
            model="chat", messages=messages, temperature=0
        )
        asked = sim.stats()["chat_requests"]
        second = await client.chat.completions.with_raw_response.create(
            model="chat", messages=messages, temperature=0
        )
        stream = await client.chat.completions.create(
            model="chat", messages=messages, temperature=0, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert first.headers["x-llmroute-cache"] == "miss"
    assert second.headers["x-llmroute-cache"] == "hit"
    # the target that answered (x-llmroute-target), the cache once it replays
    assert first.headers["x-llmroute-target"] == "sim:sim-small"
    assert second.headers["x-llmroute-target"] == "cache"
    assert sim.stats()["chat_requests"] == asked
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert streamed == first.parse().choices[0].message.content


@pytest.mark.anyio
async def test_stopping_the_gateway_ends_streams_and_cancels_upstream(
    sim: Simulator, slow: Simulator
) -> None:
    config = gateway_config(sim, slow)
    gateway = Gateway(config, environ=ENVIRON, verify=sim.ssl_context()).start()
    try:
        await settled(slow)  # earlier tests' cancels are counted first
        before = slow.stats()["streams_cancelled"]
        async with client_for(gateway) as client:
            stream = await client.chat.completions.create(
                model="slow", messages=MESSAGES, stream=True
            )
            await stream.__anext__()
            await anyio.to_thread.run_sync(gateway.stop)
            with pytest.raises(openai.APIError) as ended:
                async for _ in stream:
                    pass
        assert ended.value.code == "gateway_shutdown"  # type: ignore[attr-defined]
        await wait_for(lambda: slow.stats()["streams_cancelled"] > before)
        assert slow.stats()["streams_cancelled"] == before + 1
    finally:
        gateway.stop()


@pytest.mark.anyio
async def test_a_draining_gateway_finishes_its_streams_and_refuses_new_requests(
    sim: Simulator, slow: Simulator
) -> None:
    """Stopped with a drain, the gateway answers new requests 503 while the stream in flight
    runs to its end, whole, and its upstream is never cancelled; with a drain shorter than the
    answer, what is left is ended as without one."""
    config = gateway_config(sim, slow)
    gateway = Gateway(config, environ=ENVIRON, verify=sim.ssl_context()).start()
    try:
        await settled(slow)
        before = slow.stats()["streams_cancelled"]
        async with client_for(gateway) as client:
            stream = await client.chat.completions.create(
                model="slow", messages=MESSAGES, stream=True
            )
            first = await stream.__anext__()
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(anyio.to_thread.run_sync, gateway.stop, 60.0))
                await wait_for(lambda: gateway.app._closing)
                with pytest.raises(openai.InternalServerError) as refused:
                    await client.chat.completions.create(model="chat", messages=MESSAGES)
                assert refused.value.status_code == 503
                chunks = [first] + [chunk async for chunk in stream]
            assert gateway.app.in_flight == 0
        tokens = [c for c in chunks if c.choices and c.choices[0].delta.content]
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert len(tokens) == 300  # the simulator's 300 tokens, none missing
        assert slow.stats()["streams_cancelled"] == before
    finally:
        gateway.stop()

    gateway = Gateway(config, environ=ENVIRON, verify=sim.ssl_context()).start()
    try:
        async with client_for(gateway) as client:
            stream = await client.chat.completions.create(
                model="slow", messages=MESSAGES, stream=True
            )
            await stream.__anext__()
            await anyio.to_thread.run_sync(gateway.stop, 0.2)
            with pytest.raises(openai.APIError) as ended:
                async for _ in stream:
                    pass
        assert ended.value.code == "gateway_shutdown"  # type: ignore[attr-defined]
    finally:
        gateway.stop()


# -- config ---------------------------------------------------------------------------------------


def test_gateway_table_validation_never_shows_a_key() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.keys\.app") as pasted:
        load_config({"gateway": {"keys": {"app": "sk-live-abcdef0123456789"}}})
    assert "sk-live" not in str(pasted.value)
    with pytest.raises(ConfigError, match="looks like a key") as named:
        load_config({"gateway": {"keys": {"sk-live-abcdef0123456789": "GW_KEY"}}})
    assert "sk-live" not in str(named.value)
    with pytest.raises(ConfigError, match="certfile and keyfile"):
        load_config({"gateway": {"certfile": "cert.pem"}})
    config = load_config({"gateway": {"max_body_bytes": "1MiB"}})
    assert config is not None and config.gateway is not None
    assert config.gateway.max_body_bytes == 2**20
    assert config.gateway.keys == {"default": "LLMROUTE_GATEWAY_KEY"}


def test_a_missing_gateway_key_names_its_variable(sim: Simulator, slow: Simulator) -> None:
    with pytest.raises(ConfigError, match="GW_KEY_OTHER") as missing:
        Gateway(gateway_config(sim, slow), environ={"GW_KEY_CI": GW_KEY})
    assert GW_KEY not in str(missing.value)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_cli_serve(
    tmp_path: Path, sim: Simulator, tls_files: tuple[str, str, trustme.CA], loop: str
) -> None:
    """``llmroute serve`` over HTTPS (HTTP/2) with DEBUG logs, on each event loop: it serves
    the official client, logs no key of either side, and exits 0 on SIGTERM."""
    import select
    import subprocess
    import sys

    if loop == "uvloop":
        pytest.importorskip("uvloop")

    config = tmp_path / "llmroute.toml"
    config.write_text(
        f"""
[providers.sim]
base_url = "{sim.base_url}"
api_key_env = "SIM_UPSTREAM_KEY"

[models.chat]
targets = ["sim:sim-small"]

[gateway]
keys = {{ ci = "GW_KEY_CI" }}
port = 0
"""
    )
    env = {
        **os.environ,
        "GW_KEY_CI": GW_KEY,
        "SIM_UPSTREAM_KEY": UPSTREAM_KEY,
        "SSL_CERT_FILE": sim.ca_pem_path,  # the simulator's CA: TLS + HTTP/2 upstream
    }
    cert, key, ca = tls_files
    command = [sys.executable, "-m", "llmroute.cli", "serve", "--config", str(config)]
    command += ["--certfile", cert, "--keyfile", key, "--log-level", "debug", "--loop", loop]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if readable else ""  # printed once it listens
        assert "listening on https://127.0.0.1:" in line, line
        url = line.split("listening on ", 1)[1].split()[0]
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        http = openai.DefaultHttpxClient(http2=True, verify=ctx)
        with openai.OpenAI(
            base_url=url, api_key=GW_KEY, max_retries=0, timeout=DEADLINE, http_client=http
        ) as client:
            raw = client.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES)
        assert raw.http_response.http_version == "HTTP/2"
        assert raw.parse().choices[0].finish_reason == "stop"
        proc.terminate()
        out, _ = proc.communicate(timeout=DEADLINE)
        logged = log_path.read_text()
        assert proc.returncode == 0, logged[-2000:]
        assert "stopped" in out
        assert "key=ci" in logged  # the request's log line names the key
        scan(out + logged)
        assert GW_KEY not in out + logged
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_cli_serve_drains_on_sigterm_and_a_second_signal_ends_the_rest(
    tmp_path: Path, sim: Simulator, slow: Simulator
) -> None:
    """``llmroute serve --drain 30s``: after SIGTERM new requests get 503 while a stream in
    flight goes on; a second SIGTERM ends it with ``gateway_shutdown``; exit status 0."""
    import select
    import signal
    import subprocess

    config = tmp_path / "llmroute.toml"
    config.write_text(
        f"""
[providers.sim]
base_url = "{sim.base_url}"
api_key_env = "SIM_UPSTREAM_KEY"

[providers.slow]
base_url = "{slow.base_url}"
api_key_env = "SIM_UPSTREAM_KEY"

[models.chat]
targets = ["sim:sim-small"]

[models.slow]
targets = ["slow:sim-small"]

[gateway]
keys = {{ ci = "GW_KEY_CI" }}
port = 0
"""
    )
    env = {
        **os.environ,
        "GW_KEY_CI": GW_KEY,
        "SIM_UPSTREAM_KEY": UPSTREAM_KEY,
        "SSL_CERT_FILE": sim.ca_pem_path,
    }
    command = [sys.executable, "-m", "llmroute.cli", "serve", "--config", str(config)]
    command += ["--drain", "30s"]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if readable else ""
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ", 1)[1].split()[0]
        with openai.OpenAI(base_url=url, api_key=GW_KEY, max_retries=0, timeout=DEADLINE) as client:
            stream = client.chat.completions.create(model="slow", messages=MESSAGES, stream=True)
            next(iter(stream))
            proc.send_signal(signal.SIGTERM)
            statuses = []
            for _ in range(100):  # the signal is handled on the gateway's loop, soon
                try:
                    client.chat.completions.create(model="chat", messages=MESSAGES)
                    statuses.append(200)
                except openai.APIStatusError as exc:
                    statuses.append(exc.status_code)
                    break
                time.sleep(0.05)
            assert statuses[-1] == 503, statuses
            assert proc.poll() is None  # still draining: the stream goes on
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(openai.APIError) as ended:
                for _ in stream:
                    pass
        assert ended.value.code == "gateway_shutdown"  # type: ignore[attr-defined]
        out, _ = proc.communicate(timeout=DEADLINE)
        logged = log_path.read_text()
        assert proc.returncode == 0, logged[-2000:]
        assert "draining 1 requests in flight" in logged
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_cli_serve_simulator_is_a_gateway_in_one_command(tmp_path: Path) -> None:
    """``llmroute serve --simulator``: the demo's three simulated providers behind the route
    'chat', with a key made for the run; the base URL and key it prints serve openai's client,
    a misspelt model is answered with the route's name, and SIGTERM stops it with status 0."""
    import select
    import subprocess
    import sys

    env = {
        k: v for k, v in os.environ.items() if k not in ("LLMROUTE_CONFIG", "LLMROUTE_GATEWAY_KEY")
    }
    command = [sys.executable, "-m", "llmroute.cli", "serve", "--simulator", "--port", "0"]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 30
        while b"Ctrl-C" not in seen:  # bounded: 30 s, and a closed pipe ends it
            left = deadline - time.monotonic()
            readable, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            chunk = os.read(proc.stdout.fileno(), 65536) if readable else b""
            assert chunk, (seen, log_path.read_text()[-2000:])
            seen += chunk
        lines = seen.decode().splitlines()
        printed = {
            name: line.split(":", 1)[1].strip()
            for line in lines
            for name in ("base URL", "key", "try")
            if line.startswith(name + ":")
        }
        url = printed["base URL"]
        key = printed["key"].split()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert "fast-but-spiky, steady-slow, flaky" in lines[1]
        assert f"Bearer {key}" in printed["try"] and "python -c" in "".join(lines)
        with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=DEADLINE) as client:
            done = client.chat.completions.create(model="chat", messages=MESSAGES)
            assert done.choices[0].finish_reason == "stop" and done.choices[0].message.content
            with pytest.raises(openai.NotFoundError, match="did you mean 'chat'"):
                client.chat.completions.create(model="caht", messages=MESSAGES)
        with openai.OpenAI(base_url=url, api_key="gw-not-it", max_retries=0) as stranger:
            with pytest.raises(openai.AuthenticationError):
                stranger.models.list()
        proc.terminate()
        out = proc.communicate(timeout=DEADLINE)[0].decode()
        logged = log_path.read_text()
        assert proc.returncode == 0, logged[-2000:]
        assert "stopped" in out
        assert key not in logged
        # Each request is logged once, by the gateway's own access line (not httpx's too).
        assert "HTTP Request:" not in logged, logged[-2000:]
        assert logged.count(" /v1/chat/completions 200 key=") == 1, logged[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_an_event_loop_that_is_unknown_or_not_installed_is_refused_by_name(
    tmp_path: Path,
    sim_h1: Simulator,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llmroute.cli import main
    from llmroute.server import loop_factory

    with pytest.raises(ValueError, match="loop: expected one of asyncio, uvloop, got 'trio'"):
        loop_factory("trio")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install uvloop"):
        Gateway(gateway_config(sim_h1, sim_h1), environ=ENVIRON, loop="uvloop")
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.sim]\nbase_url = "{sim_h1.base_url}"\napi_key = "{UPSTREAM_KEY}"\n\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n\n[gateway]\nkeys = { ci = "GW_KEY_CI" }\n'
    )
    assert main(["serve", "--config", str(config), "--port", "0", "--loop", "uvloop"]) == 2
    assert "pip install uvloop" in capsys.readouterr().err


def test_cli_serve_refuses_to_start_without_its_keys(
    tmp_path: Path, sim_h1: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmroute.cli import main

    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.sim]\nbase_url = "{sim_h1.base_url}"\napi_key = "{UPSTREAM_KEY}"\n\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n\n'
        '[gateway]\nkeys = { ci = "GW_KEY_SURELY_UNSET" }\n'
    )
    assert main(["serve", "--config", str(config), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "GW_KEY_SURELY_UNSET" in err
    scan(err)
