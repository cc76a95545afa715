"""The gateway's admin API for keys and teams, on two replicas sharing one real redis-server
(each a :class:`~llmroute.server.Gateway` with its own event loop, app, client and counters):
a key made on one replica works on the other, a rotated key's old value stops at the end of
its overlap, expired and revoked keys get 401, a team's limits hold across its keys on both
replicas exactly, usage is the fleet's on either, and a request pays one Redis round trip
before its first token whatever its limits.

Time is a :class:`~tests.clock.FakeClock` where it matters (expiry, overlap); every wait is a
loop bounded in count, and the propagation of a change is counted in the other replica's polls
of the store, never in seconds.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from llmroute.server import Gateway
from llmroute.testing import Simulator
from tests.clock import FakeClock
from tests.server.test_gateway_tenants import (
    DEADLINE,
    ENVIRON,
    KEYS,
    REPLY,
    config_for,
    error_of,
    fast,  # noqa: F401  (a fixture)
    held,  # noqa: F401  (a fixture)
    keys,
    metric,
    post,
    root,
    wait_for,
)


@pytest.fixture
def replicas(redis_url: str, fast: Simulator, held: Simulator) -> Iterator[tuple[Gateway, Gateway]]:  # noqa: F811
    """Two replicas on one Redis: ``admin`` manages keys, ``alpha`` is a plain key; routes
    ``chat``, ``other`` and ``held`` (whose streams wait before their first token)."""
    gateway = {
        "keys": keys("alpha", "admin"),
        "tenants": {"admin": {"admin": True}},
        "teams": {"declared": {"rpm": 1000}},
    }
    config = config_for(fast, gateway, redis=redis_url, more={"held": held})
    with ExitStack() as stack:
        first = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        second = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        yield first, second


def admin(
    gateway: Gateway, method: str, path: str, body: Any = None, key: str = "admin"
) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEYS.get(key, key)}"}
    with httpx.Client(timeout=DEADLINE) as client:
        return client.request(method, root(gateway) + path, json=body, headers=headers)


def create(gateway: Gateway, name: str, **settings: Any) -> str:
    """Make key ``name``; its secret."""
    made = admin(gateway, "POST", "/admin/keys", {"name": name, **settings})
    assert made.status_code == 201, made.text
    return made.json()["key"]


def polls(gateway: Gateway) -> list[object]:
    """Record the versions each of the replica's polls of the key store read."""
    store = gateway.app._store  # pyright: ignore[reportPrivateUsage]
    seen: list[object] = []
    own = store.version

    async def counted() -> object:
        version = await own()
        seen.append(version)
        return version

    store.version = counted  # type: ignore[method-assign]
    return seen


# -- 1. a key made on one replica works on every replica --------------------------------------


def test_a_key_made_on_one_replica_works_on_the_other_at_its_next_poll(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, second = replicas
    seen = polls(second)
    secret = create(first, "web", rpm=100)
    assert post(first, secret).status_code == 200  # at once where it was made
    made_at = len(seen)
    wait_for(lambda: post(second, secret).status_code == 200, "the key on the other replica")
    # The other replica took it at the first or second poll after it was made (the one in
    # flight may have read before): keys_sync_interval is 0.25 s, so within half a second.
    version = int(seen[-1])  # type: ignore[call-overload]
    first_new = next(i for i, v in enumerate(seen) if v == version)
    assert first_new - made_at <= 1
    # Only its digest is anywhere: the store's record, the list, the usage.
    listed = admin(second, "GET", "/admin/keys").json()
    web = next(k for k in listed["data"] if k["name"] == "web")
    assert web["source"] == "api" and web["prefix"] == secret[:12]
    assert web["limits"] == {"rpm": 100}
    for text in (json.dumps(listed), admin(first, "GET", "/admin/usage").text):
        assert secret not in text
        assert hashlib.sha256(secret.encode()).hexdigest() not in text


# -- 2. rotation, expiry, revocation ----------------------------------------------------------


def _clock(*gateways: Gateway) -> FakeClock:
    clock = FakeClock(time.time())
    for gateway in gateways:
        gateway.app.clock = clock
    return clock


def test_a_rotated_keys_old_value_stops_at_the_end_of_its_overlap(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, second = replicas
    clock = _clock(first, second)
    old = create(first, "rotating")
    rotated = admin(first, "POST", "/admin/keys/rotating/rotate", {"overlap": "10m"})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["key"]
    assert new != old and rotated.json()["previous_valid_until"] == clock.now + 600
    assert rotated.headers["cache-control"] == "no-store"
    wait_for(lambda: post(second, new).status_code == 200, "the new value on the other replica")
    clock.advance(599)
    for replica in replicas:  # both values, on both replicas, within the overlap
        assert post(replica, old).status_code == 200
        assert post(replica, new).status_code == 200
    clock.advance(1)  # the overlap's end
    for replica in replicas:
        refused = post(replica, old)
        assert refused.status_code == 401
        assert error_of(refused)["code"] == "invalid_api_key"
        assert post(replica, new).status_code == 200
    # Without an overlap the old value stops at once.
    newer = admin(second, "POST", "/admin/keys/rotating/rotate", {}).json()["key"]
    assert post(second, new).status_code == 401
    assert post(second, newer).status_code == 200


def test_an_expired_key_gets_the_401_of_an_unknown_key(replicas: tuple[Gateway, Gateway]) -> None:
    first, second = replicas
    clock = _clock(first, second)
    secret = create(first, "temporary", expires_at=clock.now + 60)
    wait_for(lambda: post(second, secret).status_code == 200, "the key on the other replica")
    clock.advance(60)
    unknown = post(first, "gw-nobody-0123456789")
    for replica in replicas:
        expired = post(replica, secret)
        assert expired.status_code == 401
        assert expired.json() == unknown.json()  # nothing says it existed
        assert expired.headers["www-authenticate"] == unknown.headers["www-authenticate"]
    listed = admin(first, "GET", "/admin/keys/temporary").json()
    assert listed["expired"] is True
    # Its expiry lifted: accepted again.
    assert admin(first, "PATCH", "/admin/keys/temporary", {"expires_at": None}).status_code == 200
    assert post(first, secret).status_code == 200


def test_a_revoked_key_gets_401_on_every_replica(replicas: tuple[Gateway, Gateway]) -> None:
    first, second = replicas
    secret = create(first, "leaving")
    wait_for(lambda: post(second, secret).status_code == 200, "the key on the other replica")
    revoked = admin(second, "DELETE", "/admin/keys/leaving")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert post(second, secret).status_code == 401
    wait_for(lambda: post(first, secret).status_code == 401, "the revocation on the other replica")
    assert admin(first, "GET", "/admin/keys/leaving").status_code == 404
    # Declared keys are changed where they are declared.
    refused = admin(first, "DELETE", "/admin/keys/alpha")
    assert refused.status_code == 409 and error_of(refused)["code"] == "key_declared"


def test_an_unknown_field_is_named_in_at_most_40_characters(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, _ = replicas
    long = "x" * 100_000
    refused = admin(first, "POST", "/admin/keys", {"name": "web", long: 1})
    assert refused.status_code == 400
    error = error_of(refused)
    assert error["param"] == "x" * 37 + "..."
    assert len(error["message"]) < 120, error["message"]


# -- 3. teams ------------------------------------------------------------------------------------


def test_a_team_budget_holds_across_two_keys_on_two_replicas_exactly(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, second = replicas
    assert admin(first, "PUT", "/admin/teams/ml", {"rpm": 5}).status_code == 200
    one = create(first, "ml-one", team="ml")
    two = create(first, "ml-two", team="ml", rpm=100)
    for secret in (one, two):
        wait_for(lambda s=secret: post(second, s).status_code == 200, "the keys on both replicas")
    # Two requests spent; the team's other 3 go to whichever key and replica comes first.
    answers = [post(replicas[i % 2], (one, two)[i // 2 % 2]) for i in range(8)]
    assert [a.status_code for a in answers] == [200] * 3 + [429] * 5
    refused = answers[-1]
    assert error_of(refused)["code"] == "rate_limit_exceeded"
    assert "team 'ml'" in error_of(refused)["message"]
    assert refused.headers["x-ratelimit-limit-requests"] == "5"  # the tighter: the team's
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # Another team's keys are unaffected.
    assert admin(first, "PUT", "/admin/teams/ops", {"rpm": 3}).status_code == 200
    other = create(second, "ops-one", team="ops")
    assert post(second, other).status_code == 200


def test_a_team_token_budget_is_exact_across_keys_and_replicas(
    replicas: tuple[Gateway, Gateway],
) -> None:
    """Requests one after another, alternating keys and replicas: admitted while the team has
    budget left, so exactly ceil(budget / tokens per answer); then OpenAI's
    ``insufficient_quota``."""
    first, second = replicas
    probe = post(first, "alpha")
    per = probe.json()["usage"]["total_tokens"]
    budget = 3 * per + 1
    team = {"budget_tokens": budget, "budget_period": "day", "soft_limit": 0.5}
    assert admin(first, "PUT", "/admin/teams/paid", team).status_code == 200
    members = [create(first, f"paid-{i}", team="paid") for i in range(2)]
    for secret in members:
        wait_for(lambda s=secret: post(second, s, max_tokens=1).status_code == 200, "both")

    # Two requests of max_tokens 1 spent some: start the count from the team's counters.
    def spent_now() -> int:
        team = admin(first, "GET", "/admin/usage").json()["teams"]["paid"]
        return team["limits"]["budget_spent"]

    spent = spent_now()
    statuses = []
    for i in range(8):
        statuses.append(post(replicas[i % 2], members[i // 2 % 2]).status_code)
        if statuses[-1] == 200:  # its usage counted (when it ended) before the next one
            want = spent + statuses.count(200) * per
            wait_for(lambda w=want: spent_now() == w, "the answer's usage counted")
    admitted = statuses.count(200)
    assert statuses == [200] * admitted + [429] * (8 - admitted)
    assert admitted == -(-(budget - spent) // per)  # ceil
    refused = post(first, members[0])
    assert error_of(refused)["code"] == "insufficient_quota"
    assert refused.headers["x-should-retry"] == "false"
    usage = admin(second, "GET", "/admin/usage").json()["teams"]["paid"]
    assert usage["keys"] == ["paid-0", "paid-1"]
    assert usage["limits"]["budget_spent"] == spent + admitted * per
    # Reached once, on one replica or the other: the fleet's one alert this period.
    alerts = [
        metric(replica, "llmroute_gateway_soft_limits_total", scope="team", owner="paid")
        for replica in replicas
    ]
    assert sum(alerts) == 1


def test_a_burst_of_two_teams_keys_on_two_replicas_gets_exactly_the_teams_rpm(
    replicas: tuple[Gateway, Gateway],
) -> None:
    first, second = replicas
    assert admin(first, "PUT", "/admin/teams/burst", {"rpm": 5}).status_code == 200
    members = [create(first, f"burst-{i}", team="burst") for i in range(2)]
    wait_for(lambda: admin(second, "GET", "/admin/keys/burst-1").status_code == 200, "on the other")
    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(
            pool.map(lambda i: post(replicas[i % 2], members[i // 2 % 2]).status_code, range(12))
        )
    assert sorted(statuses) == [200] * 5 + [429] * 7


def test_per_model_limits_within_a_key(replicas: tuple[Gateway, Gateway]) -> None:
    first, second = replicas
    secret = create(first, "models", rpm=100, model_limits={"other": {"rpm": 2}})
    wait_for(lambda: post(second, secret).status_code == 200, "on the other replica")
    assert [post(replicas[i % 2], secret, model="other").status_code for i in range(3)] == [
        200,
        200,
        429,
    ]
    refused = post(first, secret, model="other")
    assert "model 'other' in key 'models'" in error_of(refused)["message"]
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert post(first, secret, model="chat").status_code == 200  # another model: its own room
    limits = admin(first, "GET", "/admin/usage").json()["keys"]["models"]
    assert limits["model_limits"]["other"]["requests_this_minute"] == 2
    assert limits["limits"]["requests_this_minute"] == 4


# -- 4. usage, the fleet's -----------------------------------------------------------------------


def test_usage_on_any_replica_is_the_fleets(replicas: tuple[Gateway, Gateway]) -> None:
    first, second = replicas
    secret = create(first, "counted")
    wait_for(lambda: post(second, secret).status_code == 200, "on the other replica")
    for i in range(5):
        assert post(replicas[i % 2], secret).status_code == 200
    own = [
        admin(r, "GET", "/admin/usage?scope=replica").json()["keys"]["counted"] for r in replicas
    ]
    assert [u["requests"] for u in own] == [3, 3]  # the first's 3; the other's 1 and 2
    for replica in replicas:
        fleet = admin(replica, "GET", "/admin/usage").json()
        counted = fleet["keys"]["counted"]
        assert fleet["scope"] == "fleet"
        assert counted["requests"] == 6
        assert counted["completion_tokens"] == 6 * REPLY
        assert counted["prompt_tokens"] == sum(u["prompt_tokens"] for u in own)
        assert counted["replica"]["requests"] == 3
        assert metric(replica, "llmroute_gateway_fleet_usage", key="counted", kind="requests") == 6
    # Calls refused before their call (a model it may not name: 404) are requests and errors
    # too, on the fleet's figures once their replica has flushed them (every second).
    assert [post(second, secret, model="nope").status_code for _ in range(2)] == [404, 404]

    def fleet() -> dict[str, Any]:
        return admin(first, "GET", "/admin/usage").json()["keys"]["counted"]

    wait_for(lambda: fleet()["requests"] == 8, "the refused calls on the fleet's figures")
    assert fleet()["errors"] == 2


# -- 5. what a request pays --------------------------------------------------------------------


def _round_trips(gateway: Gateway) -> list[str]:
    """Record every call the replica's limits make to Redis (one round trip each)."""
    calls = gateway.app.admission._shared._calls  # pyright: ignore[reportPrivateUsage]
    made: list[str] = []
    own = calls.run

    async def counted(operation: Callable[..., Any]) -> Any:
        made.append(getattr(operation, "__name__", "call"))
        return await own(operation)

    calls.run = counted  # type: ignore[method-assign]
    return made


def _store_calls(gateway: Gateway) -> list[str]:
    """Record what the replica asks its key store: ``version`` (a poll of the change counter,
    one GET) or ``load`` (every key and team)."""
    store = gateway.app._store  # pyright: ignore[reportPrivateUsage]
    asked: list[str] = []
    version, load = store.version, store.load

    async def polled() -> object:
        asked.append("version")
        return await version()

    async def loaded() -> object:
        asked.append("load")
        return await load()

    store.version, store.load = polled, loaded
    return asked


def _evalsha(redis_url: str, command: str = "evalsha") -> int:
    """How many ``command`` calls the redis-server has run (``INFO commandstats``)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))
    finally:
        client.close()


def test_one_round_trip_before_the_first_token_whatever_the_limits(
    replicas: tuple[Gateway, Gateway],
    held: Simulator,  # noqa: F811
    redis_url: str,
) -> None:
    """A key without limits, and one with its own, its team's and a model's limits: each
    request makes one Redis call before its first token (the admission script) and one after
    it (the script that frees its slot and counts it), and nothing looks the key up."""
    first, _ = replicas
    admin(
        first,
        "PUT",
        "/admin/teams/held",
        {"rpm": 1000, "budget_tokens": 10**9, "budget_period": "day"},
    )
    limited = create(first, "limited", team="held", tpm=10**6, model_limits={"held": {"rpm": 100}})
    made = _round_trips(first)
    assert post(first, "alpha").status_code == 200  # the scripts loaded on the server
    # Its end is counted after its answer was sent: wait for it, or it lands in the count below.
    wait_for(lambda: len(made) == 2, "the warm-up request's end counted")
    lookups = _store_calls(first)
    for key in ("alpha", limited):
        made.clear()
        before = _evalsha(redis_url)
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(post, first, key, "held", stream=True)
            wait_for(lambda: held.stats()["held"] == 1, "the stream held before its first token")
            assert len(made) == 1, made  # the admission: slot, limits, team, model at once
            assert _evalsha(redis_url) - before == 1
            assert held.release() == 1
            answer = future.result(timeout=DEADLINE)
        assert answer.status_code == 200
        wait_for(lambda: len(made) == 2, "the request's end counted")
        assert _evalsha(redis_url) - before == 2
    # The key came from the replica's memory: its store only polled the change counter.
    wait_for(lambda: "version" in lookups, "a poll of the store recorded")
    assert set(lookups) == {"version"}, lookups


# -- 6. the admin API's own manners --------------------------------------------------------------


def test_admin_answers_are_no_store_and_only_for_admin_keys(
    replicas: tuple[Gateway, Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = replicas
    caplog.set_level(logging.DEBUG)
    made = admin(first, "POST", "/admin/keys", {"name": "secretive"})
    assert made.headers["cache-control"] == "no-store"
    secret = made.json()["key"]
    for path in ("/admin/keys", "/admin/teams", "/admin/usage", "/admin/keys/secretive"):
        anonymous = httpx.get(root(first) + path, timeout=DEADLINE)
        assert anonymous.status_code == 401 and anonymous.headers["cache-control"] == "no-store"
        for key in ("alpha", secret):  # a tenant's key, an API-made key
            refused = admin(first, "GET", path, key=key)
            assert refused.status_code == 403, path
            assert refused.headers["cache-control"] == "no-store"
            assert error_of(refused)["code"] == "permission_denied"
    assert admin(first, "POST", "/admin/keys", {"name": "x"}, key=secret).status_code == 403
    digest = hashlib.sha256(secret.encode()).hexdigest()
    gateway = first.app
    texts = [r.getMessage() for r in caplog.records]
    texts += [repr(gateway.tenants), repr(gateway.tenants.managed)]
    texts.append(
        httpx.get(
            root(first) + "/metrics", headers={"authorization": f"Bearer {KEYS['admin']}"}
        ).text
    )
    texts.append(admin(first, "GET", "/admin/keys").text)
    for text in texts:
        assert secret not in text and digest not in text
    # Who made or read keys is in the access log, by path (never a key).
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("POST", "GET"))]
    assert any(line.startswith("POST /admin/keys 201 key=admin ") for line in lines), lines
    assert any(line.startswith("GET /admin/keys/{name} 403 key=secretive ") for line in lines)
    said = [r.getMessage() for r in caplog.records]
    assert "gateway keys: create by key=admin: secretive" in said


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("POST", "/admin/keys", {}, "name"),
        ("POST", "/admin/keys", {"name": "a b"}, "name"),
        ("POST", "/admin/keys", {"name": "sk-live-pasted-0123456789"}, "name"),
        ("POST", "/admin/keys", {"name": "n", "rpm": -1}, "rpm"),
        ("POST", "/admin/keys", {"name": "n", "rpm": 10**400}, "rpm"),
        ("POST", "/admin/keys", {"name": "n", "rpm": 1e300}, "rpm"),
        ("POST", "/admin/keys", {"name": "n", "rpmm": 5}, "rpmm"),
        ("POST", "/admin/keys", {"name": "n", "admin": True}, "admin"),
        ("POST", "/admin/keys", {"name": "n", "team": "nobody"}, "team"),
        ("POST", "/admin/keys", {"name": "n", "models": ["chta"]}, "models"),
        (
            "POST",
            "/admin/keys",
            {"name": "n", "model_limits": {"chat": {"rpm": 0}}},
            "model_limits.chat.rpm",
        ),
        (
            "POST",
            "/admin/keys",
            {"name": "n", "model_limits": {"nope": {"rpm": 1}}},
            "model_limits",
        ),
        ("POST", "/admin/keys", {"name": "n", "budget_tokens": 5}, "budget_period"),
        ("POST", "/admin/keys", {"name": "n", "expires_at": "tomorrow"}, "expires_at"),
        ("POST", "/admin/keys", {"name": "n", "soft_limit": 2}, "soft_limit"),
        ("POST", "/admin/keys", [1, 2], None),
        ("POST", "/admin/keys/alpha/rotate", {"overlap": "forever"}, "overlap"),
        ("PUT", "/admin/teams/t", {"budget_period": "day"}, "budget_tokens"),
        ("PUT", "/admin/teams/t", {"rpm": "many"}, "rpm"),
        ("GET", "/admin/usage?scope=all", None, "scope"),
    ],
)
def test_bad_admin_input_is_a_400_naming_the_field(
    replicas: tuple[Gateway, Gateway], method: str, path: str, body: Any, param: str | None
) -> None:
    answer = admin(replicas[0], method, path, body)
    assert answer.status_code == 400, answer.text
    error = error_of(answer)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert "sk-live" not in answer.text


def test_keys_and_teams_declared_win_a_name_clash(replicas: tuple[Gateway, Gateway]) -> None:
    first, _ = replicas
    taken = admin(first, "POST", "/admin/keys", {"name": "alpha"})
    assert taken.status_code == 409 and error_of(taken)["code"] == "key_exists"
    declared = admin(first, "PUT", "/admin/teams/declared", {"rpm": 1})
    assert declared.status_code == 409 and error_of(declared)["code"] == "team_declared"
    assert admin(first, "PUT", "/admin/teams/used", {"rpm": 9}).status_code == 200
    create(first, "user", team="used")
    in_use = admin(first, "DELETE", "/admin/teams/used")
    assert in_use.status_code == 409 and "user" in error_of(in_use)["message"]
    teams = admin(first, "GET", "/admin/teams").json()["data"]
    assert {t["name"]: t["source"] for t in teams} == {"declared": "config", "used": "api"}


# -- 7. soft limits ----------------------------------------------------------------------------


class _Webhook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback HTTP server recording the JSON bodies POSTed to it."""
    received: list[dict[str, Any]] = []
    handler = type("Recorder", (_Webhook,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)


def test_a_soft_limit_posts_to_the_webhook_once_for_the_fleet(
    redis_url: str,
    fast: Simulator,  # noqa: F811
    webhook: tuple[str, list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, received = webhook
    probe_config = config_for(fast, {"keys": keys("alpha")})
    with Gateway(probe_config, environ=ENVIRON, max_retries=0) as probe:
        per = post(probe, "alpha").json()["usage"]["total_tokens"]
    gateway = {
        "keys": keys("alpha", "admin"),
        "tenants": {
            "alpha": {"budget_tokens": 10 * per, "budget_period": "day", "soft_limit": 0.3},
            "admin": {"admin": True},
        },
        "soft_limit_webhook": url,
    }
    config = config_for(fast, gateway, redis=redis_url)
    caplog.set_level(logging.WARNING, logger="llmroute.server")
    with ExitStack() as stack:
        pair = [stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0)) for _ in "ab"]
        for i in range(6):  # 60% of the budget, alternating replicas: past 30% once
            assert post(pair[i % 2], "alpha").status_code == 200
        wait_for(lambda: len(received) == 1, "the webhook's POST")
        event = received[0]
        assert event["type"] == "soft_limit" and (event["scope"], event["name"]) == ("key", "alpha")
        assert event["budget_tokens"] == 10 * per and event["soft_limit"] == 0.3
        assert 0.3 <= event["share"] < 0.6 and event["period_ends"] > time.time()
        said = [
            r.getMessage() for r in caplog.records if "reached its soft limit" in r.getMessage()
        ]
        assert len(said) == 1 and "key 'alpha'" in said[0]
        counted = [
            metric(g, "llmroute_gateway_soft_limits_total", scope="key", owner="alpha")
            for g in pair
        ]
        assert sorted(counted) == [0.0, 1.0]
    assert len(received) == 1  # and nothing more by the time both replicas stopped
