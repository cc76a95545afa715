"""Completions, embeddings, models, and raw/streamed responses on every resource."""

from __future__ import annotations

import base64
import json
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai._legacy_response import LegacyAPIResponse
from openai._response import AsyncAPIResponse
from openai.pagination import AsyncPage
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import llmroute
from llmroute.protocols.openai import parse_body
from llmroute.testing import Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Name three colours."}]
VOLATILE = {"id", "created", "system_fingerprint"}


@pytest.fixture
async def client(sim: Simulator) -> AsyncIterator[llmroute.AsyncOpenAI]:
    c = llmroute.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context())
    try:
        yield c
    finally:
        await c.close()


def sent(sim: Simulator, marker: str) -> dict[str, Any]:
    """The JSON body of the simulator's recorded request carrying ``marker``."""
    for request in reversed(sim.last_requests):
        body = request["json"]
        if isinstance(body, dict) and body.get("marker") == marker:
            return body
    raise AssertionError(f"no request with marker {marker}")


# -- completions ---------------------------------------------------------------------------------


async def test_completion(client: llmroute.AsyncOpenAI, sim: Simulator) -> None:
    marker = uuid.uuid4().hex
    result = await client.completions.create(
        model="sim-small", prompt="Say hi", max_tokens=5, extra_body={"marker": marker}, best_of=1
    )
    assert isinstance(result, Completion)
    assert len(result.choices[0].text.split()) == 5
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and result.usage.completion_tokens == 5
    assert result._request_id is not None and result._request_id.startswith("req_")
    body = sent(sim, marker)
    assert body["best_of"] == 1 and "stream" not in body  # passed through, nothing added
    again = await client.completions.create(model="sim-small", prompt="Say hi", max_tokens=5)
    assert again.choices[0].text == result.choices[0].text  # deterministic


async def test_completion_stream(client: llmroute.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="sim-small", prompt="Stream it")
    stream = await client.completions.create(
        model="sim-small", prompt="Stream it", stream=True, stream_options={"include_usage": True}
    )
    assert isinstance(stream, openai.AsyncStream)  # openai's own decoding for legacy completions
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(c, Completion) for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20


async def test_completion_error_is_openai_error(client: llmroute.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model="sim-small", prompt=None)
    assert "prompt" in info.value.message


async def test_completion_for_a_route_goes_to_its_first_target(
    client: llmroute.AsyncOpenAI, sim: Simulator
) -> None:
    client.add_provider("gpu", {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY})
    client.add_targets("routed", ["gpu:sim-large", "gpu:sim-small"])
    marker = uuid.uuid4().hex
    result = await client.completions.create(
        model="routed", prompt="x", extra_body={"marker": marker}
    )
    assert result.model == "sim-large"
    assert sent(sim, marker)["model"] == "sim-large"
    embedded = await client.embeddings.create(model="routed", input="x")
    assert embedded.model == "sim-large"


# -- embeddings ----------------------------------------------------------------------------------


async def test_embeddings_default_base64_decoded(
    client: llmroute.AsyncOpenAI, sim: Simulator
) -> None:
    marker = uuid.uuid4().hex
    result = await client.embeddings.create(
        model="emb", input=["one two", "three"], extra_body={"marker": marker}
    )
    assert isinstance(result, CreateEmbeddingResponse)
    assert sent(sim, marker)["encoding_format"] == "base64"
    floats = await client.embeddings.create(model="emb", input=["one two", "three"], dimensions=8)
    assert [e.embedding for e in result.data] == [e.embedding for e in floats.data]
    assert all(isinstance(v, float) for v in result.data[0].embedding)
    assert result.usage.prompt_tokens == 3


async def test_llmroute_options_never_go_upstream_on_a_plain_model(
    client: llmroute.AsyncOpenAI, sim: Simulator
) -> None:
    """openai's own path (a model that is not a route, an endpoint llmroute does not route)
    sends no ``llmroute`` options either; a ``tier`` there is refused, naming it."""
    marker = uuid.uuid4().hex
    own = {"marker": marker, "llmroute": {"ttft_target_ms": 300}}
    await client.embeddings.create(model="emb", input="x", extra_body=own)
    assert "llmroute" not in sent(sim, marker)
    chat_marker = uuid.uuid4().hex
    body = {"model": "sim-small", "messages": [{"role": "user", "content": "hi"}]}
    await client.post(
        "/chat/completions",
        body={**body, "marker": chat_marker, "llmroute": {"ttft_target_ms": 300}},
        cast_to=httpx.Response,
    )
    assert "llmroute" not in sent(sim, chat_marker)
    refused = uuid.uuid4().hex
    with pytest.raises(
        openai.BadRequestError, match=r"llmroute\.tier: model .emb. is not a tiered model name"
    ) as caught:
        await client.embeddings.create(
            model="emb", input="x", extra_body={"marker": refused, "llmroute": {"tier": "hard"}}
        )
    assert caught.value.body["param"] == "llmroute.tier"  # type: ignore[index]
    with pytest.raises(AssertionError):
        sent(sim, refused)


async def test_embeddings_float_and_base64_as_asked(client: llmroute.AsyncOpenAI) -> None:
    floats = await client.embeddings.create(
        model="emb", input="hello", encoding_format="float", dimensions=4
    )
    raw = await client.embeddings.create(model="emb", input="hello", encoding_format="base64")
    assert len(floats.data[0].embedding) == 4
    encoded = raw.data[0].embedding
    assert isinstance(encoded, str)  # returned untouched
    data = base64.b64decode(encoded)
    decoded = list(struct.unpack(f"<{len(data) // 4}f", data))
    assert len(decoded) == 8  # the default dimensions
    assert decoded[:4] == floats.data[0].embedding  # the same little-endian float32 values


# -- models --------------------------------------------------------------------------------------


async def test_models_list_awaitable_and_iterable(client: llmroute.AsyncOpenAI) -> None:
    page = await client.models.list()
    assert isinstance(page, AsyncPage)
    ids = [m.id for m in page.data]
    assert "sim-small" in ids and all(isinstance(m, Model) for m in page.data)
    assert [m.id async for m in client.models.list()] == ids
    assert [m.id async for m in page] == ids


async def test_models_retrieve(client: llmroute.AsyncOpenAI) -> None:
    model = await client.models.retrieve("sim-small")
    assert isinstance(model, Model) and model.id == "sim-small"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")
    with pytest.raises(ValueError):
        await client.models.retrieve("")


def test_unknown_response_fields_survive() -> None:
    request = httpx.Request("GET", "https://x/v1/models/m")
    raw = b'{"id": "m", "object": "model", "created": 1, "owned_by": "o", "vendor_x": [1]}'
    model = parse_body(raw, Model, request=request, target="x")
    assert model.model_dump()["vendor_x"] == [1]
    with pytest.raises(llmroute.APIResponseValidationError):
        parse_body(b"{oops", Model, request=request, target="x")


# -- raw and streamed responses ------------------------------------------------------------------


async def test_raw_response_chat(client: llmroute.AsyncOpenAI) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES
    )
    assert isinstance(raw, LegacyAPIResponse)
    assert raw.status_code == 200 and raw.headers["x-request-id"] == raw.request_id
    assert raw.http_request.url.path == "/v1/chat/completions" and raw.method == "POST"
    completion = raw.parse()
    assert isinstance(completion, ChatCompletion) and completion.choices[0].message.content
    assert raw.retries_taken == 0
    stream_raw = await client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    )
    stream = stream_raw.parse()
    assert isinstance(stream, llmroute.AsyncStream)
    chunks = [c async for c in stream]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)


async def test_raw_response_other_resources(client: llmroute.AsyncOpenAI) -> None:
    completion = await client.completions.with_raw_response.create(model="sim-small", prompt="x")
    assert isinstance(completion.parse(), Completion)
    assert completion.http_request.url.path == "/v1/completions"
    embeddings = await client.embeddings.with_raw_response.create(model="emb", input="x")
    assert isinstance(embeddings.parse().data[0].embedding, list)
    listed = await client.models.with_raw_response.list()
    assert listed.http_request.method == "GET" and isinstance(listed.parse(), AsyncPage)
    model = await client.models.with_raw_response.retrieve("sim-small")
    assert model.parse().id == "sim-small"
    assert model.parse(to=dict[str, Any])["id"] == "sim-small"  # type: ignore[type-abstract]


async def test_raw_response_on_a_route_is_openais_raw_response(
    client: llmroute.AsyncOpenAI, sim: Simulator
) -> None:
    """Embeddings and completions on a route, through ``with_raw_response``, are openai's
    ``LegacyAPIResponse`` as for a plain model (they were the parsed result), async and sync."""
    client.add_provider("gpu", {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY})
    client.add_targets("routed", ["gpu:sim-small"])
    embeddings = await client.embeddings.with_raw_response.create(model="routed", input="x")
    assert isinstance(embeddings, LegacyAPIResponse)
    assert isinstance(embeddings.parse(), CreateEmbeddingResponse)
    assert embeddings.status_code == 200 and embeddings.parse().model == "sim-small"
    completion = await client.completions.with_raw_response.create(model="routed", prompt="x")
    assert isinstance(completion, LegacyAPIResponse)
    assert isinstance(completion.parse(), Completion)
    config = {
        "providers": {"gpu": {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY}},
        "models": {"routed": {"targets": ["gpu:sim-small"]}},
    }
    with llmroute.OpenAI(config=config, verify=sim.ssl_context()) as sync:
        raw = sync.embeddings.with_raw_response.create(model="routed", input="x")
        assert isinstance(raw, LegacyAPIResponse)
        assert isinstance(raw.parse(), CreateEmbeddingResponse)


async def test_streaming_response_chat(client: llmroute.AsyncOpenAI) -> None:
    async with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        assert isinstance(response, AsyncAPIResponse)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert response.is_closed
    async with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        stream = await response.parse()
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert len(text.split()) == 20
    async with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES
    ) as response:
        completion = await response.parse()
        assert completion.choices[0].message.content == text
        assert (await response.json())["object"] == "chat.completion"  # type: ignore[index]


async def test_streaming_response_of_a_route_reads_the_whole_body(
    client: llmroute.AsyncOpenAI, sim: Simulator
) -> None:
    """A routed stream read raw has every event the vendor sent, from the role chunk on: the
    routing reads up to the first token before the caller gets the response, and gives those
    chunks back (they were missing: the role and first content events)."""
    client.add_provider("gpu", {"kind": "sglang", "base_url": sim.base_url, "api_key": KEY})
    client.add_targets("routed", ["gpu:sim-small"])
    async with client.chat.completions.with_streaming_response.create(
        model="routed", messages=MESSAGES, stream=True
    ) as response:
        routed = [line async for line in response.iter_lines() if line]
    assert '"role":"assistant"' in routed[0].replace(" ", "")
    assert routed[-1] == "data: [DONE]"
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in routed[:-1]
        if json.loads(line[6:])["choices"]
    )
    assert len(text.split()) == 20


async def test_streaming_response_other_resources(client: llmroute.AsyncOpenAI) -> None:
    async with client.completions.with_streaming_response.create(
        model="sim-small", prompt="x", stream=True
    ) as response:
        stream = await response.parse()
        chunks = [c async for c in stream]
    assert all(isinstance(c, Completion) for c in chunks)
    async with client.embeddings.with_streaming_response.create(model="emb", input="x") as resp:
        assert len((await resp.parse()).data[0].embedding) == 8
        assert "data" in await resp.text()
    async with client.models.with_streaming_response.list() as resp:
        assert (await resp.parse()).data
    async with client.models.with_streaming_response.retrieve("sim-small") as resp:
        assert b"sim-small" in await resp.read()


async def test_resources_of_a_copy_use_its_options(
    client: llmroute.AsyncOpenAI, sim: Simulator
) -> None:
    copy = client.with_options(api_key="sk-the-copys-own")
    await copy.embeddings.create(model="emb", input="x")
    headers = {k.lower(): v for k, v in sim.last_requests[-1]["headers"].items()}
    assert headers["authorization"] == "Bearer sk-the-copys-own"
    await client.embeddings.create(model="emb", input="x")
    headers = {k.lower(): v for k, v in sim.last_requests[-1]["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEY}"


# -- the same snippets with openai's client --------------------------------------------------------


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


async def completion_snippet(client: Any) -> Any:
    result = await client.completions.create(model="sim-instruct", prompt="Hi", n=1)
    return type(result).__name__, normalize(result.model_dump())


async def completion_stream_snippet(client: Any) -> Any:
    stream = await client.completions.create(
        model="sim-instruct",
        prompt=["Hi"],
        stream=True,
        stream_options={"include_usage": True},
    )
    return [(type(c).__name__, normalize(c.model_dump())) async for c in stream]


async def embeddings_snippet(client: Any) -> Any:
    default = await client.embeddings.create(model="text-embedding-3-small", input=["a", "b c"])
    floats = await client.embeddings.create(
        model="text-embedding-3-small", input="a", encoding_format="float", dimensions=3
    )
    b64 = await client.embeddings.create(
        model="text-embedding-3-small", input="a", encoding_format="base64"
    )
    return [type(r).__name__ + repr(r.model_dump(warnings=False)) for r in (default, floats, b64)]


async def models_snippet(client: Any) -> Any:
    page = await client.models.list()
    listed = [m.model_dump() async for m in client.models.list()]
    model = await client.models.retrieve("sim-small")
    try:
        await client.models.retrieve("no-such-model")
    except openai.APIStatusError as exc:
        error = (type(exc).__name__, exc.status_code, exc.message)
    return type(page).__name__, [m.id for m in page.data], listed, model.model_dump(), error


async def raw_snippet(client: Any) -> Any:
    raw = await client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES
    )
    embeddings = await client.embeddings.with_raw_response.create(model="emb", input="a")
    return (
        raw.status_code,
        raw.headers["content-type"],
        str(raw.http_request.url),
        raw.http_request.method,
        normalize(raw.parse().model_dump()),
        embeddings.parse().data[0].embedding,
    )


async def streaming_response_snippet(client: Any) -> Any:
    async with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        status = response.status_code
        stream = await response.parse()
        chunks = [normalize(c.model_dump()) async for c in stream]
    async with client.completions.with_streaming_response.create(
        model="sim-small", prompt="x"
    ) as response:
        completion = normalize((await response.parse()).model_dump())
        body = normalize(await response.json())
    return status, chunks, completion, body


SNIPPETS = {
    "completion": completion_snippet,
    "completion_stream": completion_stream_snippet,
    "embeddings": embeddings_snippet,
    "models": models_snippet,
    "raw": raw_snippet,
    "streaming_response": streaming_response_snippet,
}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # openai's client is the reference
@pytest.mark.parametrize("name", sorted(SNIPPETS))
async def test_same_results_as_openai(sim: Simulator, name: str) -> None:
    reference = openai.AsyncOpenAI(
        api_key=KEY,
        base_url=sim.base_url,
        http_client=openai.DefaultAsyncHttpxClient(verify=sim.ssl_context()),
    )
    ours = llmroute.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context())
    try:
        expected = await SNIPPETS[name](reference)
        actual = await SNIPPETS[name](ours)
    finally:
        await reference.close()
        await ours.close()
    assert actual == expected


def test_completion_chunks_built_as_openai_builds_them() -> None:
    from openai._models import construct_type

    from llmroute.protocols.openai import CompletionStreamDecoder

    request = httpx.Request("POST", "https://x/v1/completions")
    chunk = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": " hi", "logprobs": None, "finish_reason": None}],
        "vendor_x": {"a": 1},
    }
    decoder = CompletionStreamDecoder(request=request, target="x")
    data = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
    (ours,) = decoder.feed(data)
    expected = construct_type(type_=Completion, value=chunk)
    assert ours == expected and ours.model_extra == {"vendor_x": {"a": 1}}
    assert decoder.done and decoder.text == " hi" and decoder.tokens == 1
