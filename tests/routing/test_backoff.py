from __future__ import annotations

import email.utils
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import _base_client
from openai._models import FinalRequestOptions

from llmroute.routing.backoff import (
    MAX_RETRY_AFTER_DELAY,
    MAX_RETRY_DELAY,
    parse_retry_after,
    retry_delay,
    should_retry_status,
)

# The HTTP library the installed openai is built on (httpx2 from openai 3.0, httpx before):
# openai's own code is handed its own request, response and header types.
openai_http: Any = getattr(_base_client, "httpx2", None) or _base_client.httpx

NOW = 1_700_000_000.0


def http_date(offset: float) -> str:
    return email.utils.formatdate(NOW + offset, usegmt=True)


@pytest.fixture(scope="module")
def openai_client() -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key="x", base_url="http://t/v1") as c:
        yield c


@pytest.fixture
def client(openai_client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> openai.OpenAI:
    """openai's own client, with its clock frozen at NOW."""
    monkeypatch.setattr(_base_client.time, "time", lambda: NOW)
    return openai_client


OPENAI_MAJOR = int(openai.__version__.split(".")[0])


def openai_agrees(headers: dict[str, str]) -> bool:
    """Whether the installed openai reads these headers as llmroute does. openai before 3.0 reads
    a Retry-After that overflows a float (``1e999``) as infinity, which it then ignores (and so
    retries); 3.x bounds it (and so does not). llmroute keeps 3.x's rule on either major."""
    return OPENAI_MAJOR >= 3 or not any(v == "1e999" for v in headers.values())


HEADER_CASES: list[tuple[dict[str, str], float | None]] = [
    ({}, None),
    ({"retry-after-ms": "1500"}, 1.5),
    ({"retry-after-ms": "0.5"}, 0.0005),
    ({"retry-after-ms": "20", "retry-after": "9"}, 0.02),
    ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "2.5"}, 2.5),
    ({"retry-after": " 7 "}, 7.0),
    ({"retry-after": "-4"}, -4.0),
    ({"retry-after": "0"}, 0.0),
    ({"retry-after": "1e999"}, MAX_RETRY_AFTER_DELAY + 1),
    ({"retry-after-ms": "1e999"}, MAX_RETRY_AFTER_DELAY + 1),
    ({"retry-after": "inf"}, float("inf")),
    ({"retry-after": "Infinity"}, float("inf")),
    ({"retry-after": http_date(30)}, 30.0),
    ({"retry-after": http_date(-30)}, -30.0),
    ({"retry-after": http_date(600)}, 600.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 1445412480.0 - NOW),
    ({"retry-after": "not a date"}, None),
    ({"retry-after": ""}, None),
    ({"Retry-After": "4"}, 4.0),
    ({"RETRY-AFTER-MS": "4000"}, 4.0),
]


@pytest.mark.parametrize(("headers", "expected"), HEADER_CASES)
def test_parse_retry_after(
    headers: dict[str, str], expected: float | None, client: openai.OpenAI
) -> None:
    assert parse_retry_after(headers, now=NOW) == expected
    assert parse_retry_after(httpx.Headers(headers), now=NOW) == expected
    if openai_agrees(headers):
        assert client._parse_retry_after_header(openai_http.Headers(headers)) == expected


def test_parse_retry_after_without_headers() -> None:
    assert parse_retry_after(None, now=NOW) is None


STATUS_CASES: list[tuple[int, dict[str, str], bool]] = [
    (400, {}, False),
    (401, {}, False),
    (403, {}, False),
    (404, {}, False),
    (408, {}, True),
    (409, {}, True),
    (422, {}, False),
    (429, {}, True),
    (500, {}, True),
    (502, {}, True),
    (503, {}, True),
    (529, {}, True),
    (400, {"x-should-retry": "true"}, True),
    (429, {"x-should-retry": "false"}, False),
    (503, {"x-should-retry": "false"}, False),
    (503, {"x-should-retry": "maybe"}, True),
    (503, {"X-Should-Retry": "false"}, False),
    (429, {"retry-after": "120"}, True),
    (429, {"retry-after": "121"}, False),
    (429, {"retry-after-ms": "120001"}, False),
    (429, {"retry-after": "121", "x-should-retry": "true"}, False),  # openai checks the delay first
    (429, {"retry-after": "1e999"}, False),
    (429, {"retry-after": "inf"}, True),  # a literal infinity is ignored, not refused
    (429, {"retry-after": http_date(60)}, True),
    (429, {"retry-after": http_date(3600)}, False),
]


@pytest.mark.parametrize(("status", "headers", "expected"), STATUS_CASES)
def test_should_retry_status(
    status: int, headers: dict[str, str], expected: bool, client: openai.OpenAI
) -> None:
    assert should_retry_status(status, headers, now=NOW) is expected
    request = openai_http.Request("POST", "http://t/v1/chat/completions")
    response = openai_http.Response(status, headers=headers, request=request)
    if openai_agrees(headers):
        assert client._should_retry(response) is expected


@pytest.mark.parametrize("retries_done", [0, 1, 2, 3, 4, 5, 10, 2000])
@pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.999999])
@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"retry-after": "3"},
        {"retry-after-ms": "250"},
        {"retry-after": "0"},
        {"retry-after": "-1"},
        {"retry-after": "120"},
        {"retry-after": "121"},
        {"retry-after": "inf"},
        {"retry-after": "1e999"},
        {"retry-after": http_date(45)},
        {"retry-after": "garbage"},
    ],
)
def test_retry_delay_equals_openai(
    retries_done: int,
    rand: float,
    headers: dict[str, str] | None,
    client: openai.OpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    max_retries = 5
    monkeypatch.setattr(_base_client, "random", lambda: rand)
    options = FinalRequestOptions.construct(method="post", url="/x", max_retries=max_retries)
    expected = client._calculate_retry_timeout(
        max_retries - retries_done,
        options,
        openai_http.Headers(headers) if headers is not None else None,
    )
    got = retry_delay(
        retries_done=retries_done, max_retries=max_retries, headers=headers, now=NOW, rand=rand
    )
    assert got == expected


@pytest.mark.parametrize(
    ("retries_done", "base"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (1000, 8.0), (10**9, 8.0)],
)
def test_backoff_doubles_up_to_the_cap_with_jitter_bounds(retries_done: int, base: float) -> None:
    def delay(rand: float) -> float:
        return retry_delay(retries_done=retries_done, max_retries=2, headers={}, now=NOW, rand=rand)

    assert delay(0.0) == base
    assert delay(0.5) == base * 0.875
    assert base * 0.75 < delay(0.999999) < base
    assert delay(0.0) <= MAX_RETRY_DELAY


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "1"}, 0.001),
        ({"retry-after": "120"}, 120.0),
        ({"retry-after": http_date(10)}, 10.0),
        ({"retry-after": "121"}, 0.5),
        ({"retry-after": "0"}, 0.5),
        ({"retry-after": "-3"}, 0.5),
        ({"retry-after": http_date(-10)}, 0.5),
    ],
)
def test_server_delay_is_honoured_only_within_two_minutes(
    headers: dict[str, str], expected: float
) -> None:
    assert (
        retry_delay(retries_done=0, max_retries=2, headers=headers, now=NOW, rand=0.0) == expected
    )
