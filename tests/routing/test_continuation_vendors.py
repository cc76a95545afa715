"""Continuation per vendor: a stream that breaks on one target is continued on a target that
behaves as its vendor documents, and the caller gets the answer exactly once, with no seam.

The first target is a plain simulator whose stream breaks after a few tokens (``drop:K``, sent
only to it through its provider's headers); the continuing target is a simulator configured as
the vendor (``Profile``): Mistral begins its answer with the prefix it was given and rejects
fields it does not know with 422; DeepSeek V4 thinks first unless asked not to. Every
assertion compares the whole text received with the uncut answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmroute import AsyncOpenAI, StreamInterrupted
from llmroute._catalog import load_catalog
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Continue me on another vendor."}
]
WORDS = 24
CUT = 3
"""Deltas the first target delivers before its stream breaks (one word each)."""
MISTRAL_FIELDS = (
    # Mistral's chat completion request (its OpenAPI ChatCompletionRequest, as the clients
    # generated from it list the fields); anything else is 422 extra_forbidden.
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "stream",
    "stop",
    "random_seed",
    "response_format",
    "tools",
    "tool_choice",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "prediction",
    "parallel_tool_calls",
    "prompt_mode",
    "safe_prompt",
    "prompt_cache_key",
    "metadata",
)
THINKING_OFF = {"thinking": {"type": "disabled"}}


@pytest.fixture(scope="module")
def plain() -> Iterator[Simulator]:
    """The target that breaks (and a vendor that neither echoes nor thinks)."""
    with Simulator(profile=Profile(reply_tokens=WORDS), tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def mistral() -> Iterator[Simulator]:
    """Mistral: the prefix repeated at the start of the answer (two words a delta, so the
    echo ends inside a delta), ``prefix: true`` required, unknown fields answered 422."""
    profile = Profile(
        reply_tokens=WORDS,
        tokens_per_chunk=2,
        echo_prefix=True,
        prefix_flag="prefix",
        accepted_fields=MISTRAL_FIELDS,
    )
    with Simulator(profile=profile, tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def deepseek() -> Iterator[Simulator]:
    """DeepSeek V4: five words of reasoning before every answer unless thinking is disabled."""
    profile = Profile(
        reply_tokens=WORDS, reasoning_tokens=5, thinking_off=THINKING_OFF, prefix_flag="prefix"
    )
    with Simulator(profile=profile, tls=True) as server:
        yield server


def breaking(sim: Simulator) -> dict[str, Any]:
    """The first target: its streams break after ``CUT`` deltas; it continues nothing."""
    headers = {"x-sim-fault": f"drop:{CUT}"}
    return {"base_url": sim.base_url, "api_key": KEY, "headers": headers, "continuation": False}


def vendor(kind: str, sim: Simulator, **fields: Any) -> dict[str, Any]:
    """A catalog vendor (its own ``[continuation]`` table) served by ``sim``."""
    return {"kind": kind, "base_url": sim.base_url, "api_key": KEY, **fields}


def deepseek_continuation(sim: Simulator) -> dict[str, Any]:
    """DeepSeek's catalog continuation, with its beta base URL pointed at ``sim``."""
    spec = load_catalog()["deepseek"].continuation
    assert spec is not None
    return {**spec.model_dump(), "base_url": sim.base_url}


def config(**providers: dict[str, Any]) -> dict[str, Any]:
    names = list(providers)
    return {
        "providers": providers,
        "models": {"chat": {"targets": [f"{n}:sim-small" for n in names], "policy": "failover"}},
        "routing": {"explore": 0},
    }


async def whole(sim: Simulator) -> str:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        done = await c.chat.completions.create(model="sim-small", messages=MESSAGES)
    return done.choices[0].message.content or ""


async def routed(conf: dict[str, Any], sim: Simulator, **kwargs: Any) -> tuple[Any, str, list[Any]]:
    """Stream one routed request: the stream, the text received and the chunks."""
    chunks: list[Any] = []
    async with AsyncOpenAI(config=conf, verify=sim.ssl_context()) as client:
        with anyio.fail_after(30):  # a hang guard only
            stream: Any = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, **kwargs
            )
            async for chunk in stream:
                chunks.append(chunk)
    return stream, content_of(chunks), chunks


async def interrupted(
    conf: dict[str, Any], sim: Simulator, **kwargs: Any
) -> tuple[Any, list[Any], StreamInterrupted]:
    """Stream one routed request that must end in StreamInterrupted: the stream, the chunks
    received before it, and the error."""
    received: list[Any] = []
    async with AsyncOpenAI(config=conf, verify=sim.ssl_context()) as client:
        with anyio.fail_after(30):  # a hang guard only
            stream: Any = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, **kwargs
            )
            with pytest.raises(StreamInterrupted) as broke:
                async for chunk in stream:
                    received.append(chunk)
    return stream, received, broke.value


def content_of(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def reasoning_in(chunks: list[Any]) -> list[Any]:
    """The deltas that carry reasoning (none may reach the caller from a continuation)."""
    return [
        c.choices[0].delta
        for c in chunks
        if c.choices
        and c.choices[0].delta.model_extra
        and (
            c.choices[0].delta.model_extra.get("reasoning_content")
            or c.choices[0].delta.model_extra.get("reasoning")
        )
    ]


def chat_requests(sim: Simulator) -> list[dict[str, Any]]:
    return [r["json"] for r in sim.last_requests if r["path"] == "/v1/chat/completions"]


def words(text: str, n: int) -> str:
    """The first ``n`` words of ``text`` as the simulator streams them (spaces leading)."""
    parts = text.split(" ")
    return " ".join(parts[:n])


# -- the simulator behaves as each vendor documents ---------------------------------------------


async def test_the_simulators_behave_as_the_vendors_document(
    plain: Simulator, mistral: Simulator, deepseek: Simulator
) -> None:
    full = await whole(plain)
    prefix = words(full, CUT)
    prefill: list[Any] = [*MESSAGES, {"role": "assistant", "content": prefix, "prefix": True}]
    async with AsyncOpenAI(
        api_key=KEY, base_url=mistral.base_url, verify=mistral.ssl_context()
    ) as c:
        # Mistral: the answer begins with the prefix (its guide strips it with [len(prefix):]).
        done = await c.chat.completions.create(model="sim-small", messages=prefill)
        assert done.choices[0].message.content == full
        bare = [*MESSAGES, {"role": "assistant", "content": prefix}]
        with pytest.raises(Exception) as refused:  # a trailing assistant without prefix: 400
            await c.chat.completions.create(model="sim-small", messages=bare)
        assert getattr(refused.value, "status_code", None) == 400
        with pytest.raises(Exception) as unknown:  # an OpenAI field Mistral does not have: 422
            await c.chat.completions.create(model="sim-small", messages=MESSAGES, seed=1)
        assert getattr(unknown.value, "status_code", None) == 422
        assert "extra_forbidden" in str(getattr(unknown.value, "body", ""))
    async with AsyncOpenAI(
        api_key=KEY, base_url=deepseek.base_url, verify=deepseek.ssl_context()
    ) as c:
        stream = await c.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
        assert len(reasoning_in(chunks)) == 5 and content_of(chunks) == full  # thinks first
        stream = await c.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True, extra_body=THINKING_OFF
        )
        chunks = [chunk async for chunk in stream]
        assert reasoning_in(chunks) == [] and content_of(chunks) == full


# -- Mistral: the echoed prefix ----------------------------------------------------------------


async def test_a_break_continued_on_mistral_gives_the_answer_once(
    plain: Simulator, mistral: Simulator
) -> None:
    full = await whole(plain)
    conf = config(a=breaking(plain), b=vendor("mistral", mistral))
    stream, text, _ = await routed(
        conf, plain, max_tokens=100, stream_options={"include_usage": True}
    )
    assert text == full
    assert stream.route.continued_on == ["b:sim-small"]
    sent = chat_requests(mistral)[-1]
    prefix = words(full, CUT)
    assert sent["messages"][-1] == {"role": "assistant", "content": prefix, "prefix": True}
    assert sent["max_tokens"] == 100 - CUT
    assert set(sent) <= set(MISTRAL_FIELDS)  # no stream_options: Mistral's schema has none


async def test_without_echoes_prefix_mistral_would_repeat_the_text(
    plain: Simulator, mistral: Simulator
) -> None:
    # What the catalog's echoes_prefix prevents: the prefix sent to the caller twice.
    full = await whole(plain)
    spec = {"message": {"prefix": True}}
    conf = config(a=breaking(plain), b=vendor("mistral", mistral, continuation=spec))
    _, text, _ = await routed(conf, plain)
    assert text == words(full, CUT) + full


async def test_a_continuation_that_does_not_echo_as_documented_is_a_break(
    plain: Simulator,
) -> None:
    # A vendor said to echo whose answer does not begin with the prefix: nothing of it is
    # spliced in; the caller gets the text so far and StreamInterrupted, never a wrong answer.
    full = await whole(plain)
    conf = config(a=breaking(plain), b=vendor("mistral", plain))  # plain: it does not echo
    stream, received, broke = await interrupted(conf, plain)
    prefix = words(full, CUT)
    assert content_of(received) == prefix
    assert broke.partial_text == prefix
    outcomes = [(a.target, a.outcome) for a in stream.route.attempts]
    assert outcomes == [("a:sim-small", "interrupted"), ("b:sim-small", "interrupted")]
    assert "did not begin with the text so far" in (stream.route.attempts[1].error or "")
    assert "the continuation on b:sim-small did not begin" in str(broke)


async def test_an_echo_the_vendor_counts_in_its_usage_never_ends_the_answer_early() -> None:
    # Whether Mistral's completion_tokens counts the prefix it echoes is not documented. Where
    # a vendor's usage does, trusting it would take the echo for answer tokens: an answer
    # continued close to max_tokens would end early with finish_reason "length". The deltas
    # count such an attempt instead (a lower bound), so the whole answer arrives, as "stop".
    profile = Profile(
        reply_tokens=WORDS,
        tokens_per_chunk=2,
        echo_prefix=True,
        echo_counted=True,
        prefix_flag="prefix",
    )
    with (
        Simulator(profile=Profile(reply_tokens=WORDS), tls=True) as plain,
        Simulator(profile=profile, tls=True) as counting,
    ):
        full = await whole(plain)
        b = vendor("mistral", counting, stream_usage=True)  # usage asked of it, and counted
        conf = config(a=breaking(plain), b=b)
        stream, text, chunks = await routed(
            conf, plain, max_tokens=WORDS, stream_options={"include_usage": True}
        )
        sent = chat_requests(counting)[-1]
    assert sent["stream_options"]["include_usage"] is True
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("length") == 0
    assert stream.route.continued_on == ["b:sim-small"]


# -- DeepSeek V4: thinking by default ------------------------------------------------------------


async def test_a_break_continued_on_deepseek_asks_it_not_to_think(
    plain: Simulator, deepseek: Simulator
) -> None:
    full = await whole(plain)
    b = vendor("deepseek", deepseek, continuation=deepseek_continuation(deepseek))
    stream, text, chunks = await routed(config(a=breaking(plain), b=b), plain)
    assert text == full
    assert reasoning_in(chunks) == []
    assert stream.route.continued_on == ["b:sim-small"]
    sent = chat_requests(deepseek)[-1]
    assert sent["thinking"] == {"type": "disabled"}
    assert sent["messages"][-1] == {
        "role": "assistant",
        "content": words(full, CUT),
        "prefix": True,
    }


async def test_reasoning_a_continuation_sends_is_dropped_not_spliced(
    plain: Simulator, deepseek: Simulator
) -> None:
    # A continuation table without DeepSeek's switch: the vendor thinks first, and its
    # reasoning never reaches the caller (nor the answer's text).
    full = await whole(plain)
    spec = {"message": {"prefix": True}, "base_url": deepseek.base_url}
    b = vendor("deepseek", deepseek, continuation=spec)
    stream, text, chunks = await routed(config(a=breaking(plain), b=b), plain)
    assert "thinking" not in chat_requests(deepseek)[-1]
    assert text == full
    assert reasoning_in(chunks) == []
    assert stream.route.continued_on == ["b:sim-small"]


# -- a vendor that rejects fields it does not know -----------------------------------------------


async def test_a_continuation_refused_with_422_is_reported_as_a_break(
    plain: Simulator, mistral: Simulator
) -> None:
    # The caller's `seed` is OpenAI's; Mistral answers it 422: the answer is not complete,
    # and the caller is told so with the text so far.
    full = await whole(plain)
    conf = config(a=breaking(plain), b=vendor("mistral", mistral))
    refused = mistral.stats()["faults"].get("refused-422", 0)
    _, received, broke = await interrupted(conf, plain, seed=7)
    prefix = words(full, CUT)
    assert content_of(received) == prefix
    assert broke.partial_text == prefix
    assert mistral.stats()["faults"].get("refused-422", 0) == refused + 1
    assert not [c for c in received if c.choices and c.choices[0].finish_reason]


async def test_a_continuation_refused_with_422_goes_on_to_the_next_vendor(
    plain: Simulator, mistral: Simulator
) -> None:
    full = await whole(plain)
    c = {"base_url": plain.base_url, "api_key": KEY, "continuation": {}}
    conf = config(a=breaking(plain), b=vendor("mistral", mistral), c=c)
    # b and c are both unmeasured: the route's order, b first; its 422 hands over to c.
    stream, text, _ = await routed(conf, plain, seed=7)
    assert text == full
    assert stream.route.continued_on == ["c:sim-small"]
    outcomes = [(a.target, a.outcome) for a in stream.route.attempts]
    assert outcomes == [
        ("a:sim-small", "interrupted"),
        ("b:sim-small", "error"),
        ("c:sim-small", "won"),
    ]
    assert "422" in (stream.route.attempts[1].error or "")


# -- a first answer that reasons (DeepSeek V4 by default) ------------------------------------------


def breaking_vendor(kind: str, sim: Simulator, after: int) -> dict[str, Any]:
    """A catalog vendor served by ``sim`` whose streams break after ``after`` deltas of text."""
    headers = {"x-sim-fault": f"drop:{after}"}
    return {**vendor(kind, sim, headers=headers), "continuation": False}


async def test_an_answer_that_reasoned_is_continued_once_its_text_began(
    plain: Simulator, deepseek: Simulator
) -> None:
    # The caller keeps the reasoning it saw; the continuation adds only the rest of the text.
    full = await whole(plain)
    # Usage on every chunk, its completion_tokens counting the reasoning too: an attempt
    # that reasoned is counted by its text deltas all the same (a vendor may not say how
    # many of its tokens were reasoning).
    a = {**breaking_vendor("deepseek", deepseek, CUT), "stream_usage_continuous": True}
    b = {"base_url": plain.base_url, "api_key": KEY, "continuation": {}}
    stream, text, chunks = await routed(config(a=a, b=b), plain, max_tokens=100)
    assert chat_requests(deepseek)[-1]["stream_options"]["continuous_usage_stats"] is True
    assert text == full
    assert len(reasoning_in(chunks)) == 5  # the first attempt's, before its text
    assert stream.route.continued_on == ["b:sim-small"]
    sent = chat_requests(plain)[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": words(full, CUT)}
    assert sent["max_tokens"] == 100 - CUT  # the text's deltas, not the reasoning, counted
    assert [a.tokens_counted for a in stream.route.attempts] == ["deltas", "usage"]


async def test_an_answer_that_broke_while_reasoning_is_not_continued(
    plain: Simulator, deepseek: Simulator
) -> None:
    a = breaking_vendor("deepseek", deepseek, 0)  # it breaks before any text
    b = {"base_url": plain.base_url, "api_key": KEY, "continuation": {}}
    stream, received, broke = await interrupted(config(a=a, b=b), plain)
    assert content_of(received) == ""
    assert len(reasoning_in(received)) == 5
    assert broke.partial_text == ""
    assert "while the model was reasoning" in str(broke)
    assert stream.route.continued_on == []
