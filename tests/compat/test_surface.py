"""llmroute's clients ARE openai's: every public attribute of openai's client tree is there.

The tree is walked by introspection on the installed openai version, so an endpoint openai adds
later is checked without a change here.
"""

from __future__ import annotations

import inspect
from typing import Any, get_overloads, get_type_hints

import openai
import pytest
from openai._resource import AsyncAPIResource, SyncAPIResource

import llmroute

KEY = "sk-test-surface"


def public(obj: Any) -> list[str]:
    return sorted(name for name in dir(obj) if not name.startswith("_"))


def shape(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    """Names, kinds and defaults of a signature (annotations may be spelled differently)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def walk(theirs: Any, ours: Any, path: str, seen: set[int], found: list[str]) -> None:
    """Assert ``ours`` has every public attribute of ``theirs``, resources recursively."""
    if id(theirs) in seen:
        return
    seen.add(id(theirs))
    for name in public(theirs):
        where = f"{path}.{name}"
        try:
            value = getattr(theirs, name)
        except Exception:  # a property that needs something the bare client lacks
            continue
        assert hasattr(ours, name), f"llmroute's client lacks {where}"
        found.append(where)
        mine = getattr(ours, name)
        if isinstance(value, SyncAPIResource | AsyncAPIResource):
            # openai's resource class, or a subclass of it (chat.completions asks the cache
            # first); its methods' arguments are checked below.
            assert isinstance(mine, type(value)), f"{where}: {type(mine)} is not {type(value)}"
            walk(value, mine, where, seen, found)
        elif inspect.ismethod(value):
            assert inspect.ismethod(mine), f"{where} is not a method"
            theirs_sig = inspect.signature(value)
            if value.__func__ is getattr(mine, "__func__", None):
                continue  # inherited as it is
            if where.endswith(("copy", "with_options")):
                continue  # overridden to share llmroute's state; arguments passed through
            assert shape(inspect.signature(mine)) == shape(theirs_sig), f"{where}: arguments differ"
            if not isinstance(theirs, SyncAPIResource | AsyncAPIResource):
                continue
            # Type checkers and frameworks read the overloads (``stream`` picks the return
            # type) and the hints of a resource method they are given.
            overloads = [shape(inspect.signature(f)) for f in get_overloads(value.__func__)]
            mine_overloads = [shape(inspect.signature(f)) for f in get_overloads(mine)]
            assert mine_overloads == overloads, f"{where}: overloads differ"
            assert get_type_hints(mine) == get_type_hints(value), f"{where}: hints differ"
        elif name in ("with_raw_response", "with_streaming_response"):
            walk(value, mine, where, seen, found)


@pytest.mark.parametrize(
    ("theirs_cls", "ours_cls"),
    [(openai.AsyncOpenAI, llmroute.AsyncOpenAI), (openai.OpenAI, llmroute.OpenAI)],
)
def test_every_public_attribute_of_openais_client_tree(theirs_cls: Any, ours_cls: Any) -> None:
    theirs, ours = theirs_cls(api_key=KEY), ours_cls(api_key=KEY)
    try:
        assert isinstance(ours, theirs_cls)
        found: list[str] = []
        walk(theirs, ours, "client", set(), found)
        # The walk reached the resources users call, nested ones and the raw wrappers included.
        for expected in (
            "client.chat.completions.create",
            "client.chat.completions.parse",
            "client.chat.completions.stream",
            "client.responses.create",
            "client.files.create",
            "client.batches.create",
            "client.models.delete",
            "client.chat.completions.with_raw_response",
            "client.chat.completions.with_streaming_response",
            "client.post",
            "client.get",
            "client.default_query",
            "client.user_agent",
        ):
            assert expected in found, expected
        assert len(found) > 200
    finally:
        closer = ours.close
        if inspect.iscoroutinefunction(closer):
            import anyio

            anyio.run(closer)
        else:
            closer()


def test_every_constructor_argument_of_openai_is_accepted() -> None:
    names = [
        p.name
        for p in inspect.signature(openai.AsyncOpenAI.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    ours = inspect.signature(llmroute.AsyncOpenAI.__init__).parameters
    # Passed through as **kwargs: every openai argument reaches openai's constructor.
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
    extras = {"config", "verify", "_llmroute", "args", "kwargs", "self"}
    assert set(ours) <= extras | set(names)
    client = llmroute.AsyncOpenAI(
        api_key=KEY,
        **{  # the arguments the old facade refused
            name: value
            for name, value in {
                "webhook_secret": "whsec",
                "websocket_base_url": "wss://example.invalid/v1",
                "_strict_response_validation": True,
            }.items()
            if name in names
        },
    )
    assert client._strict_response_validation is True


def test_unknown_arguments_fail_as_in_openai() -> None:
    with pytest.raises(TypeError) as theirs:
        openai.AsyncOpenAI(api_key=KEY, nonsense=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError) as ours:
        llmroute.AsyncOpenAI(api_key=KEY, nonsense=1)
    assert "nonsense" in str(theirs.value) and "nonsense" in str(ours.value)
