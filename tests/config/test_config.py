from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmroute._catalog import Continuation, load_catalog
from llmroute._errors import OpenAIError
from llmroute._routes import route_for
from llmroute.config import (
    Config,
    ConfigError,
    ProviderConfig,
    RouteConfig,
    RoutingSettings,
    Target,
    load_config,
    parse_duration,
    resolve,
)

SECRET = "sk-llmroute-test-7f3a9c-DO-NOT-SHOW"
ENV = {"DEEPSEEK_API_KEY": "sk-deepseek", "OPENAI_API_KEY": "sk-openai", "MINE_KEY": "sk-mine"}

EXAMPLE = """\
default_provider = "openai"

[providers.deepseek]

[providers.gpu1]
kind = "sglang"
base_url = "http://10.0.0.7:30000/v1"

[providers.mine]
base_url = "https://llm.example.com/v1"
api_key_env = "MINE_KEY"
headers = { "x-team" = "a" }
continuation = { message = { prefix = true } }

[models.chat]
targets = ["deepseek:deepseek-v4-flash", "openai:gpt-6-luna", "gpu1:qwen2.5-7b-instruct"]
policy = "weighted"
weights = [3, 1, 1]
hedge_after = "400ms"
first_token_timeout = "10s"

[models.local]
targets = ["ollama:qwen2.5:7b-instruct", "mine:m1"]
policy = "failover"

[routing]
window = "2m"
prompt_classes = [512, 4096]
breaker_cooldown = 15
"""

EXAMPLE_DICT: dict[str, Any] = {
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
    },
    "models": {
        "chat": {
            "targets": [
                "deepseek:deepseek-v4-flash",
                "openai:gpt-6-luna",
                "gpu1:qwen2.5-7b-instruct",
            ],
            "policy": "weighted",
            "weights": [3, 1, 1],
            "hedge_after": "400ms",
            "first_token_timeout": "10s",
        },
        "local": {"targets": ["ollama:qwen2.5:7b-instruct", "mine:m1"], "policy": "failover"},
    },
    "routing": {"window": "2m", "prompt_classes": [512, 4096], "breaker_cooldown": 15},
}


def write(tmp_path: Path, text: str, name: str = "llmroute.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_toml(tmp_path: Path, text: str) -> Config:
    config = load_config(write(tmp_path, text))
    assert config is not None
    return config


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


# --- sources -----------------------------------------------------------------------------------


def test_file_dict_and_object_give_equal_results(tmp_path: Path) -> None:
    from_file = load_toml(tmp_path, EXAMPLE)
    from_dict = load_config(EXAMPLE_DICT)
    built = Config(
        default_provider="openai",
        providers={
            "deepseek": ProviderConfig(),
            "gpu1": ProviderConfig(kind="sglang", base_url="http://10.0.0.7:30000/v1"),
            "mine": ProviderConfig(
                base_url="https://llm.example.com/v1",
                api_key_env="MINE_KEY",
                headers={"x-team": "a"},
                continuation=Continuation(message={"prefix": True}),
            ),
        },
        models={
            "chat": RouteConfig(
                targets=[
                    "deepseek:deepseek-v4-flash",
                    Target("openai", "gpt-6-luna"),
                    "gpu1:qwen2.5-7b-instruct",
                ],
                policy="weighted",
                weights=[3, 1, 1],
                hedge_after=0.4,
                first_token_timeout=10,
            ),
            "local": RouteConfig(
                targets=["ollama:qwen2.5:7b-instruct", "mine:m1"], policy="failover"
            ),
        },
        routing=RoutingSettings(window=120, prompt_classes=[512, 4096], breaker_cooldown="15s"),
    )
    assert load_config(built) is built
    assert from_file == from_dict == built
    assert from_file.source.endswith("llmroute.toml")
    assert from_dict is not None and from_dict.source == "config"
    assert resolve(from_file, ENV) == resolve(from_dict, ENV) == resolve(built, ENV)

    route = from_file.models["chat"]
    assert route.hedge_after == 0.4
    assert route.first_token_timeout == 10.0
    assert route.rank_by == "p95" and route.continue_on_break
    assert from_file.routing.window == 120.0
    assert from_file.routing.window_samples == 1024


def test_defaults() -> None:
    route = RouteConfig(targets=["openai:a", "openai:b", "openai:c"])
    assert route.policy == "hedge"
    assert route.hedge_after == "p95"
    assert route.hedge_budget == 0.1
    assert route.max_hedges == 1
    assert route.race == 2
    assert route.weights is None
    assert route.first_token_timeout == 30.0
    settings = RoutingSettings()
    assert settings.window == 300.0
    assert settings.prompt_classes == [1024, 8192, 32768]
    assert settings.ttft_prior == 1.0
    assert (settings.breaker_failures, settings.breaker_cooldown) == (5, 5.0)
    assert settings.breaker_max_cooldown == 5.0
    assert Config().default_provider is None


def test_race_defaults_to_the_number_of_targets_when_fewer() -> None:
    assert RouteConfig(targets=["openai:a"], policy="race").race == 1


def test_llmroute_config_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMROUTE_CONFIG", raising=False)
    assert load_config(None) is None
    assert load_config() is None
    monkeypatch.setenv("LLMROUTE_CONFIG", "")
    assert load_config(None) is None
    path = write(tmp_path, EXAMPLE)
    monkeypatch.setenv("LLMROUTE_CONFIG", str(path))
    config = load_config(None)
    assert config is not None
    assert config.source == str(path)
    assert config == load_config(EXAMPLE_DICT)


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMROUTE_CONFIG", "/x/y.toml")
    with pytest.raises(ConfigError) as info:
        load_config(None)
    assert str(info.value) == "LLMROUTE_CONFIG=/x/y.toml: no such file"
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file"):
        load_config(missing)
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file"):
        load_config(str(missing))


def test_not_toml(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[models.chat]\ntargets = ["openai:a"]\npolicy = hedge\n')
    assert message.startswith(f"{tmp_path / 'llmroute.toml'}: line 3, column 10: not valid TOML: ")
    path = tmp_path / "bin.toml"
    path.write_bytes(b"a = '\xff'")
    with pytest.raises(ConfigError, match=r"bin\.toml: not valid TOML"):
        load_config(path)


def test_not_a_config_source() -> None:
    with pytest.raises(TypeError):
        load_config(42)  # type: ignore[arg-type]


def test_config_error_is_an_openai_error_and_a_value_error() -> None:
    assert issubclass(ConfigError, OpenAIError)
    assert issubclass(ConfigError, ValueError)


# --- providers ---------------------------------------------------------------------------------


def test_catalog_providers_are_implicit_in_targets() -> None:
    config = load_config(
        {"models": {"chat": {"targets": ["deepseek:deepseek-v4-flash", "openai:x"]}}}
    )
    assert config is not None and config.providers == {}
    resolved = resolve(config, ENV)
    catalog = load_catalog()
    assert set(resolved.providers) == {"deepseek", "openai"}
    deepseek = resolved.providers["deepseek"]
    assert deepseek.spec == catalog["deepseek"]
    assert deepseek.kind == "deepseek"
    assert deepseek.api_key == ENV[catalog["deepseek"].api_key_env or ""]
    assert str(deepseek.base_url).endswith("/")
    assert deepseek.base_url.join("chat/completions") == httpx.URL(
        catalog["deepseek"].base_url.rstrip("/") + "/chat/completions"
    )
    assert resolved.routes == {
        "chat": [Target("deepseek", "deepseek-v4-flash"), Target("openai", "x")]
    }
    assert resolved.route_configs["chat"] == config.models["chat"]
    assert resolved.default_provider is None


def test_kind_based_provider_with_overrides(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path,
        '[providers.gpu1]\nkind = "sglang"\nbase_url = "http://10.0.0.7:30000/v1"\n'
        'stream_usage = false\n[models.m]\ntargets = ["gpu1:qwen"]\n',
    )
    provider = resolve(config, {}).providers["gpu1"]
    sglang = load_catalog()["sglang"]
    assert provider.name == "gpu1"
    assert provider.kind == "sglang"
    assert provider.spec.name == "sglang"
    assert provider.base_url == httpx.URL("http://10.0.0.7:30000/v1/")
    assert provider.base_url.join("chat/completions") == httpx.URL(
        "http://10.0.0.7:30000/v1/chat/completions"
    )
    assert provider.spec.stream_usage is False
    assert provider.spec.continuation == sglang.continuation
    assert provider.spec.self_hosted is True
    assert provider.api_key is None


def test_custom_provider(tmp_path: Path) -> None:
    config = load_toml(tmp_path, EXAMPLE)
    mine = resolve(config, ENV).providers["mine"]
    assert mine.kind is None
    assert mine.spec.name == "mine"
    assert mine.base_url == httpx.URL("https://llm.example.com/v1/")
    assert mine.api_key == "sk-mine"
    assert mine.headers == {"x-team": "a"}
    assert mine.spec.continuation == Continuation(message={"prefix": True})
    assert mine.spec.protocol == "openai"
    assert mine.spec.self_hosted is False


def test_a_retired_key_is_a_warning_naming_the_file_and_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """prompt_caching and docs were read by nothing: a config setting them still loads, the
    same as without them, and the log says which file and key to clean up."""
    plain = '[providers.box]\nbase_url = "http://box:8000/v1"\n[models.m]\ntargets = ["box:x"]\n'
    old = plain.replace("\n[models", '\nprompt_caching = "automatic"\ndocs = "https://x"\n[models')
    with caplog.at_level("WARNING", logger="llmroute"):
        config = load_toml(tmp_path, old)
    assert config == load_config(
        {
            "providers": {"box": {"base_url": "http://box:8000/v1"}},
            "models": {"m": {"targets": ["box:x"]}},
        }
    )
    path = tmp_path / "llmroute.toml"
    said = [r.getMessage() for r in caplog.records]
    for key in ("providers.box.prompt_caching", "providers.box.docs"):
        assert f"{path}: {key} has no effect and can be removed (" in "\n".join(said), said
    caplog.clear()
    with caplog.at_level("WARNING", logger="llmroute"):
        load_toml(tmp_path, plain)
    assert not caplog.records
    # Not retired elsewhere: a route's prompt_caching is still an unknown key.
    assert "models.m.prompt_caching: unknown key" in error_of(
        tmp_path, '[models.m]\ntargets = ["box:x"]\nprompt_caching = "automatic"\n'
    )


def test_custom_provider_without_a_key_needs_none(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path,
        '[providers.box]\nbase_url = "http://box:8000/v1"\n[models.m]\ntargets = ["box:x"]\n',
    )
    assert resolve(config, {}).providers["box"].api_key is None


def test_continuation_false_turns_it_off_and_headers_merge(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path,
        "[providers.deepseek]\ncontinuation = false\n"
        '[providers.anthropic]\nprotocol = "openai"\nheaders = { "x-team" = "a" }\n'
        '[models.m]\ntargets = ["deepseek:deepseek-v4-flash", "anthropic:claude-x"]\n',
    )
    assert load_catalog()["deepseek"].continuation is not None
    resolved = resolve(config, {"DEEPSEEK_API_KEY": "k", "ANTHROPIC_API_KEY": "k"})
    assert resolved.providers["deepseek"].spec.continuation is None
    anthropic = resolved.providers["anthropic"]
    assert anthropic.headers == {**load_catalog()["anthropic"].headers, "x-team": "a"}
    assert anthropic.spec.protocol == "openai"


def test_api_key_given_in_the_config_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "from-env")
    config = load_config(
        {
            "providers": {"deepseek": {"api_key": SECRET}},
            "models": {"m": {"targets": ["deepseek:x"]}},
        }
    )
    assert config is not None
    assert resolve(config).providers["deepseek"].api_key == SECRET
    other = load_config({"models": {"m": {"targets": ["deepseek:x"]}}})
    assert other is not None
    assert resolve(other).providers["deepseek"].api_key == "from-env"


def test_only_used_providers_are_resolved() -> None:
    config = load_config(
        {
            "providers": {"unused": {"base_url": "https://u.example/v1", "api_key_env": "NOPE"}},
            "models": {"m": {"targets": ["openai:x"]}},
        }
    )
    assert config is not None
    assert set(resolve(config, ENV).providers) == {"openai"}


def test_default_provider_is_resolved() -> None:
    config = load_config({"default_provider": "deepseek"})
    assert config is not None
    resolved = resolve(config, ENV)
    assert resolved.default_provider == "deepseek"
    assert set(resolved.providers) == {"deepseek"}


def test_self_hosted_key_is_optional() -> None:
    config = load_config({"models": {"m": {"targets": ["vllm:x", "ollama:y"]}}})
    assert config is not None
    resolved = resolve(config, {})
    assert resolved.providers["vllm"].api_key is None
    assert resolve(config, {"VLLM_API_KEY": "k"}).providers["vllm"].api_key == "k"


def test_model_names_with_colons(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path, '[models.m]\ntargets = ["ollama:qwen2.5:7b-instruct", "ollama:llama3:8b"]\n'
    )
    targets = resolve(config, {}).routes["m"]
    assert targets == [Target("ollama", "qwen2.5:7b-instruct"), Target("ollama", "llama3:8b")]
    assert targets[0].name == "ollama:qwen2.5:7b-instruct"
    assert str(targets[1]) == "ollama:llama3:8b"
    assert Target.parse("a:b:c") == Target("a", "b:c")


# --- errors ------------------------------------------------------------------------------------

ROUTE = '[models.chat]\ntargets = ["deepseek:deepseek-v4-flash", "openai:gpt-6-luna", "ollama:q"]\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ROUTE + 'policy = "hegde"\n',
            "llmroute.toml: models.chat.policy: expected 'fastest', 'hedge', 'race', 'failover', "
            "'weighted', 'prefix', 'least-loaded', 'round-robin' or 'cheapest', got 'hegde' "
            "(did you mean 'hedge'?)",
        ),
        (
            '[models.chat]\ntargets = ["openai:x", "deepseek"]\n',
            "llmroute.toml: models.chat.targets[1]: 'deepseek' is not 'provider:model'",
        ),
        (
            '[models.chat]\ntargets = ["deepsek:deepseek-v4-flash"]\n',
            "llmroute.toml: models.chat.targets[0]: unknown provider 'deepsek': not in "
            "[providers] nor the catalog (did you mean 'deepseek'?)",
        ),
        (
            '[providers.mine]\napi_key_env = "MINE_KEY"\n',
            "llmroute.toml: providers.mine: base_url is required for a provider that is not in "
            "the catalog (or set kind = ...)",
        ),
        (
            ROUTE + 'policy = "weighted"\nweights = [3, 1]\n',
            "llmroute.toml: models.chat.weights: expected 3 numbers (one per target), got 2",
        ),
        (
            ROUTE + 'policy = "weighted"\n',
            "llmroute.toml: models.chat.weights: required by policy = 'weighted'",
        ),
        (
            ROUTE + "weights = [1, 0, 1]\n",
            "llmroute.toml: models.chat.weights[1]: expected a number greater than 0, got 0",
        ),
        (
            '[routing]\nwindow = "five minutes"\n',
            "llmroute.toml: routing.window: expected a duration such as '5m', '300s' or 300, "
            "got 'five minutes'",
        ),
        (
            ROUTE + 'hedge_after = "p96"\n',
            "llmroute.toml: models.chat.hedge_after: expected 'p50', 'p90', 'p95', 'p99' or a "
            "duration such as '400ms', got 'p96'",
        ),
        (
            ROUTE + 'stall_timeout = "-1s"\n',
            "llmroute.toml: models.chat.stall_timeout: expected 'auto', 'off' or a duration "
            "such as '5s', got '-1s'",
        ),
        (
            ROUTE + 'stall_timeout = "autoo"\n',
            "llmroute.toml: models.chat.stall_timeout: expected 'auto', 'off' or a duration "
            "such as '5s', got 'autoo' (did you mean 'auto'?)",
        ),
        (
            ROUTE + "stall_timeout = 0\n",
            "llmroute.toml: models.chat.stall_timeout: expected a positive duration, got 0",
        ),
        (
            ROUTE + "server_error_retries = -1\n",
            "llmroute.toml: models.chat.server_error_retries:",
        ),
        (ROUTE + "ttft_target = 0\n", "llmroute.toml: models.chat.ttft_target:"),
        (ROUTE + 'ttft_target = "-300ms"\n', "llmroute.toml: models.chat.ttft_target:"),
        (ROUTE + "min_tokens_per_s = 0\n", "llmroute.toml: models.chat.min_tokens_per_s:"),
        (
            ROUTE + 'failover_on = ["context"]\n',
            "llmroute.toml: models.chat.failover_on[0]:",
        ),
        (
            '[routing]\nbreaker_max_cooldown = "0s"\n',
            "llmroute.toml: routing.breaker_max_cooldown:",
        ),
        ("[connections]\nmax_streams = 0\n", "llmroute.toml: connections.max_streams:"),
        ("[connections]\nmax_per_origin = 0\n", "llmroute.toml: connections.max_per_origin:"),
        ("[connections]\nmax_stream = 9\n", "llmroute.toml: connections.max_stream: unknown key"),
        (
            ROUTE + "race = 4\n",
            "llmroute.toml: models.chat.race: expected at most 3 (the number of targets), got 4",
        ),
        (
            ROUTE + "hedge_budget = 1.5\n",
            "llmroute.toml: models.chat.hedge_budget: expected a number at most 1, got 1.5",
        ),
        (
            '[models.chat]\ntargets = ["openai:a", "openai:a"]\n',
            "llmroute.toml: models.chat.targets[1]: 'openai:a' is listed twice",
        ),
        ("[models.chat]\ntargets = []\n", "llmroute.toml: models.chat.targets: expected at least"),
        ("[models.chat]\npolicy = 'race'\n", "llmroute.toml: models.chat.targets: required key"),
        (
            ROUTE + 'polcy = "race"\n',
            "llmroute.toml: models.chat.polcy: unknown key (did you mean 'policy'?)",
        ),
        ('[model.chat]\ntargets = ["openai:a"]\n', "llmroute.toml: model: unknown key"),
        (
            "[routing]\nprompt_classes = [1024, 512]\n",
            "llmroute.toml: routing.prompt_classes[1]: expected bounds in strictly increasing",
        ),
        ("[routing]\nexplore = 0.5\n", "llmroute.toml: routing.explore: expected a number"),
        ("[routing]\nwindow_samples = 1.5\n", "routing.window_samples: expected an integer"),
        (
            '[providers.gpu1]\nkind = "sglng"\n',
            "llmroute.toml: providers.gpu1.kind: unknown kind 'sglng': not in the catalog "
            "(did you mean 'sglang'?)",
        ),
        (
            '[providers.mine]\nbase_url = "llm.example.com"\n',
            "llmroute.toml: providers.mine.base_url: expected an http:// or https:// URL",
        ),
        (
            "[providers.deepseek]\ncontinuation = true\n",
            "llmroute.toml: providers.deepseek.continuation: expected a table",
        ),
        (
            '[providers.openai]\nprotocol = "grpc"\n',
            "llmroute.toml: providers.openai.protocol: expected 'openai' or 'anthropic', "
            "got 'grpc'",
        ),
        (
            '[providers."a:b"]\nbase_url = "https://x.example"\n',
            'llmroute.toml: providers."a:b": a provider name must be non-empty and contain no',
        ),
        (
            'default_provider = "opnai"\n',
            "llmroute.toml: default_provider: unknown provider 'opnai': not in [providers] nor "
            "the catalog (did you mean 'openai'?)",
        ),
        ("providers = 3\n", "llmroute.toml: providers: expected a table, got 3"),
        (
            "[providers.openai]\ncontext_window = 0\n",
            "llmroute.toml: providers.openai.context_window: expected a number at least 1, got 0",
        ),
        (
            '[providers.openai]\ncontext_window = "128k"\n',
            "llmroute.toml: providers.openai.context_window: expected an integer, got '128k'",
        ),
        (
            "[providers.openai]\ncontext_window = true\n",
            "llmroute.toml: providers.openai.context_window: expected an integer, got true",
        ),
        (
            '[providers.openai]\ncontext_windows = { "gpt-x" = 1.5 }\n',
            "llmroute.toml: providers.openai.context_windows.gpt-x: expected an integer, got 1.5",
        ),
        (
            ROUTE + 'context_windows = { "openai:gpt-5.6-luna" = 8192 }\n',
            'llmroute.toml: models.chat.context_windows."openai:gpt-5.6-luna": '
            "'openai:gpt-5.6-luna' is "
            "not one of this route's targets (did you mean 'openai:gpt-6-luna'?)",
        ),
        (
            ROUTE + 'context_windows = { "ollama:q" = -1 }\n',
            'llmroute.toml: models.chat.context_windows."ollama:q": expected a number at least 1',
        ),
    ],
)
def test_error_messages(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert expected in message
    assert str(tmp_path / "llmroute.toml") in message


def test_errors_from_a_dict_name_config() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"models": {"chat": {"targets": ["openai:x"], "policy": "hegde"}}})
    assert str(info.value).startswith("config: models.chat.policy: expected ")


def test_every_mistake_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"routing": {"window": "soon", "explore": 1}})
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("config: routing.window: ")
    assert lines[1].startswith("config: routing.explore: ")


def test_missing_api_key() -> None:
    config = load_config({"models": {"chat": {"targets": ["deepseek:deepseek-v4-flash"]}}})
    assert config is not None
    env_var = load_catalog()["deepseek"].api_key_env
    with pytest.raises(ConfigError) as info:
        resolve(config, {})
    assert str(info.value) == f"config: providers.deepseek: no API key: set {env_var} or api_key"
    with pytest.raises(ConfigError, match="no API key"):
        resolve(config, {env_var or "": ""})


def test_missing_api_key_names_the_file(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path,
        '[providers.mine]\nbase_url = "https://x.example/v1"\napi_key_env = "MINE_KEY"\n'
        '[models.m]\ntargets = ["mine:x"]\n',
    )
    with pytest.raises(ConfigError) as info:
        resolve(config, {})
    assert str(info.value) == (
        f"{tmp_path / 'llmroute.toml'}: providers.mine: no API key: set MINE_KEY or api_key"
    )


def test_anthropic_protocol_resolves() -> None:
    config = load_config({"models": {"m": {"targets": ["anthropic:claude-x"]}}})
    assert config is not None
    provider = resolve(config, {"ANTHROPIC_API_KEY": "k"}).providers["anthropic"]
    assert provider.spec.protocol == "anthropic"


def test_api_key_never_shown(tmp_path: Path) -> None:
    text = (
        f'[providers.mine]\nbase_url = "https://x.example/v1"\napi_key = "{SECRET}"\n'
        '[models.m]\ntargets = ["mine:x", "openai:y"]\n'
    )
    config = load_toml(tmp_path, text)
    resolved = resolve(config, ENV)
    assert resolved.providers["mine"].api_key == SECRET
    shown = [
        repr(config),
        str(config),
        config.model_dump_json(),
        repr(resolved),
        str(resolved),
        repr(resolved.providers["mine"]),
        str(resolved.providers["mine"]),
    ]
    for text_shown in shown:
        assert SECRET not in text_shown

    mistakes = [
        text + 'policy = "hegde"\n',
        text.replace(f'"{SECRET}"', f'"{SECRET}"\napikey = "{SECRET}"'),
        text.replace(f'"{SECRET}"', f'"{SECRET}"\nbase_url = 3'),
    ]
    for mistake in mistakes:
        message = error_of(tmp_path, mistake)
        assert SECRET not in message

    bad_inputs: list[dict[str, Any]] = [
        {"providers": {"mine": {"base_url": "https://x.example", "api_key": 12345987654321}}},
        {"providers": [{"api_key": SECRET}]},
        {"providers": {"mine": [SECRET]}},
        {"providers": {"mine": {"api_key": [SECRET]}}},
    ]
    for data in bad_inputs:
        with pytest.raises(ConfigError) as info:
            load_config(data)
        assert SECRET not in str(info.value)
        assert "12345987654321" not in str(info.value)
        assert info.value.__cause__ is None


def test_redis_url_from_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[redis] url_env``: the URL (a password in it) comes from the environment, never shows
    in a repr or an error, and a missing, empty or malformed variable is named, not echoed."""
    url = "redis://:pass-4f1c9e@redis.example:6379/2"
    text = '[redis]\nurl_env = "LLMROUTE_REDIS_URL"\n[models.m]\ntargets = ["openai:y"]\n'
    monkeypatch.setenv("LLMROUTE_REDIS_URL", url)
    config = load_toml(tmp_path, text)
    assert config.redis.url.get_secret_value() == url
    assert "pass-4f1c9e" not in repr(config) + config.model_dump_json()

    monkeypatch.setenv("LLMROUTE_REDIS_URL", "http://:pass-4f1c9e@redis.example")
    message = error_of(tmp_path, text)
    assert "redis.url_env: LLMROUTE_REDIS_URL: expected a redis://" in message
    assert "pass-4f1c9e" not in message
    for unset in ("", None):
        if unset is None:
            monkeypatch.delenv("LLMROUTE_REDIS_URL")
        else:
            monkeypatch.setenv("LLMROUTE_REDIS_URL", unset)
        assert "redis.url_env: LLMROUTE_REDIS_URL is not set" in error_of(tmp_path, text)
    both = text.replace("url_env", 'url = "redis://x"\nurl_env')
    assert "give url or url_env, not both" in error_of(tmp_path, both)
    pasted = text.replace('"LLMROUTE_REDIS_URL"', f'"{url}"')
    message = error_of(tmp_path, pasted)
    assert "redis.url_env: expected the name of an environment variable" in message
    assert "pass-4f1c9e" not in message


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (300, 300.0),
        (0.4, 0.4),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2 s", 2.0),
        (" 30S ", 30.0),
        (".5s", 0.5),
        ("300", 300.0),
    ],
)
def test_durations(value: float | str, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [-1, -0.5, "-5s", "5 minutes", "five", "", "1d", "ms", float("inf"), float("nan"), True],
)
def test_bad_durations(value: Any) -> None:
    with pytest.raises(ValueError, match="expected a duration such as '5m', '300s' or 300"):
        parse_duration(value)


def test_duration_fields_and_hedge_after() -> None:
    route = RouteConfig(targets=["openai:a"], hedge_after="P99", first_token_timeout="1.5s")
    assert route.hedge_after == "p99"
    assert route.first_token_timeout == 1.5
    assert RouteConfig(targets=["openai:a"], hedge_after=0).hedge_after == 0.0
    assert RoutingSettings(window="90s", ttft_prior="800ms").ttft_prior == pytest.approx(0.8)


def test_environ_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live")
    config = load_config({"models": {"m": {"targets": ["openai:x"]}}})
    assert config is not None
    assert resolve(config).providers["openai"].api_key == os.environ["OPENAI_API_KEY"]


def test_provider_verify_resolves_per_origin(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    config = load_config(
        {
            "providers": {
                "lab": {"base_url": "https://127.0.0.1:9443/v1", "verify": str(ca)},
                "dev": {"base_url": "https://LocalHost:8443/v1", "verify": False},
                "plain": {"base_url": "http://127.0.0.1:30000/v1", "verify": False},
                "vendor": {"base_url": "https://api.example.com/v1", "api_key": "k"},
            },
            "models": {"chat": {"targets": ["lab:m", "dev:m", "plain:m", "vendor:m"]}},
        }
    )
    assert config is not None
    resolved = resolve(config, environ={})
    assert resolved.providers["lab"].verify == str(ca)
    assert resolved.providers["vendor"].verify is None  # the client's own verify
    assert resolved.verify_by_origin() == {("127.0.0.1", 9443): str(ca), ("localhost", 8443): False}
    assert "verify=False" in repr(resolved.providers["dev"])


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        ("/no/such/ca.pem", "providers.lab.verify: '/no/such/ca.pem': no such CA file"),
        (3, "providers.lab.verify: expected true, false or the path of a CA file (PEM), got 3"),
        ("", "providers.lab.verify: expected true, false or the path of a CA file"),
    ],
)
def test_provider_verify_mistakes_are_sentences(verify: object, message: str) -> None:
    table = {"base_url": "https://127.0.0.1:9443/v1", "verify": verify}
    with pytest.raises(ConfigError) as info:
        load_config({"providers": {"lab": table}})
    assert message in str(info.value)


def test_providers_on_one_origin_must_trust_it_alike() -> None:
    config = load_config(
        {
            "providers": {
                "a": {"base_url": "https://127.0.0.1:9443/v1", "verify": False},
                "b": {"base_url": "https://127.0.0.1:9443/other", "verify": True},
            },
            "models": {"chat": {"targets": ["a:m", "b:m"]}},
        }
    )
    assert config is not None
    with pytest.raises(ConfigError, match=r"providers\.b\.verify: True differs from providers\.a"):
        resolve(config, environ={})


def test_context_windows_route_over_provider_model_over_provider_over_catalog() -> None:
    catalog = load_catalog()["anthropic"]
    assert catalog.window_for("claude-opus-5") == 1_000_000
    assert catalog.window_for("claude-unknown") is None
    config = load_config(
        {
            "providers": {
                "gpu1": {"base_url": "http://127.0.0.1:30000/v1", "context_window": 32768},
                "gpu2": {
                    "kind": "sglang",
                    "base_url": "http://127.0.0.1:30001/v1",
                    "context_window": 32768,
                    "context_windows": {"big": 131072},
                },
                "anthropic": {"context_windows": {"claude-new": 400_000}},
                "claude200": {"kind": "anthropic", "context_window": 200_000},
            },
            "models": {
                "chat": {
                    "targets": [
                        "gpu1:qwen",
                        "gpu2:qwen",
                        "gpu2:big",
                        "anthropic:claude-opus-5",
                        "anthropic:claude-new",
                        "claude200:claude-opus-5",
                    ],
                    "context_windows": {"gpu1:qwen": 16384},
                }
            },
        }
    )
    assert config is not None
    resolved = resolve(config, {"ANTHROPIC_API_KEY": "sk-ant-test"})
    providers = resolved.providers
    assert providers["gpu2"].spec.window_for("qwen") == 32768
    assert providers["gpu2"].spec.window_for("big") == 131072
    # a provider's own table adds to the catalog's; its one context_window replaces them
    assert providers["anthropic"].spec.window_for("claude-new") == 400_000
    assert providers["anthropic"].spec.window_for("claude-opus-5") == 1_000_000
    assert providers["claude200"].spec.window_for("claude-opus-5") == 200_000
    route = route_for("chat", resolved.route_configs["chat"], resolved.routes["chat"], providers)
    assert {t.name: t.context_window for t in route.targets} == {
        "gpu1:qwen": 16384,  # the route's own, over the provider's
        "gpu2:qwen": 32768,
        "gpu2:big": 131072,
        "anthropic:claude-opus-5": 1_000_000,
        "anthropic:claude-new": 400_000,
        "claude200:claude-opus-5": 200_000,
    }
