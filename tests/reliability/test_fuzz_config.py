"""Hostile configs: random dicts, random TOML and odd files reach the loader; only ConfigError
(naming the source, and the key at fault) may come out, never pydantic's or Python's own errors.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmroute
from llmroute.config import Config, ConfigError, load_config, resolve

# Every API key variable of the catalog, so that resolve() fails only on what a config says.
ENV = {
    name: "sk-fuzz-0123456789"
    for name in (
        "ANTHROPIC_API_KEY",
        "DASHSCOPE_API_KEY",
        "DEEPSEEK_API_KEY",
        "FIREWORKS_API_KEY",
        "GEMINI_API_KEY",
        "GROQ_API_KEY",
        "MISTRAL_API_KEY",
        "MOONSHOT_API_KEY",
        "OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
        "SILICONFLOW_API_KEY",
        "SILICONFLOW_GLOBAL_API_KEY",
        "TOGETHER_API_KEY",
        "XAI_API_KEY",
        "ZAI_API_KEY",
        "ZHIPUAI_API_KEY",
        "ZHIPU_API_KEY",
        "MINE_KEY",
        "LLMROUTE_GATEWAY_KEY",
    )
}
SETTINGS = settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])

# -- strategies ---------------------------------------------------------------------------------

_weird_text = st.text(
    st.characters(blacklist_categories=("Cs",)),
    max_size=12,
) | st.sampled_from(
    [
        "",
        " ",
        ":",
        "::",
        "a:",
        ":b",
        "a::b",
        " a : b ",
        "openai:",
        "openai:gpt:4o:mini",
        "openai: gpt",
        "\u200bopenai:x",
        "\uff4f\uff50\uff45\uff4e\uff41\uff49:x",  # fullwidth "openai"
        "openai:\x00",
        "é:ü",
        "x" * 5000,
        "deepseek:deepseek-v4-flash",
        "openai:gpt-6-luna",
        "sglang:q",
        "anthropic:claude",
    ]
)
_durations = (
    st.sampled_from(
        [
            "400ms",
            "1h",
            "1.5s",
            "5m",
            "2 s",
            ".5s",
            "0",
            "-1s",
            "1e9h",
            "9" * 400 + "h",
            "nan",
            "inf",
            "1d",
            "ms",
            "",
            "p95",
            "P99",
            " p50 ",
            "p100",
            "garbage",
            "\uff11s",  # a fullwidth digit
        ]
    )
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**70), 2**70)
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _weird_text
    | _durations
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_weird_text, inner, max_size=4),
    max_leaves=12,
)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A plausible value most of the time, anything at all sometimes."""
    return st.one_of(strategy, strategy, _json)


_provider_names = (
    st.sampled_from(
        ["openai", "deepseek", "anthropic", "sglang", "gpu1", "mine", "", "a:b", "x" * 300]
    )
    | _weird_text
)
_provider = st.dictionaries(
    st.sampled_from(
        [
            "kind",
            "base_url",
            "api_key",
            "api_key_env",
            "headers",
            "continuation",
            "protocol",
            "prompt_caching",
            "stream_usage",
            "self_hosted",
            "display_name",
            "docs",
            "unknown_key",
        ]
    ),
    _maybe(
        st.sampled_from(
            [
                "sglang",
                "openai",
                "nonesuch",
                "http://127.0.0.1:1/v1",
                "https://x.invalid",
                "ftp://x",
                "http://",
                "not a url",
                "http://[::1",
                "anthropic",
                "MINE_KEY",
                "sk-pasted-secret",
            ]
        )
        | st.dictionaries(_weird_text, _weird_text, max_size=3)
        | st.booleans()
    ),
    max_size=5,
)
_targets = st.lists(_maybe(_weird_text), max_size=4) | _json
_route = st.dictionaries(
    st.sampled_from(
        [
            "targets",
            "policy",
            "hedge_after",
            "hedge_budget",
            "max_hedges",
            "race",
            "weights",
            "rank_by",
            "prefix_block_chars",
            "prefix_max_blocks",
            "cache_threshold",
            "first_token_timeout",
            "continue_on_break",
            "polcy",
        ]
    ),
    _maybe(
        _targets
        | _durations
        | st.sampled_from(["hedge", "fastest", "weighted", "prefix", "hedg", "p95", "mean"])
        | st.lists(st.floats(allow_nan=True) | st.integers(-5, 5), max_size=4)
    ),
    max_size=6,
)
_section = st.dictionaries(
    st.sampled_from(
        [
            "window",
            "window_samples",
            "explore",
            "prompt_classes",
            "ttft_prior",
            "breaker_failures",
            "backend",
            "mode",
            "min_hits",
            "ttl",
            "max_bytes",
            "max_entry_bytes",
            "namespace",
            "replay",
            "url",
            "prefix",
            "timeout",
            "keys",
            "host",
            "port",
            "certfile",
            "max_body_bytes",
            "wat",
        ]
    ),
    _maybe(_durations | st.sampled_from(["64MiB", "1 GB", "-1kb", "1e3", "redis://x", "memory"])),
    max_size=5,
)


def _no_disk_cache(config: dict[str, Any]) -> dict[str, Any]:
    """A config whose cache (if any) and stats stay in memory: nothing is written anywhere."""
    cache = config.get("cache")
    if isinstance(cache, dict):
        config["cache"] = {**cache, "backend": "memory"}
    routing = config.get("routing")
    if isinstance(routing, dict):
        config["routing"] = {k: v for k, v in routing.items() if k != "stats_backend"}
    return config


_configs = st.fixed_dictionaries(
    {},
    optional={
        "default_provider": _maybe(_provider_names),
        "providers": _maybe(st.dictionaries(_provider_names, _maybe(_provider), max_size=3)),
        "models": _maybe(st.dictionaries(_weird_text, _maybe(_route), max_size=3)),
        "routing": _maybe(_section),
        "cache": _maybe(_section),
        "redis": _maybe(_section),
        "gateway": _maybe(_section),
        "extra": _json,
    },
).map(_no_disk_cache)


VALID: dict[str, Any] = {
    "default_provider": "openai",
    "providers": {
        "deepseek": {},
        "gpu1": {"kind": "sglang", "base_url": "http://10.0.0.7:30000/v1"},
        "mine": {
            "base_url": "https://llm.example.com/v1",
            "api_key_env": "MINE_KEY",
            "headers": {"x-team": "a"},
            "continuation": {"message": {"prefix": True}},
        },
        "claude": {"kind": "anthropic", "protocol": "anthropic"},
    },
    "models": {
        "chat": {
            "targets": ["deepseek:deepseek-v4-flash", "openai:gpt-6-luna", "gpu1:qwen2.5-7b"],
            "policy": "weighted",
            "weights": [3, 1, 1],
            "hedge_after": "400ms",
            "first_token_timeout": "10s",
        },
        "local": {"targets": ["ollama:qwen2.5:7b-instruct", "mine:m1"], "policy": "prefix"},
    },
    "routing": {"window": "2m", "prompt_classes": [512, 4096], "breaker_cooldown": 15},
    "cache": {"backend": "memory", "ttl": "1h", "max_bytes": "64MiB"},
    "redis": {"url": "redis://127.0.0.1:6379/0"},
    "gateway": {"keys": {"default": "LLMROUTE_GATEWAY_KEY"}, "port": 8000},
}


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A valid config with a few keys replaced by odd values, removed or added: the mistakes
    reach the deep checks (weights against targets, references, resolve) too."""
    config = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        node: Any = config
        while isinstance(node, dict | list) and node and draw(st.integers(0, 3)):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            key = draw(st.sampled_from(keys))
            if not isinstance(node[key], dict | list) or not node[key]:
                break
            node = node[key]
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(list(node)))
            action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
            if action == "replace":
                node[key] = draw(_json | _durations | _weird_text)
            elif action == "delete":
                del node[key]
            else:
                node[draw(_weird_text)] = draw(_json)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(_json | _weird_text)
    return _no_disk_cache(config)


# -- checks -------------------------------------------------------------------------------------


def _check_message(exc: ConfigError, source: str) -> None:
    text = str(exc)
    assert text.startswith(f"{source}: "), text
    # Names the key at fault (or the file), in the loader's words, not pydantic's.
    assert "errors.pydantic.dev" not in text, text
    assert "validation error" not in text.lower(), text
    assert "sk-fuzz-0123456789" not in text


def _load_and_resolve(source: Mapping[str, Any] | str) -> None:
    label = source if isinstance(source, str) else "config"
    try:
        config = load_config(source)
        assert isinstance(config, Config)
        resolve(config, environ=ENV)
    except ConfigError as exc:
        _check_message(exc, label)


@contextmanager
def _environ() -> Iterator[None]:
    with mock.patch.dict(os.environ, ENV):
        os.environ.pop("LLMROUTE_CONFIG", None)
        yield


# -- dicts --------------------------------------------------------------------------------------


def test_the_valid_config_is_valid() -> None:
    config = load_config(VALID)
    assert config is not None
    assert set(resolve(config, environ=ENV).routes) == {"chat", "local"}


@SETTINGS
@given(_configs | _mutated())
def test_random_config_dicts_raise_only_config_error(config: dict[str, Any]) -> None:
    _load_and_resolve(config)


@settings(max_examples=60)
@given(_json)
def test_any_json_value_as_a_config(value: Any) -> None:
    if isinstance(value, dict):
        _load_and_resolve(value)
    elif isinstance(value, str):  # a path
        with pytest.raises(ConfigError) as info:
            load_config(value)
        assert str(info.value).startswith(value[:100])
    elif value is None:  # the file LLMROUTE_CONFIG names, none here
        with _environ():
            assert load_config(value) is None
    elif not isinstance(value, str):
        with pytest.raises(TypeError, match="expected a Config, a dict or the path"):
            load_config(value)


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(_configs | _mutated())
def test_random_config_dicts_through_the_client(config: dict[str, Any]) -> None:
    with _environ():
        try:
            client = llmroute.AsyncOpenAI(config=config, api_key="sk-fuzz-0123456789")
        except ConfigError as exc:
            _check_message(exc, "config")
            return
        asyncio.run(client.close())


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"models": {"chat": {"targets": ["a::b"]}}}, "models.chat.targets"),
        ({"models": {"chat": {"targets": [":model"]}}}, "models.chat.targets[0]"),
        ({"models": {"chat": {"targets": ["openai:"]}}}, "models.chat.targets[0]"),
        ({"models": {"chat": {"targets": ["openai : x"]}}}, "models.chat.targets[0]"),
        ({"models": {"chat": {"targets": ["openai:x"], "hedge_after": "1d"}}}, "hedge_after"),
        ({"models": {"chat": {"targets": ["openai:x"], "first_token_timeout": "nan"}}}, "timeout"),
        ({"models": {"chat": {"targets": ["openai:x"], "first_token_timeout": 1e400}}}, "timeout"),
        ({"routing": {"window": "9" * 400 + "h"}}, "routing.window"),
        ({"routing": {"window": "-1s"}}, "routing.window"),
        ({"cache": {"backend": "memory", "max_bytes": "1e3"}}, "cache.max_bytes"),
        ({"providers": {"x" * 300: {}}}, "providers"),
        ({"providers": {"a:b": {"base_url": "http://x"}}}, "providers"),
        ({"providers": {"mine": {"base_url": "http://[::1"}}}, "providers.mine.base_url"),
        ({"providers": {"mine": {"kind": ["sglang"]}}}, "providers.mine.kind"),
        ({"models": {"chat": []}}, "models.chat"),
        ({"models": {"\u200b": {"targets": 5}}}, "targets"),
    ],
)
def test_odd_values_name_the_key(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg = load_config(config)
        assert cfg is not None
        resolve(cfg, environ=ENV)
    _check_message(info.value, "config")
    assert key in str(info.value)


@pytest.mark.parametrize("value", ["9" * 400 + "h", "1e999s", "1" + "0" * 5000])
def test_huge_duration_strings_are_config_errors(value: str) -> None:
    with pytest.raises(ConfigError, match=r"routing\.window"):
        load_config({"routing": {"window": value}})


@pytest.mark.parametrize("value", ["9" * 400 + "GB", "1" + "0" * 400])
def test_huge_size_strings_are_config_errors(value: str) -> None:
    with pytest.raises(ConfigError, match=r"cache\.max_bytes"):
        load_config({"cache": {"backend": "memory", "max_bytes": value}})


# -- TOML text and files ------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = ", ".join(
            f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{" + items + "}"
    raise AssertionError(value)


def _toml(config: Mapping[str, Any]) -> str:
    """A TOML document of the config (``None`` values left out, as TOML has none)."""
    lines = []
    for key, value in config.items():
        if value is not None:
            lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(_configs | _mutated())
def test_random_valid_toml_with_wrong_shapes(
    tmp_path_factory: pytest.TempPathFactory, config: dict[str, Any]
) -> None:
    text = _toml(config)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return
    path = tmp_path_factory.mktemp("toml") / "llmroute.toml"
    path.write_text(text, encoding="utf-8")
    _load_and_resolve(str(path))


_toml_fragments = st.sampled_from(
    [
        b"[models.chat]\n",
        b'targets = ["openai:gpt-6-luna"]\n',
        b"[providers.x]\n",
        b'base_url = "http://127.0.0.1:1/v1"\n',
        b"[[models]]\n",
        b"[models]\nchat = 5\n",
        b"policy = 'hedge'\n",
        b"= 1\n",
        b'"unterminated\n',
        b"[routing\n",
        b"a.b.c.d = 1\n",
        b"x = 1979-05-27T07:32:00Z\n",
        b"y = 1e400\n",
        b"\xef\xbb\xbf",
        b"\x00",
        b"\xff\xfe",
        b"\r\n",
        b"\n",
        b"#",
        b"k = '''\n",
        b"\\u0000",
    ]
)


@SETTINGS
@given(st.lists(_toml_fragments | st.binary(max_size=20), max_size=12).map(b"".join))
def test_random_toml_bytes(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("raw") / "llmroute.toml"
    path.write_bytes(raw)
    _load_and_resolve(str(path))


def test_missing_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_directory_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: ")


def test_not_utf8_names_it(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[models.caf\xe9]\ntargets = ["openai:x"]\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "UTF-8" in str(info.value)


def test_unreadable_path_names_it(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 5000 + ".toml")  # ENAMETOOLONG
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(str(path)[:100])


def test_nul_in_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("llm\0route.toml")
    assert "llm" in str(info.value)


def test_client_with_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with _environ(), pytest.raises(ConfigError) as info:
        llmroute.AsyncOpenAI(config=str(path), api_key="sk-fuzz-0123456789")
    assert str(path) in str(info.value)
