"""Issue 28's acceptance tests: tenants with their own limits, budgets and permissions, shared
by every gateway replica through one real redis-server.

Replicas are of two kinds here, and share nothing but Redis either way:

- two ``llmroute serve`` subprocesses (:func:`test_rpm_holds_across_two_serve_processes`):
  separate processes, each with its own memory, event loop, client and counters;
- two :class:`~llmroute.server.Gateway` servers in threads of the test process, each with its
  own event loop, :class:`~llmroute.server.GatewayApp`, client and counters, where a test needs
  to look inside a replica (its logs, its reload) or to start quickly.

Every assertion is on counts and statuses (requests admitted, refused, sent, tokens counted),
never on how long something took; every wait is a loop bounded in count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmroute import ConfigError
from llmroute.cli import main
from llmroute.config import load_config
from llmroute.server import Gateway, GatewayApp
from llmroute.testing import Profile, Simulator
from tests import redis_server

KEYS = {
    "alpha": "gw-tenant-alpha-0123456789",
    "beta": "gw-tenant-beta-0123456789",
    "gamma": "gw-tenant-gamma-0123456789",
    "delta": "gw-tenant-delta-0123456789",
    "admin": "gw-tenant-admin-0123456789",
}
ENVIRON = {f"GT_{name.upper()}": key for name, key in KEYS.items()}
MESSAGES = [{"role": "user", "content": "Tell me about tenants."}]
DEADLINE = 30.0  # an HTTP client's timeout: a hang guard only
TRIES = 200  # polls of a bounded wait
PAUSE = 0.05  # seconds between polls
REPLY = 20  # tokens of every simulated answer
REJECTIONS = "llmroute_gateway_rejections_total"
LONG = 1000  # tokens of a slow stream (10 ms apart): in flight for seconds
SHORT = 100


@pytest.fixture(scope="module")
def fast() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=REPLY), tls=False) as server:
        yield server


@pytest.fixture(scope="module")
def held() -> Iterator[Simulator]:
    """Every stream waits before its first token until :meth:`Simulator.release`."""
    profile = Profile(reply_tokens=REPLY, hold_first_token=True, hang_max=60)
    with Simulator(profile=profile, tls=False) as server:
        yield server


@pytest.fixture(scope="module")
def slow() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=LONG, inter_token=0.01), tls=False) as server:
        yield server


def config_for(
    fast: Simulator,
    gateway: dict[str, Any],
    *,
    redis: str | None = None,
    more: dict[str, Simulator] | None = None,
) -> dict[str, Any]:
    """Routes ``chat`` and ``other`` on ``fast`` (and one per ``more`` simulator); the
    ``[gateway]`` table given, its limits in ``redis`` when a URL is given."""
    providers = {"fast": {"base_url": fast.base_url, "api_key": "sk-tenants-upstream"}}
    models: dict[str, Any] = {
        "chat": {"targets": ["fast:sim-small"]},
        "other": {"targets": ["fast:sim-large"]},
    }
    for name, sim in (more or {}).items():
        providers[name] = {"base_url": sim.base_url, "api_key": "sk-tenants-upstream"}
        models[name] = {"targets": [f"{name}:sim-small"]}
    config: dict[str, Any] = {
        "providers": providers,
        "models": models,
        "routing": {"explore": 0},
        "gateway": dict(gateway),
    }
    if redis is not None:
        config["redis"] = {"url": redis, "prefix": f"tenants-{uuid.uuid4().hex[:8]}"}
        config["gateway"]["limits_backend"] = "redis"
    return config


def keys(*names: str) -> dict[str, str]:
    """``[gateway] keys`` for these key names."""
    return {name: f"GT_{name.upper()}" for name in names}


def root(gateway: Gateway | str) -> str:
    url = gateway if isinstance(gateway, str) else gateway.base_url
    return url.removesuffix("/v1")


def post(gateway: Gateway | str, key: str, model: str = "chat", **fields: Any) -> httpx.Response:
    with httpx.Client(timeout=DEADLINE) as client:
        return client.post(
            root(gateway) + "/v1/chat/completions",
            json={"model": model, "messages": MESSAGES, **fields},
            headers={"authorization": f"Bearer {KEYS.get(key, key)}"},
        )


def get(gateway: Gateway | str, path: str, key: str = "admin") -> httpx.Response:
    headers = {"authorization": f"Bearer {KEYS.get(key, key)}"}
    return httpx.get(root(gateway) + path, headers=headers, timeout=DEADLINE)


def limits_of(gateway: Gateway | str, name: str) -> dict[str, Any]:
    """The key's counters now, as ``GET /admin/usage`` gives them to an admin key."""
    answer = get(gateway, "/admin/usage")
    assert answer.status_code == 200, answer.text
    return answer.json()["keys"][name]["limits"]


def metric(gateway: Gateway | str, name: str, auth: str = "admin", **labels: str) -> float:
    """A sample of the gateway's ``/metrics`` (0 when it has none yet), read with key ``auth``."""
    text = get(gateway, "/metrics", auth).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, given = head.partition("{")
        if sample == name and ",".join(sorted(given.rstrip("}").split(","))) == wanted:
            return float(value)
    return 0.0


def wait_for(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds (bounded: :data:`TRIES` polls)."""
    for _ in range(TRIES):
        if check():
            return
        time.sleep(PAUSE)
    raise AssertionError(f"{what}: not seen in {TRIES} polls")


def error_of(answer: httpx.Response) -> dict[str, Any]:
    return answer.json()["error"]


# -- 1. requests per minute, across two serve processes ------------------------------------------


def _serve(config: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """``llmroute serve`` as a subprocess, and the URL it announced."""
    command = [sys.executable, "-m", "llmroute.cli", "serve", "--config", str(config)]
    command += ["--log-level", "warning"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the announcement, or "" when it exited
    if "listening on " not in line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"llmroute serve did not start: {line!r} {err[-2000:]!r}")
    return proc, line.split("listening on ", 1)[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_rpm_holds_across_two_serve_processes(
    redis_url: str, fast: Simulator, tmp_path: Path
) -> None:
    """A key limited to 6 requests a minute gets exactly 6, its requests alternating between
    two ``llmroute serve`` processes on one Redis; OpenAI's 429 and headers for the rest; a
    burst of concurrent requests on both at once gets exactly its limit too; another key is
    unaffected. The keys are in a ``keys_file`` that SIGHUP makes both processes read again."""
    keys_file = tmp_path / "keys.toml"
    tenants = (
        '[keys.alpha]\nenv = "GT_ALPHA"\nrpm = 6\n[keys.beta]\nenv = "GT_BETA"\n'
        '[keys.gamma]\nenv = "GT_GAMMA"\nrpm = 5\n'
    )
    _write(keys_file, tenants)
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.fast]\nbase_url = "{fast.base_url}"\napi_key_env = "GT_UP"\n'
        '[models.chat]\ntargets = ["fast:sim-small"]\n'
        f'[redis]\nurl = "{redis_url}"\nprefix = "tenants-{uuid.uuid4().hex[:8]}"\n'
        '[gateway]\nport = 0\nlimits_backend = "redis"\n'
        f'keys_file = "{keys_file}"\nkeys_reload_interval = "1h"\n'  # only SIGHUP reloads
    )
    env = {**os.environ, **ENVIRON, "GT_UP": "sk-tenants-upstream"}
    with ExitStack() as stack, ThreadPoolExecutor(max_workers=2) as pool:
        # Both start at once; each is stopped (SIGTERM, exit 0) when the test ends.
        starting = [pool.submit(_serve, config, env) for _ in range(2)]
        replicas: list[str] = []
        procs: list[subprocess.Popen[str]] = []
        codes: list[int] = []
        failed: BaseException | None = None
        for future in starting:
            try:
                proc, url = future.result(timeout=120)  # a hang guard only
            except Exception as exc:  # the other one is still stopped
                failed = exc
                continue
            stack.callback(lambda p=proc: codes.append(_stop(p)))
            procs.append(proc)
            replicas.append(url)
        if failed is not None:
            raise failed
        assert replicas[0] != replicas[1]

        answers = [post(replicas[i % 2], "alpha") for i in range(10)]
        statuses = [a.status_code for a in answers]
        assert statuses == [200] * 6 + [429] * 4
        assert [a.headers["x-ratelimit-remaining-requests"] for a in answers[:6]] == [
            "5",
            "4",
            "3",
            "2",
            "1",
            "0",
        ]
        for answer in answers:
            assert answer.headers["x-ratelimit-limit-requests"] == "6"
        for refused in answers[6:]:
            error = error_of(refused)
            assert error["code"] == "rate_limit_exceeded"
            assert error["type"] == "requests"
            assert refused.headers["x-ratelimit-remaining-requests"] == "0"
            # The wait until the oldest counted bucket leaves the window: at most 70 s.
            assert 1 <= int(refused.headers["retry-after"]) <= 70
            assert 0 < int(refused.headers["retry-after-ms"]) <= 70_000
            assert re.fullmatch(
                r"(\d+m)?\d+(\.\d+)?m?s", refused.headers["x-ratelimit-reset-requests"]
            )

        # Another key on the same replicas is unaffected (it has no limit of its own).
        assert [post(replicas[i % 2], "beta").status_code for i in range(8)] == [200] * 8

        # Twelve concurrent requests of a key limited to 5, six on each process: 5 admitted.
        with ThreadPoolExecutor(max_workers=12) as burst:
            statuses = list(
                burst.map(lambda i: post(replicas[i % 2], "gamma").status_code, range(12))
            )
        assert sorted(statuses) == [200] * 5 + [429] * 7

        # SIGHUP: each process reads its keys again (a new key, by its digest).
        assert post(replicas[0], "admin").status_code == 401
        _write(keys_file, tenants + f'[keys.admin]\nsha256 = "{_digest(KEYS["admin"])}"\n')
        for proc in procs:
            proc.send_signal(signal.SIGHUP)
        for replica in replicas:
            wait_for(lambda r=replica: post(r, "admin").status_code == 200, "the key added")
    assert codes == [0, 0]


# -- 2. tokens per minute: estimates corrected to the answers' usage ------------------------------


@pytest.fixture
def two_replicas(
    redis_url: str, fast: Simulator, slow: Simulator
) -> Iterator[tuple[Gateway, Gateway]]:
    """Two gateway threads on one Redis: ``alpha`` has 250 tokens a minute, ``beta`` a budget
    of 1 token every 2 s, ``gamma`` may use ``chat`` only, ``delta`` has 5,000 tokens a
    minute, ``admin`` reads usage. Routes ``chat``, ``other`` and ``slow``."""
    gateway = {
        "keys": keys("alpha", "beta", "gamma", "delta", "admin"),
        "tenants": {
            "alpha": {"tpm": 250},
            "beta": {"budget_tokens": 1, "budget_period": "2s"},
            "gamma": {"models": ["chat"]},
            "delta": {"tpm": 5000},
            "admin": {"admin": True},
        },
    }
    config = config_for(fast, gateway, redis=redis_url, more={"slow": slow})
    with ExitStack() as stack:
        first = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        second = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        yield first, second


def _usage_of(answer: httpx.Response) -> int:
    """The tokens an answer's ``usage`` counts (a stream's last usage chunk)."""
    if answer.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: {")]
        usage = [json.loads(e)["usage"] for e in events if json.loads(e).get("usage")]
        return usage[-1]["total_tokens"]
    return answer.json()["usage"]["total_tokens"]


def test_tpm_admits_on_estimates_and_counts_the_usage(
    two_replicas: tuple[Gateway, Gateway],
) -> None:
    """Each request is admitted on its estimate (prompt and ``max_tokens``) and counted, on
    both replicas, as its answer's usage once it ends: the key's tokens this minute are the
    sum of its answers' usage, and a request is refused exactly when that sum and its
    estimate are over the limit. One asking for more than the limit is refused outright."""
    first, second = two_replicas
    too_large = post(first, "alpha", max_tokens=251)
    assert too_large.status_code == 429
    assert error_of(too_large)["code"] == "rate_limit_exceeded"
    assert error_of(too_large)["type"] == "tokens"
    assert too_large.headers["x-should-retry"] == "false"
    assert "retry-after" not in too_large.headers
    assert limits_of(second, "alpha")["tokens_this_minute"] == 0  # it was not counted

    used = 0
    estimate = None
    admitted = 0
    for i in range(20):  # bounded: the limit is met within a few requests
        replica = (first, second)[i % 2]
        # Whole answers, streams with their usage, and streams whose client asked for none.
        kind = [{}, {"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}]
        answer = post(replica, "alpha", max_tokens=150, **kind[i % 3])
        if answer.status_code == 429:
            break
        assert answer.status_code == 200
        assert answer.headers["x-ratelimit-limit-tokens"] == "250"
        remaining = int(answer.headers["x-ratelimit-remaining-tokens"])
        if estimate is None:
            estimate = 250 - remaining  # nothing else was counted before it
            assert estimate > 150  # the prompt's estimate and max_tokens
        # Counted so far: the earlier answers' usage, not their estimates, and its estimate.
        assert remaining == 250 - used - estimate
        # A stream without usage for its client: the gateway still counts the vendor's (each
        # answer here is the same prompt and the same 20 tokens).
        used += _usage_of(answer) if i % 3 != 2 else used // admitted
        admitted += 1
        # The correction lands when the request ends (just after its answer is sent).
        other = (second, first)[i % 2]
        wait_for(
            lambda other=other, want=used: limits_of(other, "alpha")["tokens_this_minute"] == want,
            f"tokens counted as the usage ({used})",
        )
    else:
        raise AssertionError("no request was refused")
    assert estimate is not None
    assert error_of(answer)["code"] == "rate_limit_exceeded"
    assert error_of(answer)["type"] == "tokens"
    assert 1 <= int(answer.headers["retry-after"]) <= 70
    # Refused exactly when the usage counted and its estimate pass the limit...
    assert used + estimate > 250
    assert used - used // admitted + estimate <= 250
    # ... which, counted on estimates alone, would have been at the second request.
    assert 2 * estimate > 250
    assert admitted >= 3
    # Each replica's own usage of the key (GET /admin/usage?scope=replica, and its metrics)
    # holds the tokens of the answers it gave: together, all of them; the fleet's figures, on
    # either replica, are that sum.
    usages = [
        get(replica, "/admin/usage?scope=replica").json()["keys"]["alpha"]
        for replica in two_replicas
    ]
    assert sum(u["prompt_tokens"] + u["completion_tokens"] for u in usages) == used
    assert sum(u["completion_tokens"] for u in usages) == REPLY * admitted
    for replica in two_replicas:
        fleet = get(replica, "/admin/usage").json()
        assert fleet["scope"] == "fleet"
        alpha = fleet["keys"]["alpha"]
        assert alpha["prompt_tokens"] + alpha["completion_tokens"] == used
        assert alpha["requests"] == sum(u["requests"] for u in usages)
    counted = [
        metric(replica, "llmroute_gateway_tokens_total", key="alpha", kind=kind)
        for replica in two_replicas
        for kind in ("prompt", "completion")
    ]
    assert sum(counted) == used


def test_a_stream_cut_by_its_client_counts_what_was_delivered(
    two_replicas: tuple[Gateway, Gateway], slow: Simulator
) -> None:
    """A stream admitted on an estimate of 1,000 answer tokens, left by its client after a few:
    the key's tokens this minute are corrected to the prompt's estimate and the tokens the
    gateway delivered, far below the estimate."""
    first, second = two_replicas
    cancelled = slow.stats()["streams_cancelled"]
    read = 0
    with (
        httpx.Client(timeout=DEADLINE) as client,
        client.stream(
            "POST",
            first.base_url + "/chat/completions",
            json={"model": "slow", "messages": MESSAGES, "stream": True, "max_tokens": LONG},
            headers={"authorization": f"Bearer {KEYS['delta']}"},
        ) as reply,
    ):
        assert reply.status_code == 200
        estimate = 5000 - int(reply.headers["x-ratelimit-remaining-tokens"])
        prompt = estimate - LONG
        assert prompt > 0
        for line in reply.iter_lines():
            if line.startswith("data: {") and _tokens([line[6:]]):
                read += 1
                if read == 5:
                    break  # the client leaves
    assert limits_of(second, "delta")["tokens_this_minute"] in range(prompt + read, estimate + 1)
    wait_for(
        lambda: limits_of(second, "delta")["tokens_this_minute"] < estimate,
        "the estimate corrected",
    )
    counted = limits_of(second, "delta")["tokens_this_minute"]
    assert prompt + read <= counted < prompt + LONG // 2
    wait_for(lambda: slow.stats()["streams_cancelled"] == cancelled + 1, "upstream cancelled")


# -- 3. a budget spent, and renewed when its period ends ------------------------------------------


def test_budget_is_spent_and_renewed_at_the_periods_end(
    two_replicas: tuple[Gateway, Gateway],
) -> None:
    """``beta``'s budget (1 token every 2 s, periods aligned to multiples of 2 s since 1970)
    is spent by one request on one replica; the other replica refuses the next with OpenAI's
    ``insufficient_quota`` until the period ends, then admits again."""
    first, second = two_replicas
    for _ in range(3):  # bounded: a pair that straddled two periods is tried again
        # From the start of the next period: a budget no request of an earlier pair touched.
        time.sleep(2 - time.time() % 2 + 0.01)
        period = int(time.time() // 2)
        spent = post(first, "beta")
        refused = post(second, "beta")
        if int(time.time() // 2) == period:
            break
    else:
        raise AssertionError("three pairs of requests each took longer than a period")
    assert spent.status_code == 200
    assert refused.status_code == 429, refused.text
    error = error_of(refused)
    assert error["code"] == "insufficient_quota"
    assert error["type"] == "insufficient_quota"
    assert refused.headers["x-should-retry"] == "false"
    assert refused.headers["x-llmroute-budget-limit-tokens"] == "1"
    assert refused.headers["x-llmroute-budget-remaining-tokens"] == "0"
    assert 1 <= int(refused.headers["retry-after"]) <= 2

    statuses: list[int] = []
    for _ in range(TRIES):  # bounded: the period ends within 2 s
        answer = post((first, second)[len(statuses) % 2], "beta")
        statuses.append(answer.status_code)
        if answer.status_code == 200:
            break
        assert error_of(answer)["code"] == "insufficient_quota"
        time.sleep(PAUSE)
    assert statuses[-1] == 200
    assert set(statuses[:-1]) <= {429}
    assert int(time.time() // 2) > period  # renewed in a later period, not before


def test_a_huge_max_tokens_is_counted_on_every_replica_not_taken_for_an_outage(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``max_tokens=10**18`` on keys with Redis limits but no ``tpm``. It once reached the
    admission script as ``1e+18``, which HINCRBY refuses, and the error was read as Redis
    down: under ``refuse`` a 503; a budget of 100 tokens streamed 120 while the shared
    ``budget_spent`` stayed 0, and the other replica admitted the next request. Now it is
    counted clamped, corrected to the usage, shared, and nothing is logged as an outage."""
    gateway = {
        "keys": keys("alpha", "beta", "admin"),
        "tenants": {
            "alpha": {"rpm": 100},
            "beta": {"budget_tokens": 100, "budget_period": "8760h"},
            "admin": {"admin": True},
        },
        "limits_on_redis_error": "refuse",
    }
    caplog.set_level(logging.INFO, logger="llmroute.server")
    with (
        Simulator(profile=Profile(reply_tokens=120), tls=False) as long_answers,
        ExitStack() as stack,
    ):
        config = config_for(long_answers, gateway, redis=redis_url)
        first = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        second = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        answer = post(first, "alpha", max_tokens=10**18)
        assert answer.status_code == 200, answer.text
        used = _usage_of(answer)
        wait_for(
            lambda: limits_of(second, "alpha")["tokens_this_minute"] == used,
            "the answer's tokens counted in Redis",
        )
        assert limits_of(second, "alpha")["requests_this_minute"] == 1

        streamed = post(
            first,
            "beta",
            max_tokens=10**18,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert streamed.status_code == 200, streamed.text
        spent = _usage_of(streamed)
        assert spent > 100  # the 120 tokens of the answer: past the budget, by what it used
        wait_for(lambda: limits_of(second, "beta")["budget_spent"] == spent, "the budget spent")
        refused = post(second, "beta")
        assert refused.status_code == 429, refused.text
        assert error_of(refused)["code"] == "insufficient_quota"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


# -- 4. model permissions -------------------------------------------------------------------------


def test_a_key_sees_and_uses_only_its_models(two_replicas: tuple[Gateway, Gateway]) -> None:
    first, _ = two_replicas
    refused = post(first, "gamma", model="other")
    assert refused.status_code == 404
    assert error_of(refused)["code"] == "model_not_found"
    assert post(first, "gamma", model="chat").status_code == 200
    listed = get(first, "/v1/models", "gamma").json()["data"]
    assert [m["id"] for m in listed] == ["chat"]
    assert get(first, "/v1/models/chat", "gamma").status_code == 200
    hidden = get(first, "/v1/models/other", "gamma")
    assert hidden.status_code == 404
    assert error_of(hidden)["code"] == "model_not_found"
    # As if it did not exist: the same answer as for a name no route has.
    missing = get(first, "/v1/models/nowhere", "gamma")
    assert error_of(hidden)["message"].replace("other", "nowhere") == error_of(missing)["message"]
    # A near miss is answered as the SDK does, naming only a route the key may use.
    typo = post(first, "gamma", model="caht")
    assert typo.status_code == 404
    assert error_of(typo)["code"] == "model_not_found"
    assert "did you mean 'chat'?" in error_of(typo)["message"]
    near_hidden = error_of(post(first, "gamma", model="othr"))["message"]
    assert "other" not in near_hidden.replace("othr", "")
    assert "did you mean" not in near_hidden
    assert "did you mean 'other'?" in error_of(post(first, "alpha", model="othr"))["message"]
    assert "did you mean 'chat'?" in error_of(get(first, "/v1/models/caht", "gamma"))["message"]
    # Another key may use them all.
    listed = get(first, "/v1/models", "alpha").json()["data"]
    assert sorted(m["id"] for m in listed) == ["chat", "other", "slow"]
    assert post(first, "alpha", model="other", max_tokens=5).status_code == 200
    # Only an admin key reads the usage.
    assert get(first, "/admin/usage", "gamma").status_code == 403


def test_a_tier_the_key_may_not_use_is_not_found(fast: Simulator) -> None:
    """A tiered name the key may use, forced (``llmroute.tier``) to a tier whose route it may
    not use: 404, as for that route itself."""
    pytest.importorskip("wordllama")
    config = config_for(fast, {"keys": keys("gamma"), "tenants": {"gamma": {}}})
    config["models"]["auto"] = {
        "tiers": {"simple": "chat", "hard": "other"},
        "default": "chat",
        "classes": {
            "simple": {"examples": ["hi", "what time is it?"]},
            "hard": {"examples": ["prove the theorem", "write a compiler"]},
        },
    }
    config["gateway"]["tenants"]["gamma"] = {"models": ["auto", "chat"]}
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
        for tier in ("hard", "other"):  # by its class, or by its route's name
            forced = post(gateway, "gamma", model="auto", llmroute={"tier": tier})
            assert forced.status_code == 404
            assert error_of(forced)["code"] == "model_not_found"
        allowed = post(gateway, "gamma", model="auto", llmroute={"tier": "simple"})
        assert allowed.status_code == 200, allowed.text
        listed = get(gateway, "/v1/models", "gamma").json()["data"]
        assert sorted(m["id"] for m in listed) == ["auto", "chat"]


# -- 5. the 429 headers, as openai's own client reads them -----------------------------------------


class _Sleeps:
    """``time`` for openai's client: its retry sleeps recorded, not slept."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> _Sleeps:
    import openai._base_client as base  # pyright: ignore[reportPrivateUsage]

    recorded = _Sleeps()
    monkeypatch.setattr(base, "time", recorded)
    return recorded


def _openai_client(gateway: Gateway, key: str) -> tuple[openai.OpenAI, list[httpx.Response]]:
    """openai's own client, ``max_retries=1``; the responses it received, recorded."""
    seen: list[Any] = []
    http = openai.DefaultHttpxClient(event_hooks={"response": [seen.append]})
    client = openai.OpenAI(
        base_url=gateway.base_url, api_key=KEYS[key], max_retries=1, http_client=http
    )
    return client, seen


def _ask(client: openai.OpenAI, **fields: Any) -> Any:
    messages: Any = MESSAGES
    return client.chat.completions.create(model="chat", messages=messages, **fields)


def test_openais_client_backs_off_as_the_429_tells(
    redis_url: str, fast: Simulator, sleeps: _Sleeps
) -> None:
    """Over its RPM, openai's client retries once after exactly the wait the gateway gave
    (``retry-after-ms``), so the gateway sees 2 requests for the call; asking too much, or
    over its budget (``x-should-retry: false``), the client sends 1 and does not wait.

    openai 2.x and 3.x honour a server's wait up to ``MAX_RETRY_AFTER_DELAY`` (120 s) and
    retry no sooner; a longer one, they do not retry at all. The gateway's RPM wait is at most
    70 s (the oldest bucket leaving the window), and the budget's period here is 120 s, so
    for the budget it is ``x-should-retry: false`` alone that stops the retry."""
    from openai._constants import MAX_RETRY_AFTER_DELAY  # pyright: ignore[reportPrivateUsage]

    gateway_settings = {
        "keys": keys("alpha", "beta", "admin"),
        "tenants": {
            "alpha": {"rpm": 1, "tpm": 1000},
            "beta": {"budget_tokens": 1, "budget_period": "120s"},
            "admin": {"admin": True},
        },
    }
    config = config_for(fast, gateway_settings, redis=redis_url)
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
        client, seen = _openai_client(gateway, "alpha")
        with client:
            # More than the key's tokens per minute (x-should-retry: false, no wait): 1 request.
            with pytest.raises(openai.RateLimitError) as caught:
                _ask(client, max_tokens=5000)
            assert caught.value.code == "rate_limit_exceeded"
            assert [r.status_code for r in seen] == [429]
            assert sleeps.asked == []

            _ask(client)  # the key's one request this minute (the refusal above did not count)
            seen.clear()
            with pytest.raises(openai.RateLimitError) as caught:
                _ask(client)
            assert [r.status_code for r in seen] == [429, 429]
            told = int(seen[0].headers["retry-after-ms"]) / 1000
            assert 0 < told <= 70 <= MAX_RETRY_AFTER_DELAY
            assert sleeps.asked == [told]  # waited as told, once
            assert caught.value.code == "rate_limit_exceeded"
            rejected = metric(gateway, REJECTIONS, key="alpha", reason="requests")
            assert rejected == 2  # the gateway saw both

        sleeps.asked.clear()
        client, seen = _openai_client(gateway, "beta")
        with client:
            if time.time() % 120 > 118:  # the two calls in one period: wait for the next
                time.sleep(120 - time.time() % 120)
            _ask(client)
            seen.clear()
            with pytest.raises(openai.RateLimitError) as caught:
                _ask(client)
            assert caught.value.code == "insufficient_quota"
            assert [r.status_code for r in seen] == [429]
            assert seen[0].headers["x-should-retry"] == "false"
            assert 0 < int(seen[0].headers["retry-after"]) <= MAX_RETRY_AFTER_DELAY
            assert sleeps.asked == []
            assert metric(gateway, REJECTIONS, key="beta", reason="budget") == 1


# -- 6. keys added and revoked by a reload, while streams run --------------------------------------


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _write(path: Path, text: str) -> None:
    """Replace the file whole (a new inode), as an editor or a deploy tool does."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def _read_stream(gateway: Gateway, key: str, model: str) -> tuple[int, list[str]]:
    """A streamed request's status and its SSE data lines, read to the end."""
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST",
            gateway.base_url + "/chat/completions",
            json={"model": model, "messages": MESSAGES, "stream": True},
            headers={"authorization": f"Bearer {KEYS[key]}"},
        ) as reply,
    ):
        return reply.status_code, [
            line[6:] for line in reply.iter_lines() if line.startswith("data: ")
        ]


def _tokens(events: list[str]) -> int:
    count = 0
    for event in events:
        if event.startswith("{") and '"choices"' in event:
            choices = json.loads(event)["choices"]
            if choices and choices[0]["delta"].get("content"):
                count += 1
    return count


@pytest.mark.parametrize("revoked_streams", ["finish", "cut"])
def test_a_reload_adds_and_revokes_keys_while_streams_run(
    fast: Simulator, held: Simulator, slow: Simulator, tmp_path: Path, revoked_streams: str
) -> None:
    """``keys_file`` rewritten: ``alpha`` revoked, ``beta`` added. ``beta`` is accepted within
    a bounded wait, ``alpha``'s new requests get 401; its streams in flight finish whole
    (``finish``) or end with a ``key_revoked`` error event (``cut``); ``gamma``'s stream in
    flight (by its SHA-256 digest, unchanged) is not touched by the reload."""
    keys_file = tmp_path / "keys.toml"
    gamma = f'[keys.gamma]\nsha256 = "{_digest(KEYS["gamma"])}"\n'
    _write(keys_file, f'[keys.alpha]\nenv = "GT_ALPHA"\n{gamma}')
    settings = {
        "keys_file": str(keys_file),
        "keys_reload_interval": "50ms",
        "revoked_streams": revoked_streams,
    }
    config = config_for(fast, settings, more={"held": held, "slow": slow})
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway, ThreadPoolExecutor(4) as pool:
        assert post(gateway, "alpha").status_code == 200
        assert post(gateway, "beta").status_code == 401
        # In flight over the reload: one stream of each key held before its first token ...
        waiting: dict[str, Future[tuple[int, list[str]]]] = {
            name: pool.submit(_read_stream, gateway, name, "held") for name in ("alpha", "gamma")
        }
        wait_for(lambda: held.stats()["held"] == 2, "two streams held")
        # ... and one of alpha's already streaming, a token every 10 ms: 1,000 tokens when it
        # is to be cut (in flight long after the reload), 100 when it is to finish (the held
        # streams show in any case that a revoked key's stream in flight is not cut).
        length = LONG if revoked_streams == "cut" else SHORT
        cancelled = slow.stats()["streams_cancelled"]
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST",
                gateway.base_url + "/chat/completions",
                json={"model": "slow", "messages": MESSAGES, "stream": True, "max_tokens": length},
                headers={"authorization": f"Bearer {KEYS['alpha']}"},
            ) as streaming,
        ):
            assert streaming.status_code == 200
            lines = streaming.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            assert json.loads(first[6:])["object"] == "chat.completion.chunk"

            _write(keys_file, f'[keys.beta]\nenv = "GT_BETA"\n{gamma}')
            wait_for(lambda: post(gateway, "beta").status_code == 200, "beta accepted")
            revoked = post(gateway, "alpha")
            assert revoked.status_code == 401
            assert error_of(revoked)["code"] == "invalid_api_key"
            rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert held.release() >= 1

        status, events = waiting["gamma"].result(timeout=60)  # a hang guard only
        assert status == 200
        assert events[-1] == "[DONE]"
        assert _tokens(events) == REPLY
        status, events = waiting["alpha"].result(timeout=60)
        if revoked_streams == "finish":
            assert status == 200
            assert events[-1] == "[DONE]"
            assert _tokens(events) == REPLY
            assert rest[-1] == "[DONE]"
            assert _tokens([first[6:], *rest]) == SHORT
        else:
            assert status == 401  # cut before its answer began
            assert "[DONE]" not in rest
            assert json.loads(rest[-1])["error"]["code"] == "key_revoked"
            assert _tokens([first[6:], *rest]) < LONG
            # Its upstream stream was cancelled too, not left running.
            wait_for(
                lambda: slow.stats()["streams_cancelled"] == cancelled + 1, "upstream cancelled"
            )
        assert metric(gateway, "llmroute_gateway_key_reloads_total", "gamma", result="ok") == 1
        assert metric(gateway, "llmroute_gateway_keys", "gamma") == 2


@pytest.mark.parametrize("revoked_streams", ["finish", "cut"])
def test_a_request_whose_body_was_arriving_when_its_key_was_revoked(
    fast: Simulator, tmp_path: Path, revoked_streams: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request authenticated, its body still arriving, when a reload revokes its key: with
    ``cut`` it is refused (401) as the key's streams in flight are cut; with ``finish`` it is
    answered, as they finish."""
    keys_file = tmp_path / "keys.toml"
    _write(keys_file, '[keys.alpha]\nenv = "GT_ALPHA"\n')
    settings = {
        "keys_file": str(keys_file),
        "keys_reload_interval": "50ms",
        "revoked_streams": revoked_streams,
    }
    config = config_for(fast, settings)
    body = json.dumps({"model": "chat", "messages": MESSAGES}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {KEYS['alpha']}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    with (
        Gateway(config, environ=ENVIRON, max_retries=0) as gateway,
        socket.create_connection(("127.0.0.1", gateway.port), timeout=DEADLINE) as sock,
    ):
        app = gateway.app
        authenticated = threading.Event()  # set when the gateway has authenticated it
        check = app.door.authenticate

        def seen(headers: Any, exchange: Any) -> Any:
            tenant = check(headers, exchange)
            if headers.get("content-length") == str(len(body)):
                authenticated.set()
            return tenant

        monkeypatch.setattr(app.door, "authenticate", seen)
        sock.sendall(head + body[:10])  # the rest of its body to come
        assert authenticated.wait(DEADLINE)  # a hang guard only
        _write(keys_file, '[keys.beta]\nenv = "GT_BETA"\n')
        wait_for(lambda: post(gateway, "beta").status_code == 200, "beta accepted")
        sock.sendall(body[10:])
        answer = b""
        for _ in range(TRIES):  # bounded: the status line comes in one or a few reads
            answer += sock.recv(4096)
            if b"\r\n" in answer:
                break
    status = int(answer.split(b" ", 2)[1])
    assert status == (401 if revoked_streams == "cut" else 200)


def test_a_reload_changes_a_keys_limits_and_rotates_a_key(fast: Simulator, tmp_path: Path) -> None:
    """Re-limited on a reload, a key keeps what it counted and gets its new limit; a key whose
    digest changed (rotated) is accepted by its new value only."""
    rotated = "gw-tenant-alpha-rotated-0123456789"
    keys_file = tmp_path / "keys.toml"
    beta = f'[keys.beta]\nsha256 = "{_digest(KEYS["beta"])}"\n'
    _write(keys_file, f'[keys.alpha]\nsha256 = "{_digest(KEYS["alpha"])}"\n{beta}rpm = 2\n')
    config = config_for(fast, {"keys_file": str(keys_file), "keys_reload_interval": "50ms"})
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
        assert [post(gateway, "beta").status_code for _ in range(3)] == [200, 200, 429]
        _write(keys_file, f'[keys.alpha]\nsha256 = "{_digest(rotated)}"\n{beta}rpm = 4\n')
        wait_for(lambda: post(gateway, rotated).status_code == 200, "the rotated key accepted")
        assert post(gateway, "alpha").status_code == 401
        answers = [post(gateway, "beta") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert answers[0].headers["x-ratelimit-limit-requests"] == "4"
        assert answers[0].headers["x-ratelimit-remaining-requests"] == "1"


# -- 7. Redis unreachable, under both policies ----------------------------------------------------


class OwnRedis:
    """A redis-server of one test's own, to stop (an outage) and start again on its port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.binary, self.workdir = binary, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        for _ in range(5):  # a port taken before redis-server bound it: another
            self.port = redis_server._free_port()  # pyright: ignore[reportPrivateUsage]
            if self.start():
                break
        else:
            raise RuntimeError("redis-server could not bind a free loopback port in 5 tries")
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> bool:
        """Whether it started on its port (False: the port was taken meanwhile)."""
        self.proc = redis_server._start(self.binary, self.port, self.workdir)  # pyright: ignore[reportPrivateUsage]
        if redis_server._wait_ready(self.port, self.proc, time.monotonic() + 60):  # pyright: ignore[reportPrivateUsage]
            return True
        self.stop()
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            redis_server._stop(self.proc)  # pyright: ignore[reportPrivateUsage]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("policy", ["local", "refuse"])
def test_a_redis_outage_follows_the_operators_policy(
    fast: Simulator, own_redis: OwnRedis, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stops mid-run. ``local``: the replica counts in its own memory (a key's RPM
    still holds, per replica); ``refuse``: 503 ``limits_unavailable`` with ``retry-after``.
    Either way the outage is logged once, however many requests meet it. Redis back, the
    limits are counted there again."""
    gateway_settings = {
        "keys": keys("alpha", "admin"),
        "tenants": {"alpha": {"rpm": 3}, "admin": {"admin": True}},
        "limits_on_redis_error": policy,
    }
    config = config_for(fast, gateway_settings, redis=own_redis.url)
    config["redis"]["timeout"] = 1.0
    caplog.set_level(logging.INFO, logger="llmroute.server")
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
        assert post(gateway, "alpha").status_code == 200  # counted in Redis
        assert limits_of(gateway, "alpha")["requests_this_minute"] == 1
        caplog.clear()
        own_redis.stop()
        answers = [post(gateway, "alpha") for _ in range(5)]
        if policy == "local":
            # Counted afresh in this replica's memory: its whole limit, then 429.
            assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
            assert error_of(answers[-1])["code"] == "rate_limit_exceeded"
        else:
            assert [a.status_code for a in answers] == [503] * 5
            for answer in answers:
                assert error_of(answer)["code"] == "limits_unavailable"
                assert answer.headers["retry-after"] == "1"
        messages = [r.getMessage() for r in caplog.records]
        warnings = [m for m in messages if "Redis unreachable" in m]
        # One script takes the slot and counts the limits: one warning for the outage.
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("gateway limits"), warnings
        assert all(own_redis.url not in m for m in messages)

        # Redis back (empty: it keeps nothing on disk): counted there again, from 0.
        assert own_redis.start()
        wait_for(lambda: post(gateway, "alpha").status_code == 200, "Redis used again")
        assert limits_of(gateway, "alpha")["requests_this_minute"] == 1
        again = [post(gateway, "alpha").status_code for _ in range(3)]
        assert again == [200, 200, 429]
        assert limits_of(gateway, "alpha")["requests_this_minute"] == 3


@contextmanager
def port_nobody_listens_on() -> Iterator[int]:
    """A loopback port bound but not listening: a connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.parametrize("policy", ["local", "refuse"])
def test_redis_unreachable_from_the_start(
    fast: Simulator, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmroute.server")
    with port_nobody_listens_on() as port:
        settings = {
            "keys": keys("alpha"),
            "tenants": {"alpha": {"rpm": 3}},
            "limits_on_redis_error": policy,
        }
        config = config_for(fast, settings, redis=f"redis://127.0.0.1:{port}/0")
        with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
            answers = [post(gateway, "alpha") for _ in range(4)]
    if policy == "local":
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
    else:
        assert [a.status_code for a in answers] == [503] * 4
        assert {error_of(a)["code"] for a in answers} == {"limits_unavailable"}
    warnings = [r.getMessage() for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len([w for w in warnings if w.startswith("gateway limits")]) == 1, warnings


# -- 8. bad settings are sentences -----------------------------------------------------------------

PASTED = "sk-live-ThisIsAKeyPastedByMistake0123456789"


@pytest.mark.parametrize(
    ("table", "field", "said"),
    [
        ('env = "GT_ALPHA"\nrpm = -1\n', "rpm", "expected a number at least 1, got -1"),
        ('env = "GT_ALPHA"\nmodels = ["chat", "chta"]\n', "models", "'chta' is not a model name"),
        ('env = "GT_ALPHA"\nbudget_tokens = 1000\n', "budget_period", "needs a budget_period"),
        (f'sha256 = "{PASTED}"\n', "sha256", "not the key"),
    ],
)
def test_a_bad_keys_file_is_refused_with_a_sentence(
    fast: Simulator, tmp_path: Path, table: str, field: str, said: str
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f"[keys.app]\n{table}")
    config = config_for(fast, {"keys_file": str(keys_file)})
    with pytest.raises(ConfigError) as caught:
        GatewayApp(config, environ=ENVIRON)
    message = str(caught.value)
    assert str(keys_file) in message
    assert "keys.app" in message
    assert field in message
    assert said in message
    assert PASTED not in message and PASTED[3:20] not in message


@pytest.mark.parametrize(
    "text",
    [
        f"[keys.{PASTED}]\nrpm = -1\n",  # a name that is a key, in a table with a mistake
        f'[keys."{PASTED}/{PASTED}"]\nenv = "GT_ALPHA"\n',  # no name at all (too long, a '/')
        f'{PASTED} = "app"\n',  # not even in [keys]
    ],
    ids=["a-key-as-a-name", "no-name", "top-level"],
)
def test_a_key_pasted_as_a_name_is_not_shown(fast: Simulator, tmp_path: Path, text: str) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(text)
    config = config_for(fast, {"keys_file": str(keys_file)})
    with pytest.raises(ConfigError) as caught:
        GatewayApp(config, environ=ENVIRON)
    message = str(caught.value)
    assert message.startswith(f"{keys_file}: ")
    assert "name" in message
    assert PASTED not in message and PASTED[3:20] not in message


@pytest.mark.parametrize(
    "gateway",
    [
        {"keys": {"app": "GT_ALPHA"}, "tenants": {PASTED: {"rpm": 1}}},
        {"keys": {"app": "GT_ALPHA"}, "tenants": {PASTED * 2: {"rpm": 1}}},
        {"keys": {PASTED * 2: "GT_ALPHA"}},
    ],
    ids=["a-tenant-named-by-a-key", "a-tenant-with-no-name", "a-key-with-no-name"],
)
def test_a_key_pasted_as_a_name_in_the_config_is_not_shown(gateway: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"gateway": gateway})
    message = str(caught.value)
    assert "gateway" in message and "name" in message
    assert PASTED not in message and PASTED[3:20] not in message


def test_serve_with_a_bad_keys_file_says_so_and_exits_2(
    fast: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f'[keys.app]\nsha256 = "{PASTED}"\n')
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.fast]\nbase_url = "{fast.base_url}"\napi_key = "sk-tenants-upstream"\n'
        '[models.chat]\ntargets = ["fast:sim-small"]\n'
        f'[gateway]\nport = 0\nkeys_file = "{keys_file}"\n'
    )
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmroute serve: ")
    assert f"{keys_file}: keys.app.sha256" in err
    assert "Traceback" not in err
    assert PASTED not in err and PASTED[3:20] not in err
    assert len(err.strip().splitlines()) == 1


def test_a_reload_of_a_broken_keys_file_keeps_the_keys(
    fast: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistake in the rewritten file: the keys before stay, the mistake is logged once as a
    sentence (naming the key and field, not the key) and counted; the file fixed, it loads."""
    keys_file = tmp_path / "keys.toml"
    _write(keys_file, '[keys.alpha]\nenv = "GT_ALPHA"\n')
    config = config_for(fast, {"keys_file": str(keys_file), "keys_reload_interval": "50ms"})
    caplog.set_level(logging.INFO, logger="llmroute.server")
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
        _write(
            keys_file,
            f'[keys.alpha]\nenv = "GT_ALPHA"\nrpm = -5\n[keys.beta]\nsha256 = "{PASTED}"\n',
        )
        wait_for(
            lambda: (
                metric(gateway, "llmroute_gateway_key_reloads_total", "alpha", result="error") == 1
            ),
            "a failed reload counted",
        )
        assert post(gateway, "alpha").status_code == 200  # the keys before stay
        assert post(gateway, "beta").status_code == 401
        # The broken file, checked every 50 ms meanwhile, was reported once (below); fixed:
        _write(keys_file, '[keys.alpha]\nenv = "GT_ALPHA"\n[keys.beta]\nenv = "GT_BETA"\n')
        wait_for(lambda: post(gateway, "beta").status_code == 200, "the fixed file loaded")
        assert metric(gateway, "llmroute_gateway_key_reloads_total", "alpha", result="error") == 1
        assert metric(gateway, "llmroute_gateway_key_reloads_total", "alpha", result="ok") == 1
    failed = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(failed) == 1
    assert f"{keys_file}: keys.alpha.rpm" in failed[0]
    assert PASTED not in caplog.text and PASTED[3:20] not in caplog.text
