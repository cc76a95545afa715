"""The compatibility matrix: every endpoint, sync and async, openai's client against llmroute's.

Each snippet is ordinary application code, written once for the sync clients
(``openai.OpenAI`` / ``llmroute.OpenAI``) and once for the async ones. It gets a client and
``make(**options)`` for snippets that build their own client (``with`` blocks, keys, close).
Both libraries run it against the same simulator; the results must be identical, apart from
per-request ids and timestamps.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llmroute.testing import Simulator

from .harness import LIBS, error, make_async, make_sync, normalize, normalize_line

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
WEATHER = [{"role": "user", "content": "Weather in Paris?"}]
HEADERS = ("content-type", "x-request-id")
EMBED = "text-embedding-3-small"
INSTRUCT = "sim-instruct"  # the legacy Completions endpoint: any name


def chat_result(completion: ChatCompletion) -> Any:
    return (
        type(completion).__name__,
        isinstance(completion, ChatCompletion),
        completion.choices[0].message.content,
        normalize(completion.model_dump()),
    )


def chunk_result(chunk: ChatCompletionChunk | Completion) -> Any:
    assert isinstance(chunk, ChatCompletionChunk | Completion)
    return type(chunk).__name__, normalize(chunk.model_dump())


def embeddings_result(result: CreateEmbeddingResponse) -> Any:
    assert isinstance(result, CreateEmbeddingResponse)
    vectors = [d.embedding for d in result.data]
    return (
        type(result).__name__,
        [type(v).__name__ for v in vectors],
        result.model_dump(warnings=False),
    )


def raw_result(raw: Any) -> Any:
    return (
        raw.status_code,
        {h: bool(raw.headers.get(h)) for h in HEADERS},
        raw.headers["content-type"],
        str(raw.http_request.url),
        raw.http_request.method,
    )


# -- sync snippets ---------------------------------------------------------------------------------

SyncSnippet = Callable[[Any, Callable[..., Any]], Any]


def s_chat(client: Any, make: Any) -> Any:
    return chat_result(client.chat.completions.create(model="gpt-6-luna", messages=MESSAGES))


def s_chat_stream(client: Any, make: Any) -> Any:
    stream = client.chat.completions.create(model="gpt-6-luna", messages=MESSAGES, stream=True)
    return [chunk_result(c) for c in stream]


def s_chat_stream_usage(client: Any, make: Any) -> Any:
    stream = client.chat.completions.create(
        model="gpt-6-luna",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = [chunk_result(c) for c in stream]
    return chunks, chunks[-1][1]["usage"]


def s_chat_tools(client: Any, make: Any) -> Any:
    completion = client.chat.completions.create(
        model="gpt-6-luna",
        messages=WEATHER,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = completion.choices[0].message.tool_calls[0]
    return call.function.name, json.loads(call.function.arguments), chat_result(completion)


def s_chat_tools_stream(client: Any, make: Any) -> Any:
    stream = client.chat.completions.create(
        model="gpt-6-luna", messages=WEATHER, tools=TOOLS, stream=True
    )
    arguments, finish = "", None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            arguments += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return json.loads(arguments), finish


def s_chat_n2(client: Any, make: Any) -> Any:
    try:  # the simulator serves only n=1: both must raise the same 400
        client.chat.completions.create(model="gpt-6-luna", messages=MESSAGES, n=2)
    except openai.OpenAIError as exc:
        return error(exc)
    return "no error"


def s_completion(client: Any, make: Any) -> Any:
    return chunk_result(client.completions.create(model=INSTRUCT, prompt="Hi", max_tokens=7))


def s_completion_stream(client: Any, make: Any) -> Any:
    stream = client.completions.create(
        model=INSTRUCT, prompt=["Hi"], stream=True, stream_options={"include_usage": True}
    )
    return [chunk_result(c) for c in stream]


def s_embeddings(client: Any, make: Any) -> Any:
    default = client.embeddings.create(model=EMBED, input=["a", "b c"])
    floats = client.embeddings.create(model=EMBED, input="a", encoding_format="float")
    b64 = client.embeddings.create(model=EMBED, input="a", encoding_format="base64")
    return [embeddings_result(r) for r in (default, floats, b64)]


def s_models(client: Any, make: Any) -> Any:
    page = client.models.list()
    listed = [m.model_dump() for m in client.models.list()]
    model = client.models.retrieve("sim-small")
    try:
        client.models.retrieve("no-such-model")
    except openai.OpenAIError as exc:
        missing = error(exc)
    data = [(type(m).__name__, isinstance(m, Model), m.id) for m in page.data]
    return data, listed, model.model_dump(), missing


def s_raw(client: Any, make: Any) -> Any:
    chat = client.chat.completions.with_raw_response.create(model="sim-small", messages=MESSAGES)
    done = client.completions.with_raw_response.create(model=INSTRUCT, prompt="x")
    emb = client.embeddings.with_raw_response.create(model=EMBED, input="a")
    models = client.models.with_raw_response.list()
    return (
        [raw_result(r) for r in (chat, done, emb, models)],
        chat_result(chat.parse()),
        chunk_result(done.parse()),
        embeddings_result(emb.parse()),
        [m.id for m in models.parse()],
    )


def s_raw_stream(client: Any, make: Any) -> Any:
    raw = client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    )
    return raw_result(raw), [chunk_result(c) for c in raw.parse()]


def s_streaming_response(client: Any, make: Any) -> Any:
    with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        meta = raw_result(response)
        chunks = [chunk_result(c) for c in response.parse()]
    with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        lines = [normalize_line(line) for line in response.iter_lines()]
    with client.completions.with_streaming_response.create(model=INSTRUCT, prompt="x") as response:
        completion = chunk_result(response.parse())
    with client.embeddings.with_streaming_response.create(model=EMBED, input="a") as response:
        body = [normalize_line(line) for line in response.iter_lines()]
    with client.models.with_streaming_response.retrieve("sim-small") as response:
        model = response.parse().model_dump()
    return meta, chunks, lines, completion, body, model


def s_with_options(client: Any, make: Any) -> Any:
    copy = client.with_options(timeout=30.0, max_retries=1)
    completion = copy.chat.completions.create(model="sim-small", messages=MESSAGES)
    retried = copy.chat.completions.with_raw_response.create(
        model="sim-small",
        messages=MESSAGES,
        extra_headers={
            "x-sim-fault": "500",
            "x-sim-fault-times": "1",
            "x-sim-fault-key": uuid.uuid4().hex,
        },
    )
    return chat_result(completion), retried.retries_taken, chat_result(retried.parse())


def s_with_block_and_close(client: Any, make: Any) -> Any:
    with make() as own:
        inside = own.chat.completions.create(model="sim-small", messages=MESSAGES)
    other = make()
    text = other.chat.completions.create(model="sim-small", messages=MESSAGES)
    other.close()
    return chat_result(inside), chat_result(text)


def s_closed_state(client: Any, make: Any) -> Any:
    other = make()
    before = other.is_closed()
    other.close()
    return before, other.is_closed()


def sync_error(
    fault: str | None = None, stream: bool = False, headers: Any = None, **options: Any
) -> SyncSnippet:
    def run(client: Any, make: Any) -> Any:
        sent = {"x-sim-fault": fault} if fault else dict(headers or {})
        own = None
        try:
            if options:
                client = own = make(**options)
            client = client.with_options(max_retries=0)
            result = client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=stream, extra_headers=sent
            )
            for _ in result if stream else ():
                pass
        except openai.OpenAIError as exc:
            return error(exc)
        finally:
            if own is not None:
                own.close()
        return "no error"

    return run


def s_missing_model(client: Any, make: Any) -> Any:
    try:
        client.with_options(max_retries=0).models.retrieve("gpt-nope")
    except openai.NotFoundError as exc:
        return error(exc)
    return "no error"


def sync_no_key(api_key: str | None, message: bool = False) -> SyncSnippet:
    def run(client: Any, make: Any) -> Any:
        try:
            make(api_key=api_key).close()
        except openai.OpenAIError as exc:
            return error(exc) if message else error(exc)[:2]
        return "no error"

    return run


# -- async snippets --------------------------------------------------------------------------------

AsyncSnippet = Callable[[Any, Callable[..., Any]], Awaitable[Any]]


async def a_chat(client: Any, make: Any) -> Any:
    return chat_result(await client.chat.completions.create(model="gpt-6-luna", messages=MESSAGES))


async def a_chat_stream(client: Any, make: Any) -> Any:
    stream = await client.chat.completions.create(
        model="gpt-6-luna", messages=MESSAGES, stream=True
    )
    return [chunk_result(c) async for c in stream]


async def a_chat_stream_usage(client: Any, make: Any) -> Any:
    stream = await client.chat.completions.create(
        model="gpt-6-luna",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    async with stream:
        chunks = [chunk_result(c) async for c in stream]
    return chunks, chunks[-1][1]["usage"]


async def a_chat_tools(client: Any, make: Any) -> Any:
    completion = await client.chat.completions.create(
        model="gpt-6-luna",
        messages=WEATHER,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = completion.choices[0].message.tool_calls[0]
    return call.function.name, json.loads(call.function.arguments), chat_result(completion)


async def a_chat_tools_stream(client: Any, make: Any) -> Any:
    stream = await client.chat.completions.create(
        model="gpt-6-luna", messages=WEATHER, tools=TOOLS, stream=True
    )
    arguments, finish = "", None
    async for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            arguments += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return json.loads(arguments), finish


async def a_chat_n2(client: Any, make: Any) -> Any:
    try:
        await client.chat.completions.create(model="gpt-6-luna", messages=MESSAGES, n=2)
    except openai.OpenAIError as exc:
        return error(exc)
    return "no error"


async def a_completion(client: Any, make: Any) -> Any:
    return chunk_result(await client.completions.create(model=INSTRUCT, prompt="Hi", max_tokens=7))


async def a_completion_stream(client: Any, make: Any) -> Any:
    stream = await client.completions.create(
        model=INSTRUCT, prompt=["Hi"], stream=True, stream_options={"include_usage": True}
    )
    return [chunk_result(c) async for c in stream]


async def a_embeddings(client: Any, make: Any) -> Any:
    default = await client.embeddings.create(model=EMBED, input=["a", "b c"])
    floats = await client.embeddings.create(model=EMBED, input="a", encoding_format="float")
    b64 = await client.embeddings.create(model=EMBED, input="a", encoding_format="base64")
    return [embeddings_result(r) for r in (default, floats, b64)]


async def a_models(client: Any, make: Any) -> Any:
    page = await client.models.list()
    listed = [m.model_dump() async for m in client.models.list()]
    model = await client.models.retrieve("sim-small")
    try:
        await client.models.retrieve("no-such-model")
    except openai.OpenAIError as exc:
        missing = error(exc)
    data = [(type(m).__name__, isinstance(m, Model), m.id) for m in page.data]
    return data, listed, model.model_dump(), missing


async def a_raw(client: Any, make: Any) -> Any:
    chat = await client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES
    )
    done = await client.completions.with_raw_response.create(model=INSTRUCT, prompt="x")
    emb = await client.embeddings.with_raw_response.create(model=EMBED, input="a")
    models = await client.models.with_raw_response.list()
    return (
        [raw_result(r) for r in (chat, done, emb, models)],
        chat_result(chat.parse()),
        chunk_result(done.parse()),
        embeddings_result(emb.parse()),
        [m.id for m in models.parse().data],
    )


async def a_raw_stream(client: Any, make: Any) -> Any:
    raw = await client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    )
    return raw_result(raw), [chunk_result(c) async for c in raw.parse()]


async def a_streaming_response(client: Any, make: Any) -> Any:
    async with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        meta = raw_result(response)
        chunks = [chunk_result(c) async for c in await response.parse()]
    async with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        lines = [normalize_line(line) async for line in response.iter_lines()]
    async with client.completions.with_streaming_response.create(
        model=INSTRUCT, prompt="x"
    ) as response:
        completion = chunk_result(await response.parse())
    async with client.embeddings.with_streaming_response.create(model=EMBED, input="a") as response:
        body = [normalize_line(line) async for line in response.iter_lines()]
    async with client.models.with_streaming_response.retrieve("sim-small") as response:
        model = (await response.parse()).model_dump()
    return meta, chunks, lines, completion, body, model


async def a_with_options(client: Any, make: Any) -> Any:
    copy = client.with_options(timeout=30.0, max_retries=1)
    completion = await copy.chat.completions.create(model="sim-small", messages=MESSAGES)
    retried = await copy.chat.completions.with_raw_response.create(
        model="sim-small",
        messages=MESSAGES,
        extra_headers={
            "x-sim-fault": "500",
            "x-sim-fault-times": "1",
            "x-sim-fault-key": uuid.uuid4().hex,
        },
    )
    return chat_result(completion), retried.retries_taken, chat_result(retried.parse())


async def a_with_block_and_close(client: Any, make: Any) -> Any:
    async with make() as own:
        inside = await own.chat.completions.create(model="sim-small", messages=MESSAGES)
    other = make()
    text = await other.chat.completions.create(model="sim-small", messages=MESSAGES)
    await other.close()
    return chat_result(inside), chat_result(text)


async def a_closed_state(client: Any, make: Any) -> Any:
    other = make()
    before = other.is_closed()
    await other.close()
    return before, other.is_closed()


def async_error(
    fault: str | None = None, stream: bool = False, headers: Any = None, **options: Any
) -> AsyncSnippet:
    async def run(client: Any, make: Any) -> Any:
        sent = {"x-sim-fault": fault} if fault else dict(headers or {})
        own = None
        try:
            if options:
                client = own = make(**options)
            client = client.with_options(max_retries=0)
            result = await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=stream, extra_headers=sent
            )
            if stream:
                async for _ in result:
                    pass
        except openai.OpenAIError as exc:
            return error(exc)
        finally:
            if own is not None:
                await own.close()
        return "no error"

    return run


async def a_missing_model(client: Any, make: Any) -> Any:
    try:
        await client.with_options(max_retries=0).models.retrieve("gpt-nope")
    except openai.NotFoundError as exc:
        return error(exc)
    return "no error"


def async_no_key(api_key: str | None, message: bool = False) -> AsyncSnippet:
    async def run(client: Any, make: Any) -> Any:
        try:
            await make(api_key=api_key).close()
        except openai.OpenAIError as exc:
            return error(exc) if message else error(exc)[:2]
        return "no error"

    return run


# -- the matrix ------------------------------------------------------------------------------------

# name: (sync snippet, async snippet, marks)
MATRIX: dict[str, tuple[SyncSnippet, AsyncSnippet, tuple[Any, ...]]] = {
    "chat": (s_chat, a_chat, ()),
    "chat_stream": (s_chat_stream, a_chat_stream, ()),
    "chat_stream_include_usage": (s_chat_stream_usage, a_chat_stream_usage, ()),
    "chat_tools": (s_chat_tools, a_chat_tools, ()),
    "chat_tools_stream": (s_chat_tools_stream, a_chat_tools_stream, ()),
    "chat_n2_rejected": (s_chat_n2, a_chat_n2, ()),
    "completion": (s_completion, a_completion, ()),
    "completion_stream": (s_completion_stream, a_completion_stream, ()),
    "embeddings": (s_embeddings, a_embeddings, ()),
    "models": (s_models, a_models, ()),
    "raw_response": (s_raw, a_raw, ()),
    "raw_response_stream": (s_raw_stream, a_raw_stream, ()),
    "streaming_response": (s_streaming_response, a_streaming_response, ()),
    "with_options": (s_with_options, a_with_options, ()),
    "with_block_and_close": (s_with_block_and_close, a_with_block_and_close, ()),
    "is_closed": (s_closed_state, a_closed_state, ()),
    "error_401_no_authorization": (
        sync_error(headers={"Authorization": openai.omit}),
        async_error(headers={"Authorization": openai.omit}),
        (),
    ),
    "error_whitespace_key": (
        sync_error(api_key=" "),
        async_error(api_key=" "),
        (),
    ),
    "error_missing_key": (sync_no_key(None), async_no_key(None), ()),
    "error_blank_key": (
        sync_no_key(""),
        async_no_key(""),
        (),
    ),
    "error_missing_key_message": (
        sync_no_key(None, message=True),
        async_no_key(None, message=True),
        (),
    ),
    "error_404_model": (s_missing_model, a_missing_model, ()),
    "error_429": (sync_error("429"), async_error("429"), ()),
    "error_429_stream": (sync_error("429", stream=True), async_error("429", stream=True), ()),
    "error_500": (sync_error("500"), async_error("500"), ()),
}


def cases(mode: str) -> list[Any]:
    index = 0 if mode == "sync" else 1
    return [
        pytest.param(snippets[index], id=name, marks=snippets[2])
        for name, snippets in MATRIX.items()
    ]


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("LLMROUTE_CONFIG", raising=False)


@pytest.mark.usefixtures("no_env_key")
@pytest.mark.parametrize("snippet", cases("sync"))
def test_sync(sim: Simulator, snippet: SyncSnippet) -> None:
    results = []
    for lib in LIBS:
        make = partial(make_sync, lib, sim)
        with make() as client:
            results.append(snippet(client, make))
    expected, actual = results
    assert expected != "no error"  # every error snippet provokes one
    assert actual == expected


@pytest.mark.anyio
@pytest.mark.usefixtures("no_env_key")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # openai's client is the reference
@pytest.mark.parametrize("snippet", cases("async"))
async def test_async(sim: Simulator, snippet: AsyncSnippet) -> None:
    results = []
    for lib in LIBS:
        make = partial(make_async, lib, sim)
        async with make() as client:
            results.append(await snippet(client, make))
    expected, actual = results
    assert expected != "no error"  # every error snippet provokes one
    assert actual == expected
