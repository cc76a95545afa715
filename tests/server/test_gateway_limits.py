"""Per-key limits, counted in memory and in a real redis-server, driven by a fake clock: the
same scenarios run against both, so a replica that falls back to counting locally decides as
the shared count would. Settings errors are sentences naming the key and the field."""

from __future__ import annotations

import calendar
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmroute import ConfigError
from llmroute.config import KeySettings, TeamSettings, load_config
from llmroute.routing.windows import MAX_TOKENS_CAP
from llmroute.server._limits import (
    BUCKET,
    BUCKETS,
    MAX_TOKENS,
    Counts,
    Grant,
    Limits,
    LocalLimits,
    RedisLimits,
    Refusal,
    period_of,
    reset_text,
)
from llmroute.server._tenants import Team, Tenant, Tenants
from tests.clock import FakeClock

START = 1_800_000_000.0  # a bucket's start (a multiple of 10 s)

pytestmark = pytest.mark.anyio


def _tenant(name: str = "app", **settings: Any) -> Tenant:
    return Tenant(name, KeySettings(**settings), 64)


@pytest.fixture(params=["memory", "redis"])
async def counted(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Limits, FakeClock]]:
    """Limits in memory, or in Redis (on asyncio with redis-py's asyncio client, on trio with
    its synchronous client in worker threads)."""
    clock = FakeClock(START)
    if request.param == "memory":
        yield LocalLimits(clock=clock), clock
        return
    url = request.getfixturevalue("redis_url")
    limits = RedisLimits(url, prefix=f"t-{uuid.uuid4().hex[:8]}", timeout=2.0, clock=clock)
    try:
        yield limits, clock
    finally:
        await limits.aclose()


async def _admitted(limits: Limits, tenant: Tenant, n: int, tokens: int = 0) -> int:
    count = 0
    for _ in range(n):
        if isinstance(await limits.admit(tenant, tokens), Grant):
            count += 1
    return count


async def test_requests_per_minute_hold_and_free_after_the_window(
    counted: tuple[Limits, FakeClock],
) -> None:
    limits, clock = counted
    app, other = _tenant(rpm=5), _tenant("other", rpm=5)
    assert await _admitted(limits, app, 8) == 5
    refused = await limits.admit(app, 0)
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code, refused.reason) == (
        429,
        "rate_limit_exceeded",
        "requests",
    )
    assert refused.headers["x-ratelimit-limit-requests"] == "5"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # Counted at START's bucket: it leaves the sum 7 buckets (70 s) later.
    assert refused.headers["retry-after"] == str(int((BUCKETS + 1) * BUCKET))
    assert await _admitted(limits, other, 5) == 5  # another key is unaffected
    clock.advance(60)  # a minute on: still within the 60-70 s the count is kept
    assert await _admitted(limits, app, 1) == 0
    clock.advance((BUCKETS + 1) * BUCKET - 60)
    assert await _admitted(limits, app, 6) == 5


async def test_any_sixty_seconds_hold_at_most_the_limit(counted: tuple[Limits, FakeClock]) -> None:
    limits, clock = counted
    app = _tenant(rpm=10)
    admitted: list[float] = []
    for _ in range(200):  # a request every 1.5 s for 300 s
        if isinstance(await limits.admit(app, 0), Grant):
            admitted.append(clock.now)
        clock.advance(1.5)
    worst = max(sum(1 for t in admitted if start <= t < start + 60) for start in admitted)
    assert worst <= 10
    assert len(admitted) >= 10 * 300 / 70 - 1  # and the slack refuses at most a bucket early


async def test_tokens_are_admitted_on_the_estimate_and_corrected_to_the_usage(
    counted: tuple[Limits, FakeClock],
) -> None:
    limits, _ = counted
    app = _tenant(tpm=1000)
    first = await limits.admit(app, 600)
    assert isinstance(first, Grant)
    assert first.headers["x-ratelimit-remaining-tokens"] == "400"
    second = await limits.admit(app, 600)
    assert isinstance(second, Refusal) and second.reason == "tokens"
    await limits.settle(first, 150)  # it used 150 of the 600 it was counted at
    assert (await limits.peek(app)).tokens == 150
    third = await limits.admit(app, 600)
    assert isinstance(third, Grant)
    assert third.headers["x-ratelimit-remaining-tokens"] == "250"
    await limits.settle(third, 900)  # more than estimated: counted as used
    assert (await limits.peek(app)).tokens == 1050


async def test_a_request_larger_than_the_minute_is_refused_for_good(
    counted: tuple[Limits, FakeClock],
) -> None:
    limits, _ = counted
    refused = await limits.admit(_tenant(tpm=100), 101)
    assert isinstance(refused, Refusal)
    assert refused.reason == "too_large"
    assert refused.headers["x-should-retry"] == "false"
    assert "Requested 101" in refused.message


async def test_a_budget_runs_out_and_renews_with_its_period(
    counted: tuple[Limits, FakeClock],
) -> None:
    limits, clock = counted
    app = _tenant(budget_tokens=100, budget_period="1h")
    clock.now = 3600.0 * 500_000 + 10  # ten seconds into an hour
    grant = await limits.admit(app, 30)
    assert isinstance(grant, Grant)
    await limits.settle(grant, 120)  # the budget is spent (past it, by what was in flight)
    refused = await limits.admit(app, 1)
    assert isinstance(refused, Refusal)
    assert (refused.code, refused.type, refused.reason) == (
        "insufficient_quota",
        "insufficient_quota",
        "budget",
    )
    assert refused.headers["x-should-retry"] == "false"
    assert refused.headers["x-llmroute-budget-remaining-tokens"] == "0"
    assert refused.headers["retry-after"] == str(3600 - 10)
    clock.advance(3600 - 10)  # the next hour
    assert isinstance(await limits.admit(app, 1), Grant)
    assert (await limits.peek(app)).spent == 1


async def test_a_money_budget_admits_what_fits_and_is_spent_exactly_to_its_limit(
    counted: tuple[Limits, FakeClock],
) -> None:
    """A money budget (nano-dollars) admits a request only if its dearest cost fits in what
    is left, counts its real cost when it ends, and can be spent to the last nano-dollar."""
    limits, clock = counted
    app = _tenant(budget_usd="0.001", budget_period="1h")  # 1,000,000 nano-dollars
    clock.now = 3600.0 * 500_000 + 10
    grant = await limits.admit(app, 0, money=600_000)
    assert isinstance(grant, Grant) and grant.money == 600_000
    assert grant.headers["x-llmroute-budget-limit-usd"] == "0.001"
    assert grant.headers["x-llmroute-budget-remaining-usd"] == "0.0004"
    refused = await limits.admit(app, 0, money=400_001)  # one nano-dollar too many
    assert isinstance(refused, Refusal) and refused.reason == "budget"
    assert refused.code == "insufficient_quota"
    assert "$0.0004 left of its budget of $0.001" in refused.message
    assert "may cost up to $0.000400001" in refused.message
    assert refused.headers["x-should-retry"] == "false"
    await limits.settle(grant, 0, 100_000)  # it cost less than its estimate
    assert (await limits.peek(app)).money == 100_000
    last = await limits.admit(app, 0, money=900_000)
    assert isinstance(last, Grant)
    await limits.settle(last, 0, 900_000)
    assert (await limits.peek(app)).money == 1_000_000  # spent to the limit, exactly
    assert isinstance(await limits.admit(app, 0, money=1), Refusal)
    huge = await limits.admit(app, 0, money=10**17)  # clamped: a double would be 1e+17
    assert isinstance(huge, Refusal) and "more than the whole budget" in huge.message
    clock.advance(3600)  # the next hour: a budget of its own
    assert isinstance(await limits.admit(app, 0, money=1_000_000), Grant)
    assert (await limits.peek(app)).money == 1_000_000


async def test_a_refusal_on_tokens_spends_no_request(counted: tuple[Limits, FakeClock]) -> None:
    limits, _ = counted
    app = _tenant(rpm=2, tpm=100)
    assert isinstance(await limits.admit(app, 100), Refusal) is False
    assert isinstance(await limits.admit(app, 50), Refusal)  # tokens
    assert (await limits.peek(app)).requests == 1
    assert isinstance(await limits.admit(app, 0), Grant)


def _member(name: str, team: Team | None, **settings: Any) -> Tenant:
    return Tenant(name, KeySettings(**settings), 64, team)


async def test_a_teams_limit_is_shared_by_its_keys(counted: tuple[Limits, FakeClock]) -> None:
    limits, _ = counted
    team = Team("ml", TeamSettings(rpm=3))
    one, two = _member("one", team, rpm=10), _member("two", team)
    decided = [await limits.admit((one, two)[i % 2], 0) for i in range(5)]
    assert [isinstance(d, Grant) for d in decided] == [True] * 3 + [False] * 2
    refused = decided[-1]
    assert isinstance(refused, Refusal) and refused.reason == "requests"
    assert "team 'ml' (key 'one')" in refused.message
    assert refused.headers["x-ratelimit-limit-requests"] == "3"  # the tighter scope's
    # Refused by the team: nothing counted in the key's own scope either.
    assert (await limits.peek(one)).requests == 2
    assert (await limits.peek_scope(one.scopes[1])).requests == 3
    assert await _admitted(limits, _member("other", Team("ops", TeamSettings(rpm=3))), 3) == 3


async def test_a_models_limit_within_a_key(counted: tuple[Limits, FakeClock]) -> None:
    limits, _ = counted
    app = _tenant(rpm=10, model_limits={"big": {"rpm": 1, "tpm": 50}})
    assert isinstance(await limits.admit(app, 40, model="big"), Grant)
    refused = await limits.admit(app, 0, model="big")
    assert isinstance(refused, Refusal)
    assert "model 'big' in key 'app'" in refused.message
    too_large = await limits.admit(app, 51, model="big")
    assert isinstance(too_large, Refusal) and too_large.reason == "too_large"
    assert await _admitted(limits, app, 3) == 3  # other models: the key's own room
    assert (await limits.peek(app)).requests == 4


async def test_a_soft_limit_is_said_once_per_period(counted: tuple[Limits, FakeClock]) -> None:
    limits, clock = counted
    team = Team("ml", TeamSettings(budget_tokens=100, budget_period="1h", soft_limit=0.5))
    app = _member("app", team)
    clock.now = 3600.0 * 500_000 + 10
    first = await limits.admit(app, 30)
    assert isinstance(first, Grant) and first.alerts == ()
    second = await limits.admit(app, 30)  # 60 of 100: past the half
    assert isinstance(second, Grant)
    assert [(a.scope.owner, a.scope.kind, a.spent) for a in second.alerts] == [("ml", "team", 60)]
    assert second.alerts[0].ends == 3600.0 * 500_001
    third = await limits.admit(app, 10)
    assert isinstance(third, Grant) and third.alerts == ()
    assert await limits.settle(third, 30) == ()  # still this period: said already
    clock.advance(3600)  # the next period: said again when reached, here by a correction
    fourth = await limits.admit(app, 10)
    assert isinstance(fourth, Grant) and fourth.alerts == ()
    alerts = await limits.settle(fourth, 55)
    assert [a.spent for a in alerts] == [55]


async def test_what_enters_a_counter_is_clamped(counted: tuple[Limits, FakeClock]) -> None:
    limits, _ = counted
    app = _tenant(budget_tokens=10**15, budget_period="day")
    grant = await limits.admit(app, 10**17)  # a Lua double would write 1e+17: refused by HINCRBY
    assert isinstance(grant, Grant) and grant.reserved == MAX_TOKENS
    await limits.settle(grant, 10**18)
    assert (await limits.peek(app)).spent == MAX_TOKENS


def test_periods_and_resets_read_as_the_vendors_write_them() -> None:
    march = calendar.timegm((2026, 3, 31, 23, 0, 0))
    index, end = period_of("month", march)
    assert end == calendar.timegm((2026, 4, 1, 0, 0, 0))
    assert period_of("month", end)[0] == index + 1
    december = calendar.timegm((2026, 12, 15, 0, 0, 0))
    assert period_of("month", december)[1] == calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert period_of("day", 86400 * 3 + 5) == (3, 86400 * 4)
    assert period_of(7200.0, 7200 * 2 + 1) == (2, 7200 * 3)
    assert [reset_text(s) for s in (0.02, 1.5, 20, 360, 3723)] == [
        "20ms",
        "1.5s",
        "20s",
        "6m0s",
        "1h2m3s",
    ]


async def test_an_unreachable_redis_counts_locally_or_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _tenant(rpm=2)
    local = RedisLimits("redis://127.0.0.1:1/0", prefix="t", timeout=0.2, on_error="local")
    refuse = RedisLimits("redis://127.0.0.1:1/0", prefix="t", timeout=0.2, on_error="refuse")
    with caplog.at_level(logging.WARNING, logger="llmroute.server"):
        assert await _admitted(local, app, 4) == 2  # the limit still holds, in this replica
        refused = await refuse.admit(app, 0)
        assert await _admitted(refuse, app, 2) == 0
    await local.aclose()
    await refuse.aclose()
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code) == (503, "limits_unavailable")
    warnings = [r.getMessage() for r in caplog.records if "gateway limits" in r.getMessage()]
    assert len(warnings) == 2  # once per limiter, not once per request
    assert "counting in this replica" in warnings[0] and "refusing" in warnings[1]


async def test_a_request_estimated_at_no_tokens_is_corrected_to_its_usage(
    counted: tuple[Limits, FakeClock],
) -> None:
    """A completion of an empty prompt naming no max_tokens is admitted on 0 tokens; its
    answer's usage is still counted (in Redis the correction once found no field to correct,
    so the minute and the budget never counted what such answers used)."""
    limits, clock = counted
    clock.now = 3600.0 * 500_000 + 10
    app = _tenant(tpm=1000, budget_tokens=1000, budget_period="1h")
    grant = await limits.admit(app, 0)
    assert isinstance(grant, Grant)
    await limits.settle(grant, 30)
    counts = await limits.peek(app)
    assert (counts.requests, counts.tokens, counts.spent) == (1, 30, 30)


async def test_a_huge_estimate_is_counted_clamped_and_corrected_to_the_usage(
    counted: tuple[Limits, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    """``max_tokens=10**18`` on keys without ``tpm``: counted as MAX_TOKENS_CAP, corrected to
    what was used, and a spent budget refuses the next. In Redis, 10**18 once reached HINCRBY
    as ``1e+18`` and failed: taken for an outage, counted in this replica only, the budget
    bypassed (its shared counter stayed 0)."""
    limits, clock = counted
    clock.now = 3600.0 * 500_000 + 10
    rpm_only = _tenant("rpm-only", rpm=10)
    budget = _tenant("budget", budget_tokens=100, budget_period="1h")
    per_minute = _tenant("per-minute", tpm=1000)
    local = isinstance(limits, LocalLimits)  # else every grant is counted in Redis
    with caplog.at_level(logging.INFO, logger="llmroute.server"):
        first = await limits.admit(rpm_only, 10**18)
        assert isinstance(first, Grant) and first.local == local
        assert (await limits.peek(rpm_only)).requests == 1
        assert (await limits.peek(rpm_only)).tokens == MAX_TOKENS_CAP
        await limits.settle(first, 120)
        assert (await limits.peek(rpm_only)).tokens == 120

        spending = await limits.admit(budget, 10**18)
        assert isinstance(spending, Grant) and spending.local == local
        assert (await limits.peek(budget)).spent == MAX_TOKENS_CAP
        await limits.settle(spending, 120)  # the answer was 120 tokens long
        assert (await limits.peek(budget)).spent == 120
        refused = await limits.admit(budget, 1)
        assert isinstance(refused, Refusal) and refused.reason == "budget"

        too_large = await limits.admit(per_minute, 10**18)
        assert isinstance(too_large, Refusal) and too_large.reason == "too_large"
        assert await limits.peek(per_minute) == Counts()
        second = await limits.admit(rpm_only, 5)
        assert isinstance(second, Grant)
        await limits.settle(second, 10**30)  # a vendor's absurd usage: clamped too
        assert (await limits.peek(rpm_only)).tokens == 120 + MAX_TOKENS_CAP
    assert [r.getMessage() for r in caplog.records if "gateway limits" in r.getMessage()] == []


async def test_the_admission_script_writes_nothing_when_an_argument_is_wrong(
    redis_url: str,
) -> None:
    """Every argument is checked before the first write: tokens the script cannot count
    (past the clamp) leave the request uncounted too (once, the requests bucket was
    incremented before HINCRBY on the tokens failed)."""
    import redis.exceptions

    clock = FakeClock(START)
    limits = RedisLimits(redis_url, prefix=f"t-{uuid.uuid4().hex[:8]}", timeout=2.0, clock=clock)
    app = _tenant(rpm=10, budget_tokens=100, budget_period="1h")
    try:
        for tokens in (10**17, 10**18, 10**400):
            with pytest.raises(redis.exceptions.ResponseError):
                await limits._script(app.name, app.scopes, tokens, None, False)  # pyright: ignore[reportPrivateUsage]
        assert await limits.peek(app) == Counts()
        grant = await limits.admit(app, 10)
        assert isinstance(grant, Grant)
        assert await limits.peek(app) == Counts(1, grant.bucket, 10, grant.bucket, 10)
    finally:
        await limits.aclose()


@pytest.mark.parametrize("policy", ["local", "refuse"])
async def test_a_script_error_is_not_an_outage(
    redis_url: str,
    policy: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis answers the scripts with an error (a bug): logged as one, the request refused
    with a 500 saying so; the replica neither counts locally nor answers 503, and the next
    admission is counted in Redis as before. An outage is only a server that cannot be used."""
    import redis.exceptions

    clock = FakeClock(START)
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    limits = RedisLimits(redis_url, prefix=prefix, timeout=2.0, on_error=policy, clock=clock)
    app = _tenant(rpm=10)
    real_run, real_correct = limits._script, limits.finish  # pyright: ignore[reportPrivateUsage]

    async def broken(*args: Any) -> Any:
        raise redis.exceptions.ResponseError("user_script:1: Script attempted to access nil")

    try:
        with caplog.at_level(logging.INFO, logger="llmroute.server"):
            monkeypatch.setattr(limits, "_script", broken)
            refused = await limits.admit(app, 5)
            monkeypatch.setattr(limits, "_script", real_run)
            grant = await limits.admit(app, 5)
            monkeypatch.setattr(limits, "finish", broken)
            assert isinstance(grant, Grant)
            await limits.settle(grant, 50)
            monkeypatch.setattr(limits, "finish", real_correct)
        assert isinstance(refused, Refusal)
        assert (refused.status, refused.reason, refused.type) == (
            500,
            "limits_error",
            "server_error",
        )
        assert "not the request's" in refused.message
        assert not grant.local  # counted in Redis: no outage mode was entered
        assert (await limits.peek(app)).requests == 1
        messages = [r.getMessage() for r in caplog.records]
        assert not [m for m in messages if "unreachable" in m or "answers again" in m], messages
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert [r.getMessage().split(" (")[0] for r in errors] == [
            "gateway limits: Redis refused the admission script",
            "gateway limits: Redis refused the correction script",
        ]
    finally:
        await limits.aclose()


# -- settings --------------------------------------------------------------------------------

_BASE: dict[str, Any] = {
    "providers": {"sim": {"base_url": "https://sim.test/v1", "api_key": "sk-up-0123456789"}},
    "models": {"chat": {"targets": ["sim:m"]}, "fast": {"targets": ["sim:f"]}},
}
PASTED = "sk-proj-0123456789abcdefghijklmnop"


def _config(tmp_path: Path, keys_file: str, **gateway: Any) -> Any:
    path = tmp_path / "keys.toml"
    path.write_text(keys_file)
    return load_config({**_BASE, "gateway": {"keys_file": str(path), **gateway}})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[keys.app]\nenv = "APP"\nrpm = -5\n', "keys.app.rpm: expected a number at least 1"),
        ('[keys.app]\nenv = "APP"\nmodels = ["chta"]\n', "did you mean 'chat'?"),
        ('[keys.app]\nenv = "APP"\nbudget_tokens = 10\n', "keys.app.budget_period: budget_tokens"),
        ('[keys.app]\nenv = "APP"\nbudget_period = "week"\n', "keys.app.budget_period: expected"),
        ('[keys.app]\nenv = "APP"\nbudget_period = "mont"\n', "did you mean 'month'?"),
        (f'[keys.app]\nsha256 = "{PASTED}"\n', "keys.app.sha256: expected the key's SHA-256"),
        (f'[keys.app]\nenv = "{PASTED}"\n', "keys.app.env: expected the name of an environment"),
        ("[keys.app]\nrpm = 5\n", "give the key as env"),
        ('[keys.app]\nenv = "APP"\nrpmm = 5\n', "keys.app.rpmm: unknown key"),
        ('[keys.app]\nenv = "APP"\ndefault_max_tokens = 9\nmax_tokens = 8\n', "is above"),
        ('[keys.app]\nenv = "APP"\n[keys.default]\nenv = "B"\n', "gateway.keys has a key"),
    ],
)
def test_a_bad_keys_file_is_a_sentence_naming_the_key_and_field(
    tmp_path: Path, text: str, words: str
) -> None:
    config = _config(tmp_path, text, keys={"default": "GW_DEFAULT"})
    with pytest.raises(ConfigError) as caught:
        Tenants.load(config, {"APP": "gw-app-0123456789", "GW_DEFAULT": "gw-d-0123456789"})
    message = str(caught.value)
    assert str(tmp_path / "keys.toml") in message
    assert words in message
    assert PASTED not in message and "sk-proj" not in message


def test_a_keys_file_key_by_digest_or_variable_with_its_settings_merged(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"gw-by-digest-0123456789").hexdigest()
    text = (
        f'[keys.app]\nsha256 = "{digest}"\nrpm = 7\nmodels = ["chat"]\n'
        '[keys.ops]\nenv = "OPS"\nadmin = true\n'
    )
    config = _config(tmp_path, text, limits={"tpm": 1000, "rpm": 100}, max_concurrency_per_key=3)
    tenants = Tenants.load(config, {"OPS": "gw-ops-0123456789"})
    app = tenants.match("Bearer gw-by-digest-0123456789")
    assert app is not None and app.name == "app"
    assert (app.settings.rpm, app.settings.tpm, app.concurrency) == (7, 1000, 3)
    assert app.may_use("chat") and not app.may_use("fast")
    ops = tenants.match("bearer gw-ops-0123456789")
    assert ops is not None and ops.settings.admin and ops.settings.rpm == 100
    assert tenants.match("Bearer gw-ops-0123456789x") is None
    assert "gw-" not in repr(tenants)
    # A reload without app, and ops under another key: both count as revoked.
    (tmp_path / "keys.toml").write_text('[keys.ops]\nenv = "OPS"\n')
    newer = Tenants.load(config, {"OPS": "gw-ops-other-0123456789"})
    assert tenants.revoked_by(newer) == {"app", "ops"}


def test_gateway_settings_errors_name_the_table(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tenants": {"nobody": {"rpm": 1}}}, "gateway.tenants.nobody"),
        (
            {"keys": {"a": "A"}, "tenants": {"a": {"models": ["chat", "slow"]}}},
            "gateway.tenants.a.models: key 'a': 'slow' is not a model name",
        ),
        (
            {"keys": {"a": "A"}, "limits": {"budget_period": "day"}},
            "gateway.limits.budget_tokens: key 'a': budget_period needs budget_tokens",
        ),
        ({"slos": {"chta": {"ttft_ms": 500}}}, "gateway.slos.chta: 'chta' is not a route"),
        ({"limits": {"slo_percentile": 100}}, "gateway.limits.slo_percentile"),
        ({"keys": {}}, "gateway.keys: the gateway needs a key"),
    ]
    for gateway, words in cases:
        with pytest.raises(ConfigError) as caught:
            load_config({**_BASE, "gateway": gateway})
        assert words in str(caught.value), gateway
    # A budget's period in the defaults and its size per key is one budget.
    config = load_config(
        {
            **_BASE,
            "gateway": {
                "keys": {"a": "A"},
                "limits": {"budget_period": "day"},
                "tenants": {"a": {"budget_tokens": 5000}},
            },
        }
    )
    assert config is not None
    tenant = Tenants.load(config, {"A": "gw-a-0123456789"}).by_name["a"]
    assert (tenant.settings.budget_tokens, tenant.settings.budget_period) == (5000, "day")


def test_the_docs_examples_load(tmp_path: Path) -> None:
    """docs/gateway.md's two examples of "Keys and their limits" and of the keys file."""
    import re
    import tomllib

    text = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    settings = next(b for b in blocks if "[gateway.tenants.batch]" in b)
    keys = next(b for b in blocks if "[keys.web]" in b)
    (tmp_path / "keys.toml").write_text(keys)
    gateway = tomllib.loads(settings)["gateway"]
    gateway["keys_file"] = str(tmp_path / "keys.toml")
    models = {"chat": {"targets": ["sim:m"]}, "cheap": {"targets": ["sim:c"]}}
    config = load_config({**_BASE, "models": models, "gateway": gateway})
    environ = {name: f"gw-{name.lower()}-0123456789" for name in ("GW_KEY_APP", "GW_KEY_BATCH")}
    environ |= {"GW_KEY_OPS": "gw-ops-0123456789", "GW_KEY_CI": "gw-ci-0123456789"}
    tenants = Tenants.load(config, environ)
    assert set(tenants.names) == {"app", "batch", "ops", "web", "ci"}
    batch = tenants.by_name["batch"].settings
    assert (batch.rpm, batch.tpm, batch.budget_period, batch.models) == (
        60,
        200_000,
        "month",
        ["cheap"],
    )
    assert tenants.match("Bearer test") is not None  # the example's digest is of "test"
