"""Retry or fail over by cause: the pure rules (llmroute.routing.causes) and the typed
AllTargetsFailed, tested without a server."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from llmroute import AllTargetsFailed, FirstTokenTimeout, StallTimeout, TargetUnavailable
from llmroute._errors import make_status_error
from llmroute.routing.causes import CauseRules, classify, react

REQUEST = httpx.Request("POST", "https://vendor.test/v1/chat/completions")
ORDERED = CauseRules(ordered=True)
LATENCY = CauseRules(ordered=False)


def status(code: int, error: dict[str, Any] | None = None, **headers: str) -> openai.APIStatusError:
    body = {"error": error or {"message": "x", "type": "t", "code": None}}
    response = httpx.Response(code, headers=headers, json=body, request=REQUEST)
    return make_status_error(response, response.content)


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (status(429), "rate_limited"),
        (status(500), "server_error"),
        (status(503), "server_error"),
        (status(401), "misconfigured"),
        (status(403), "misconfigured"),
        (status(404), "misconfigured"),
        (status(400, {"message": "bad model", "code": "model_not_found"}), "misconfigured"),
        (
            status(400, {"message": "bad temperature", "type": "invalid_request_error"}),
            "invalid_request",
        ),
        (status(400, {"message": "m", "code": "context_length_exceeded"}), "context_length"),
        (
            status(400, {"message": "prompt is too long: 210000 tokens > 200000 maximum"}),
            "context_length",
        ),
        (  # Anthropic, when the prompt fits but not with max_tokens
            status(
                400,
                {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: 199759 + "
                    "8192 > 200000, decrease input length or `max_tokens` and try again",
                },
            ),
            "context_length",
        ),
        (status(400, {"message": "m", "code": "content_policy_violation"}), "content_policy"),
        (status(400, {"message": "Output blocked by content filtering policy"}), "content_policy"),
        (openai.APIConnectionError(request=REQUEST), "connection"),
        (openai.APITimeoutError(request=REQUEST), "timeout"),
        (FirstTokenTimeout(REQUEST, target="a:m", seconds=1), "first_token_timeout"),
        (StallTimeout(REQUEST, target="a:m", seconds=1), "stall"),
        (openai.APIError("stream error event", REQUEST, body=None), "other"),
    ],
)
def test_classify(exc: BaseException, cause: str) -> None:
    assert classify(exc) == cause


def test_an_ordered_route_waits_out_a_short_retry_after_once() -> None:
    short = status(429, **{"retry-after": "2"})
    first = react(short, ORDERED, retried=0, now=0)
    assert (first.action, first.delay) == ("retry", 2.0)
    assert react(short, ORDERED, retried=1, now=0).action == "failover"
    assert react(status(429, **{"retry-after": "20"}), ORDERED, retried=0, now=0).action == (
        "failover"
    )
    assert react(status(429), ORDERED, retried=0, now=0).action == "failover"  # no Retry-After
    capped = CauseRules(ordered=True, retry_after_max=30)
    assert react(status(429, **{"retry-after": "20"}), capped, retried=0, now=0).delay == 20
    off = CauseRules(ordered=True, retry_after_max=0)
    assert react(short, off, retried=0, now=0).action == "failover"


def test_an_ordered_route_retries_a_5xx_once_then_fails_over() -> None:
    first = react(status(500), ORDERED, retried=0, now=0)
    assert (first.action, first.delay) == ("retry", 0.0)
    assert react(status(500), ORDERED, retried=1, now=0).action == "failover"
    none = CauseRules(ordered=True, server_error_retries=0)
    assert react(status(500), none, retried=0, now=0).action == "failover"


@pytest.mark.parametrize("exc", [status(429, **{"retry-after": "1"}), status(500)])
def test_latency_policies_move_on_at_once(exc: BaseException) -> None:
    assert react(exc, LATENCY, retried=0, now=0).action == "failover"


@pytest.mark.parametrize("rules", [ORDERED, LATENCY])
@pytest.mark.parametrize(
    "error",
    [
        {"message": "bad temperature"},
        {"message": "m", "code": "context_length_exceeded"},
        {"message": "m", "code": "content_policy_violation"},
    ],
)
def test_a_request_caused_400_goes_back_to_the_caller(
    rules: CauseRules, error: dict[str, Any]
) -> None:
    assert react(status(400, error), rules, retried=0, now=0).action == "raise"


def test_a_route_may_opt_in_to_failing_over_on_a_request_caused_400() -> None:
    rules = CauseRules(failover_on=frozenset({"content_policy"}))
    refused = status(400, {"message": "m", "code": "content_policy_violation"})
    assert react(refused, rules, retried=0, now=0).action == "failover"
    too_long = status(400, {"message": "m", "code": "context_length_exceeded"})
    assert react(too_long, rules, retried=0, now=0).action == "raise"


@pytest.mark.parametrize("exc", [status(401), status(403), status(404)])
def test_a_misconfigured_target_is_failed_over_on_every_policy(exc: BaseException) -> None:
    assert react(exc, ORDERED, retried=0, now=0).action == "failover"
    assert react(exc, LATENCY, retried=0, now=0).action == "failover"


@pytest.mark.parametrize(
    ("exc", "meaning"),
    [
        (status(400), openai.BadRequestError),
        (status(401), openai.AuthenticationError),
        (status(429), openai.RateLimitError),
        (status(502), openai.InternalServerError),
        (FirstTokenTimeout(REQUEST, target="a:m", seconds=1), openai.APITimeoutError),
        (openai.APIConnectionError(request=REQUEST), openai.APIConnectionError),
    ],
)
def test_all_targets_failed_keeps_the_last_targets_meaning(
    exc: openai.APIError, meaning: type[openai.APIError]
) -> None:
    unavailable = TargetUnavailable("circuit open", REQUEST, target="b:m")
    error = AllTargetsFailed("chat", {"a:m": exc, "b:m": unavailable}, REQUEST)
    assert isinstance(error, AllTargetsFailed) and isinstance(error, meaning)
    assert error.last is exc and set(error.errors) == {"a:m", "b:m"}
    assert "a:m" in error.message and exc.message in error.message
    if isinstance(exc, openai.APIStatusError):
        assert isinstance(error, openai.APIStatusError)
        assert error.status_code == exc.status_code and error.body == exc.body
        assert error.response is exc.response


def test_all_targets_failed_without_a_meaning_is_plain() -> None:
    error = AllTargetsFailed("chat", {}, REQUEST)
    assert type(error) is AllTargetsFailed and not isinstance(error, openai.APIStatusError)
    explicit = AllTargetsFailed("chat", {"a:m": status(500)}, REQUEST, last=status(429))
    assert isinstance(explicit, openai.RateLimitError)
    assert type(explicit) is type(AllTargetsFailed("x", {"a": status(429)}, REQUEST))


def test_a_parameter_one_target_does_not_support_fails_over() -> None:
    refused = status(400, {"message": "the simulator supports only n=1"})
    assert classify(refused) == "unsupported"
    assert react(refused, ORDERED, retried=0, now=0).action == "failover"
    unsupported = status(400, {"message": "m", "code": "unsupported_parameter"})
    assert react(unsupported, LATENCY, retried=0, now=0).action == "failover"
