"""A model name that is not a route: near misses caught, others sent on (the pure rule)."""

from __future__ import annotations

import openai
import pytest

from llmroute._errors import UnknownModelError
from llmroute._model_names import check_model_name, edit_distance, suggest_route
from llmroute.config import ConfigError, load_config, resolve

ROUTES = ["chat", "fast", "reasoning-large"]


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("chat", "chat", 0),
        ("caht", "chat", 1),  # two adjacent characters swapped: one edit
        ("chta", "chat", 1),
        ("cht", "chat", 1),
        ("chatt", "chat", 1),
        ("xhat", "chat", 1),
        ("hcta", "chat", 2),
        ("", "chat", 3),  # over the limit of 2: reported as limit + 1
        ("gpt-6-luna", "chat", 3),
    ],
)
def test_edit_distance(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b, 2) == distance
    assert edit_distance(b, a, 2) == distance


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("caht", "chat"),
        ("Chat", "chat"),
        ("CHAT", "chat"),
        ("chats", "chat"),
        ("fsat", "fast"),
        ("reasoning-lrage", "reasoning-large"),  # longer routes allow 2 edits
        ("reasonin-larg", "reasoning-large"),
        ("chat", None),  # a route
        ("gpt-6-luna", None),
        ("hcta", None),  # 2 edits from a 4-letter route: too far
        ("deepseek-v4-flash", None),
        ("", None),
    ],
)
def test_suggest_route(name: str, suggestion: str | None) -> None:
    assert suggest_route(name, ROUTES) == suggestion


def test_the_closest_route_wins_then_the_first() -> None:
    assert suggest_route("chay", ["chat", "chay2", "cat"]) == "chat"
    assert suggest_route("fast", ["fast1", "fast2"]) == "fast1"


def test_a_near_miss_raises_naming_the_routes() -> None:
    with pytest.raises(UnknownModelError) as info:
        check_model_name("caht", ROUTES)
    error = info.value
    assert str(error).startswith("model 'caht' is not a route: did you mean 'chat'? ")
    assert "The routes are: 'chat', 'fast', 'reasoning-large'." in str(error)
    assert 'unknown_models = "default"' in str(error)
    assert (error.model, error.suggestion, error.routes) == ("caht", "chat", sorted(ROUTES))
    assert isinstance(error, openai.OpenAIError) and isinstance(error, ValueError)


def test_other_names_pass_unless_the_config_says_error() -> None:
    check_model_name("chat", ROUTES)
    check_model_name("gpt-6-luna", ROUTES)  # to the default provider, as openai would
    check_model_name("caht", ROUTES, "default")  # near misses too, when asked
    check_model_name("chat", ROUTES, "error")
    with pytest.raises(UnknownModelError, match=r"the routes are: 'chat', 'fast'"):
        check_model_name("gpt-6-luna", ROUTES, "error")
    with pytest.raises(UnknownModelError, match="did you mean 'chat'"):
        check_model_name("caht", ROUTES, "error")
    with pytest.raises(UnknownModelError, match=r"the routes are: \(none\)"):
        check_model_name("anything", [], "error")


def test_the_setting_is_read_from_the_config() -> None:
    config = load_config(
        {
            "unknown_models": "error",
            "providers": {"x": {"base_url": "http://127.0.0.1:1/v1"}},
            "models": {"chat": {"targets": ["x:m"]}},
        }
    )
    assert config is not None and config.unknown_models == "error"
    assert resolve(config, environ={}).unknown_models == "error"
    default = load_config({})
    assert default is not None and resolve(default, environ={}).unknown_models == "suggest"
    with pytest.raises(ConfigError, match=r"unknown_models: expected .*got 'eror' \(did you"):
        load_config({"unknown_models": "eror"})
