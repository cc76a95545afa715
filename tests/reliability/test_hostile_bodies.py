"""Hostile request bodies through the pure functions every request meets: huge content is handled
in linear time, deep nesting either works or raises a typed error, never RecursionError.

Time is compared between two sizes in the same test (best of 3, a generous margin), never
against a fixed deadline.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import openai
import pytest

import llmroute
from llmroute._errors import RequestBodyError
from llmroute._upstream import Upstream
from llmroute.cache._key import canonical_request, request_key
from llmroute.config import resolve_provider
from llmroute.protocols.anthropic import translate_request
from llmroute.routing.prefix import PrefixTree, Prompt, prompt_blocks, render_prompt
from llmroute.routing.stats import estimate_prompt_tokens

from ..work import assert_linear_work, count_lines

TARGET = "fuzz:claude"
DEPTH = 10_000


def _assert_linear(make: Callable[[int], Callable[[], object]], n: int) -> None:
    """``make(n)()`` executes at most about 4 times as many Python lines at ``4n`` (quadratic:
    16). Lines are counted, not timed, so a loaded machine cannot fail it (tests/work.py)."""

    def counted(size: int) -> Callable[[], int]:
        work = make(size)
        return lambda: count_lines(work)

    assert_linear_work(counted, n)


def _deep_dict(depth: int = DEPTH) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return root


def _deep_list(depth: int = DEPTH) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(depth):
        node.append([])
        node = node[0]
    return root


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _body(messages: list[Any], **more: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": messages, "temperature": 0, **more}


def _huge_string() -> dict[str, Any]:
    return _body([_user("x" * 20_000_000)])


def _many_messages(n: int = 100_000) -> dict[str, Any]:
    roles = ("user", "assistant")
    return _body([{"role": roles[i % 2], "content": f"m{i}"} for i in range(n)])


def _many_user_messages(n: int = 100_000) -> dict[str, Any]:
    return _body([_user(f"m{i}") for i in range(n)])  # merged into one Anthropic turn


def _many_parts(n: int = 10_000) -> dict[str, Any]:
    return _body([_user([{"type": "text", "text": f"p{i} "} for i in range(n)])])


HUGE = {
    "a 20 MB message": _huge_string,
    "100k messages": _many_messages,
    "100k user messages in a row": _many_user_messages,
    "10k content parts": _many_parts,
}
DEEP = {
    "tool parameters": lambda: _body(
        [_user("hi")],
        tools=[{"type": "function", "function": {"name": "f", "parameters": _deep_dict()}}],
    ),
    "extra_body": lambda: _body([_user("hi")], vendor_options=_deep_list()),
    "message content": lambda: _body([_user(_deep_list())]),
    "a content part": lambda: _body([_user([{"type": "image_url", "image_url": _deep_dict()}])]),
    "a message": lambda: _body([_deep_dict()]),
}


# -- huge bodies: every pure step works, in linear time -------------------------------------------


@pytest.mark.parametrize("make", list(HUGE.values()), ids=list(HUGE))
def test_huge_bodies_pass_every_step(make: Callable[[], dict[str, Any]]) -> None:
    body = make()
    messages = body["messages"]
    assert request_key(body, model="route:chat", namespace="t").startswith("t/")
    assert estimate_prompt_tokens(messages) > 0
    prompt = Prompt.of(messages)
    assert 0 < len(prompt.blocks) <= 16384
    tree = PrefixTree()
    tree.insert(prompt.blocks, owner=1)
    assert tree.match(prompt.blocks) == len(prompt.blocks)
    out = translate_request(body, target=TARGET)
    assert out["messages"]
    json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def _messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(n)]


def _parts(n: int) -> list[dict[str, Any]]:
    return [_user([{"type": "text", "text": f"part {i}"} for i in range(n)])]


@pytest.mark.parametrize(
    "shape",
    [_messages, _parts, lambda n: [_user(f"m{i}") for i in range(n)]],
    ids=["alternating messages", "content parts", "same-role messages"],
)
@pytest.mark.parametrize(
    "step",
    [
        lambda m: request_key(_body(m), model="route:chat", namespace="t"),
        lambda m: estimate_prompt_tokens(m),
        lambda m: Prompt.of(m, max_blocks=10**9).blocks,
        lambda m: prompt_blocks(m),
        lambda m: translate_request(_body(m), target=TARGET),
    ],
    ids=["cache key", "token estimate", "prefix blocks", "prompt_blocks", "anthropic"],
)
def test_steps_scale_linearly(
    shape: Callable[[int], list[dict[str, Any]]], step: Callable[[list[dict[str, Any]]], object]
) -> None:
    def make(n: int) -> Callable[[], object]:
        messages = shape(n)
        return lambda: step(messages)

    _assert_linear(make, 10_000)


def test_long_text_scales_linearly() -> None:
    def make(n: int) -> Callable[[], object]:
        body = _body([_user("y" * n), {"role": "assistant", "content": "z" * n + "  "}])

        def work() -> object:
            request_key(body, model="m", namespace="t")
            Prompt.of(body["messages"], max_blocks=10**9)
            return translate_request(body, target=TARGET)

        return work

    _assert_linear(make, 1_000_000)


class _CopyCountingStr(str):
    """A ``str`` that counts the characters its slices copy (a slice is a copy in CPython)."""

    copied = 0

    def __getitem__(self, item: Any) -> str:  # type: ignore[override]
        value = super().__getitem__(item)
        if isinstance(item, slice):
            _CopyCountingStr.copied += len(value)
        return value


def test_anthropic_prefill_skip_is_linear() -> None:
    """A prefill ending in a lot of whitespace, answered one character at a time: the lines run
    and the characters copied out of the prefill grow linearly (slicing the rest of it at every
    character, as _skip once did, copies n**2 / 2 characters)."""
    from llmroute.protocols._anthropic_request import _skip

    def make(n: int) -> Callable[[], int]:
        def work() -> int:
            _CopyCountingStr.copied = 0
            pending = _CopyCountingStr(" " * n)
            at = 0
            while at < len(pending):
                _, at = _skip(" ", pending, at)
            return _CopyCountingStr.copied

        def counted() -> int:
            lines = count_lines(work)
            return lines + work()

        return counted

    assert_linear_work(make, 2_000)


# -- deep nesting: works, or a typed error; never RecursionError ----------------------------------


@pytest.mark.parametrize("make", list(DEEP.values()), ids=list(DEEP))
def test_deep_bodies_cache_key(make: Callable[[], dict[str, Any]]) -> None:
    body = make()
    try:
        key = request_key(body, model="m", namespace="t")
    except RequestBodyError as exc:
        assert "nested too deeply" in str(exc)
        assert isinstance(exc, openai.OpenAIError) and isinstance(exc, ValueError)
    else:
        assert key.startswith("t/")


def test_moderately_nested_bodies_have_keys() -> None:
    body = _body([_user("hi")], tools=[{"function": {"parameters": _deep_dict(200)}}])
    assert request_key(body, model="m", namespace="t") != request_key(
        _body([_user("hi")], tools=[{"function": {"parameters": _deep_dict(201)}}]),
        model="m",
        namespace="t",
    )


def test_unencodable_values_in_a_key() -> None:
    with pytest.raises(RequestBodyError, match="cannot be encoded"):
        canonical_request(_body([_user("hi")], seed=10**5000), model="m")
    looped: dict[str, Any] = {}
    looped["self"] = looped
    with pytest.raises(RequestBodyError):
        canonical_request(_body([_user("hi")], vendor=looped), model="m")


@pytest.mark.parametrize("make", list(DEEP.values()), ids=list(DEEP))
def test_deep_bodies_token_estimate_and_prefix(make: Callable[[], dict[str, Any]]) -> None:
    messages = make()["messages"]
    assert estimate_prompt_tokens(messages) >= 4
    first = Prompt.of(messages)
    assert first.blocks == Prompt.of(messages).blocks  # stable: the same prompt, the same blocks
    assert render_prompt(messages)


@pytest.mark.parametrize("make", list(DEEP.values()), ids=list(DEEP))
def test_deep_bodies_anthropic_translation(make: Callable[[], dict[str, Any]]) -> None:
    try:
        out = translate_request(make(), target=TARGET)
    except openai.BadRequestError as exc:
        assert "(parameter 'messages[0]" in exc.message
    else:
        assert out["messages"]


@pytest.mark.parametrize(
    "messages",
    [
        ["just a string", 5, None],
        [{"role": 10**5000, "content": "x"}],
        [{"role": "user", "content": {"type": "text", "text": "not in a list"}}],
        [{"role": "user", "content": b"bytes" * 1000}],
        [{"role": "user", "content": [10**5000]}],
    ],
)
def test_odd_messages_in_estimate_and_prefix(messages: list[Any]) -> None:
    assert estimate_prompt_tokens(messages) >= 4 * len(messages)
    assert Prompt.of(messages).blocks


# -- the JSON the client sends -------------------------------------------------------------------


async def _build(body: dict[str, Any]) -> bytes:
    """The bytes a routed attempt sends for ``body`` (llmroute's own encoding)."""
    provider = resolve_provider("p", {"base_url": "https://fuzz.invalid/v1", "api_key": "sk"})
    async with httpx.AsyncClient() as http:
        upstream = Upstream({"p": provider}, http)
        request = upstream.build(
            provider, "chat/completions", body, headers=None, query=None, timeout=httpx.Timeout(5)
        )
        return request.content


async def _direct(body: dict[str, Any]) -> None:
    """A call for a model that is not a route: openai's machinery encodes it."""
    base_url = "https://fuzz.invalid/v1"
    async with llmroute.AsyncOpenAI(api_key="sk-fuzz", base_url=base_url, max_retries=0) as c:
        rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
        await c.chat.completions.create(
            model=body["model"], messages=body["messages"], extra_body=rest
        )


@pytest.mark.parametrize("make", list(HUGE.values()), ids=list(HUGE))
def test_client_encodes_huge_bodies(make: Callable[[], dict[str, Any]]) -> None:
    body = make()
    assert json.loads(anyio.run(_build, body)) == body


@pytest.mark.parametrize("make", list(DEEP.values()), ids=list(DEEP))
def test_client_refuses_bodies_too_deep_to_encode_with_a_typed_error(
    make: Callable[[], dict[str, Any]],
) -> None:
    with pytest.raises(RequestBodyError, match="nested too deeply"):
        anyio.run(_build, make())
    with pytest.raises(RequestBodyError, match="nested too deeply"):
        anyio.run(_direct, make())


@pytest.mark.parametrize("odd", ["NaN", '"\\ud800"'])
def test_finding_an_odd_value_under_a_long_key_takes_memory_linear_in_the_body(odd: str) -> None:
    """A body refused for one NaN or lone surrogate is walked to name where it is. The walk
    once built every value's path as a string, copying a client's long key once per item
    under it: a 16 KB key over 10,000 items took 160 MB (a 1.5 MB key over a million items,
    within the gateway's 4 MiB, would take terabytes). Memory is measured, not time; the
    named path is bounded."""
    import tracemalloc

    from llmroute.server._validate import InvalidField, load

    key = "k" * 16_000
    items = ", ".join(["0"] * 10_000)
    raw = f'{{"{key}": [{items}], "x": {{"{key}": {odd}}}}}'.encode()
    tracemalloc.start()
    try:
        with pytest.raises(InvalidField) as refused:
            load(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * len(raw) + 2_000_000, f"{peak:,} bytes to refuse {len(raw):,}"
    param = refused.value.param
    assert param == "x." + "k" * 37 + "..."
    assert len(refused.value.message) < 400
