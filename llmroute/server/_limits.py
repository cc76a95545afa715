"""Each key's requests and tokens per minute and its token budget, counted in one process
(:class:`LocalLimits`) or shared by every gateway replica through Redis (:class:`RedisLimits`).

**Counting.** A minute is counted in buckets of :data:`BUCKET` seconds: a request adds 1 to its
key's requests bucket and its token estimate (prompt and ``max_tokens``) to its tokens bucket;
what is in use is the sum of the newest ``BUCKETS + 1`` buckets, the one being filled included,
so any 60 seconds hold at most the limit (a count leaves 60-70 s after it was made: that is
the slack, and it only ever refuses early). When the request ends, its tokens are corrected to
its answer's ``usage`` (:meth:`Limits.settle`), in the bucket it was counted in, if that is
still in the window. A budget is one counter per period (a UTC day, a UTC month, or a
duration since 1970); admission needs some of it left, so the requests in flight when it runs
out can take it past its size by what they use.

**One round trip.** The Redis side is one Lua script per admission that reads, checks and
counts every limit of the key atomically, so two replicas cannot both take the last request
of a minute, and a request refused on tokens has not spent a request. (The ``limits`` library
was weighed and not used: a request's limits there are one call each, not atomic together; a
hit cannot be taken back, so a token estimate cannot be corrected to the usage; its moving
window stores one entry per unit, a million a minute at 1M tokens per minute; and it has no
calendar day or month. The concurrency slots' script, :mod:`._slots`, is the model followed.)

**Counted clamped.** What enters a counter is at most
:data:`~llmroute.routing.windows.MAX_TOKENS_CAP` (2^40) tokens a request, whatever
``max_tokens`` says: Lua's numbers are doubles, and a count of 10^17 reached ``HINCRBY`` as
``1e+17``, which it refuses. The scripts check every argument before their first write, so an
error leaves every counter as it was.

**Redis down.** With ``limits_on_redis_error = "local"`` a replica counts in its own memory
until Redis answers again (each replica then allows the whole limit); with ``"refuse"``, it
answers 503. Either is logged once per outage. Only an unreachable (or read-only, or full)
server is an outage: an error the server answers with (a script's) is logged as an error and
the request gets a 500 saying so, the replica's mode unchanged.
"""

from __future__ import annotations

import calendar
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio

from .._config import KeySettings
from .._redis import RedisCaller, RedisConnection
from ..routing.windows import MAX_TOKENS_CAP
from ._tenants import Tenant

__all__ = [
    "BUCKET",
    "BUCKETS",
    "Grant",
    "Limits",
    "LocalLimits",
    "RedisLimits",
    "Refusal",
    "period_of",
    "reset_text",
]

log = logging.getLogger("llmroute.server")

WINDOW = 60.0
BUCKETS = 6
"""Buckets a minute is counted in; the newest ``BUCKETS + 1`` are summed."""
BUCKET = WINDOW / BUCKETS
"""Seconds a bucket covers."""


@dataclass(frozen=True, slots=True)
class Counts:
    """A key's counters as one admission read them (after counting it, when admitted)."""

    requests: int = 0
    requests_oldest: int | None = None
    """The oldest bucket with a request in it."""
    tokens: int = 0
    tokens_oldest: int | None = None
    spent: int = 0
    """Of the budget, in the current period."""


@dataclass(frozen=True, slots=True)
class Grant:
    """An admitted request: where its tokens were counted, to correct them when it ends."""

    key: str
    bucket: int
    period: int | None
    reserved: int
    """Tokens counted at admission (its estimate)."""
    headers: dict[str, str] = field(default_factory=dict)
    """OpenAI's ``x-ratelimit-*`` headers for the answer."""
    local: bool = False
    """Counted in this process (Redis was down)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the key's limits refuse: an OpenAI-shaped 429 (or 503)."""

    status: int
    reason: str
    """``requests``, ``tokens``, ``too_large``, ``budget``, ``limits_unavailable`` or
    ``limits_error``."""
    code: str
    type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


class Limits(Protocol):
    async def admit(self, tenant: Tenant, tokens: int) -> Grant | Refusal:
        """Count one request of ``tenant`` estimated at ``tokens``, or refuse it."""
        ...

    async def settle(self, grant: Grant, tokens: int) -> None:
        """The request ended having used ``tokens``: correct its estimate."""
        ...

    async def peek(self, tenant: Tenant) -> Counts:
        """The key's counters now (nothing counted)."""
        ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


def period_of(period: str | float, now: float) -> tuple[int, float]:
    """The budget period ``now`` falls in: its number and when it ends (Unix seconds)."""
    if period == "day":
        index = int(now // 86400)
        return index, (index + 1) * 86400.0
    if period == "month":
        day = datetime.fromtimestamp(now, UTC)
        index = day.year * 12 + day.month - 1
        year, month = divmod(index + 1, 12)
        return index, float(calendar.timegm((year, month + 1, 1, 0, 0, 0)))
    assert isinstance(period, float | int)
    index = int(now // period)
    return index, (index + 1) * float(period)


def reset_text(seconds: float) -> str:
    """A wait as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``20ms``, ``1.5s``,
    ``6m0s``, ``1h2m3s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


def _counted(tokens: int) -> int:
    """A request's tokens as a counter takes them: ``0..MAX_TOKENS_CAP``."""
    return min(max(tokens, 0), MAX_TOKENS_CAP)


def _leaves(oldest: int | None, now: float) -> float:
    """Seconds until the bucket ``oldest`` leaves the window (0 with none)."""
    if oldest is None:
        return 0.0
    return max(0.001, (oldest + BUCKETS + 1) * BUCKET - now)


def _retry(seconds: float) -> dict[str, str]:
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(int(seconds * 1000)),
    }


def _headers(
    settings: KeySettings, counts: Counts, now: float, end: float | None
) -> dict[str, str]:
    out: dict[str, str] = {}
    if settings.rpm is not None:
        out["x-ratelimit-limit-requests"] = str(settings.rpm)
        out["x-ratelimit-remaining-requests"] = str(max(0, settings.rpm - counts.requests))
        out["x-ratelimit-reset-requests"] = reset_text(_leaves(counts.requests_oldest, now))
    if settings.tpm is not None:
        out["x-ratelimit-limit-tokens"] = str(settings.tpm)
        out["x-ratelimit-remaining-tokens"] = str(max(0, settings.tpm - counts.tokens))
        out["x-ratelimit-reset-tokens"] = reset_text(_leaves(counts.tokens_oldest, now))
    if settings.budget_tokens is not None and end is not None:
        out["x-llmroute-budget-limit-tokens"] = str(settings.budget_tokens)
        out["x-llmroute-budget-remaining-tokens"] = str(
            max(0, settings.budget_tokens - counts.spent)
        )
        out["x-llmroute-budget-reset"] = reset_text(end - now)
    return out


# What an admission decided: admitted, or refused on one limit.
_ADMITTED, _REQUESTS, _TOKENS, _TOO_LARGE, _BUDGET = range(5)


def _decide(
    tenant: Tenant, tokens: int, counts: Counts, verdict: int, now: float, end: float | None
) -> Refusal | None:
    """The refusal for ``verdict`` (``None`` when admitted: the caller builds the grant)."""
    if verdict == _ADMITTED:
        return None
    s = tenant.settings
    headers = _headers(s, counts, now, end)
    if verdict == _REQUESTS:
        wait = _leaves(counts.requests_oldest, now)
        return Refusal(
            429,
            "requests",
            "rate_limit_exceeded",
            "requests",
            f"Rate limit reached for key {tenant.name!r} on requests per minute (RPM): "
            f"Limit {s.rpm}, Used {counts.requests}. Please try again in {reset_text(wait)}.",
            headers | _retry(wait),
        )
    if verdict == _TOO_LARGE:
        return Refusal(
            429,
            "too_large",
            "rate_limit_exceeded",
            "tokens",
            f"Request too large for key {tenant.name!r} on tokens per minute (TPM): Limit "
            f"{s.tpm}, Requested {tokens}. Send a shorter prompt or a smaller max_tokens.",
            headers | {"x-should-retry": "false"},
        )
    if verdict == _TOKENS:
        wait = _leaves(counts.tokens_oldest, now)
        return Refusal(
            429,
            "tokens",
            "rate_limit_exceeded",
            "tokens",
            f"Rate limit reached for key {tenant.name!r} on tokens per minute (TPM): Limit "
            f"{s.tpm}, Used {counts.tokens}, Requested {tokens}. Please try again in "
            f"{reset_text(wait)}.",
            headers | _retry(wait),
        )
    wait = (end or now) - now
    return Refusal(
        429,
        "budget",
        "insufficient_quota",
        "insufficient_quota",
        f"Key {tenant.name!r} has used its budget of {s.budget_tokens} tokens for this period; "
        f"it renews in {reset_text(wait)}.",
        headers | _retry(wait) | {"x-should-retry": "false"},
    )


class LocalLimits:
    """Limits counted in this process (see the module's docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._requests: dict[str, dict[int, int]] = {}
        self._tokens: dict[str, dict[int, int]] = {}
        self._budgets: dict[str, tuple[int, int]] = {}  # key -> (period, spent)

    @staticmethod
    def _window(buckets: dict[int, int], now: int) -> tuple[int, int | None]:
        for old in [b for b in buckets if b <= now - BUCKETS - 1]:
            del buckets[old]
        used = sum(buckets.values())
        oldest = min((b for b, n in buckets.items() if n > 0), default=None)
        return used, oldest

    def _count(self, tenant: Tenant, tokens: int, *, dry: bool) -> tuple[int, Counts, Grant]:
        s, key = tenant.settings, tenant.name
        now = self._clock()
        bucket = int(now // BUCKET)
        period, end = period_of(s.budget_period, now) if s.budget_period is not None else (0, None)
        requests = self._requests.setdefault(key, {})
        used, oldest = self._window(requests, bucket)
        taken = self._tokens.setdefault(key, {})
        tokens_used, tokens_oldest = self._window(taken, bucket)
        own_period, spent = self._budgets.get(key, (period, 0))
        if own_period != period:
            spent = 0
        counts = Counts(used, oldest, tokens_used, tokens_oldest, spent)
        verdict = _ADMITTED
        if s.tpm is not None and tokens > s.tpm:  # never admitted: said first
            verdict = _TOO_LARGE
        elif s.rpm is not None and used + 1 > s.rpm:
            verdict = _REQUESTS
        elif s.tpm is not None and tokens_used + tokens > s.tpm:
            verdict = _TOKENS
        elif s.budget_tokens is not None and spent >= s.budget_tokens:
            verdict = _BUDGET
        grant = Grant(key, bucket, period if end is not None else None, tokens, local=True)
        if verdict == _ADMITTED and not dry:
            requests[bucket] = requests.get(bucket, 0) + 1
            taken[bucket] = taken.get(bucket, 0) + tokens
            self._budgets[key] = (period, spent + tokens)
            counts = Counts(
                used + 1,
                bucket if oldest is None else oldest,
                tokens_used + tokens,
                bucket if tokens_oldest is None and tokens else tokens_oldest,
                spent + tokens,
            )
        return verdict, counts, grant

    async def admit(self, tenant: Tenant, tokens: int) -> Grant | Refusal:
        return self.admit_now(tenant, tokens)

    def admit_now(self, tenant: Tenant, tokens: int) -> Grant | Refusal:
        tokens = _counted(tokens)
        now = self._clock()
        verdict, counts, grant = self._count(tenant, tokens, dry=False)
        end = _end(tenant.settings, now)
        refusal = _decide(tenant, tokens, counts, verdict, now, end)
        if refusal is not None:
            return refusal
        return Grant(
            grant.key,
            grant.bucket,
            grant.period,
            tokens,
            _headers(tenant.settings, counts, now, end),
            local=True,
        )

    async def settle(self, grant: Grant, tokens: int) -> None:
        self.settle_now(grant, tokens)

    def settle_now(self, grant: Grant, tokens: int) -> None:
        delta = _counted(tokens) - grant.reserved
        if not delta:
            return
        taken = self._tokens.get(grant.key, {})
        if grant.bucket in taken:
            taken[grant.bucket] = max(0, taken[grant.bucket] + delta)
        budget = self._budgets.get(grant.key)
        if grant.period is not None and budget is not None and budget[0] == grant.period:
            self._budgets[grant.key] = (budget[0], max(0, budget[1] + delta))

    async def peek(self, tenant: Tenant) -> Counts:
        return self._count(tenant, 0, dry=True)[1]

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _end(settings: KeySettings, now: float) -> float | None:
    if settings.budget_period is None:
        return None
    return period_of(settings.budget_period, now)[1]


# KEYS: requests hash, tokens hash, budget counter.
# ARGV: bucket, buckets summed, rpm (0: none), tpm (0: none), budget (0: none), tokens,
#       hashes' ttl, budget's ttl, dry (1: count nothing): whole numbers, tokens of at most
#       15 digits (checked before the first write: an error writes nothing).
# Returns {verdict, requests, oldest request bucket (-1: none), tokens, oldest tokens bucket,
#          spent}.
_ADMIT = """
for i = 1, 9 do
  if not string.match(ARGV[i], '^%d+$') then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
if #ARGV[6] > 15 then
  return redis.error_reply('llmroute limits: tokens of more than 15 digits')
end
local bucket = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local function window(key)
  local used, oldest = 0, -1
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local b, n = tonumber(fields[i]), tonumber(fields[i + 1])
    if b <= bucket - span then
      redis.call('HDEL', key, fields[i])
    else
      used = used + n
      if n > 0 and (oldest < 0 or b < oldest) then oldest = b end
    end
  end
  return used, oldest
end
local rpm, tpm, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, ttl, budget_ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local used, oldest = window(KEYS[1])
local taken, taken_oldest = window(KEYS[2])
local spent = tonumber(redis.call('GET', KEYS[3]) or '0')
local verdict = 0
if tpm > 0 and tokens > tpm then verdict = 3
elseif rpm > 0 and used + 1 > rpm then verdict = 1
elseif tpm > 0 and taken + tokens > tpm then verdict = 2
elseif budget > 0 and spent >= budget then verdict = 4 end
if verdict == 0 and ARGV[9] == '0' then
  redis.call('HINCRBY', KEYS[1], bucket, 1)
  redis.call('EXPIRE', KEYS[1], ttl)
  used = used + 1
  if oldest < 0 then oldest = bucket end
  -- Written for 0 tokens too: it is where the answer's usage is corrected to.
  redis.call('HINCRBY', KEYS[2], bucket, ARGV[6])
  redis.call('EXPIRE', KEYS[2], ttl)
  taken = taken + tokens
  if tokens > 0 and taken_oldest < 0 then taken_oldest = bucket end
  if budget > 0 then
    redis.call('INCRBY', KEYS[3], ARGV[6])
    redis.call('EXPIRE', KEYS[3], budget_ttl)
    spent = spent + tokens
  end
end
return {verdict, used, oldest, taken, taken_oldest, spent}
"""

# KEYS: tokens hash, budget counter. ARGV: bucket, delta (a whole number of at most 15
# digits, checked before the first write). Corrects an estimate where it is still counted
# (never below 0).
_SETTLE = """
if not string.match(ARGV[2], '^%-?%d+$') or #ARGV[2] > 16 then
  return redis.error_reply('llmroute limits: the correction is not a whole number of 15 digits')
end
local delta = ARGV[2]
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local n = redis.call('HINCRBY', KEYS[1], ARGV[1], delta)
  if n < 0 then redis.call('HSET', KEYS[1], ARGV[1], 0) end
end
if KEYS[2] ~= '' and redis.call('EXISTS', KEYS[2]) == 1 then
  local n = redis.call('INCRBY', KEYS[2], delta)
  if n < 0 then redis.call('SET', KEYS[2], 0, 'KEEPTTL') end
end
return 1
"""


class RedisLimits:
    """Limits shared through Redis by every replica (see the module's docstring)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        timeout: float,
        on_error: str = "local",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = RedisConnection(url, timeout=timeout, purpose="gateway limits")
        self._calls = RedisCaller(self._redis, {"admit": _ADMIT, "settle": _SETTLE})
        self._prefix = f"{prefix}:gateway-limits:"
        self._on_error = on_error
        self._clock = clock
        self._local = LocalLimits(clock=clock)
        self._down = False

    def _keys(self, name: str, period: int | None) -> list[str]:
        # {name} is a Redis Cluster hash tag: a key's counters are in one slot, as a script needs.
        base = f"{self._prefix}{{{name}}}:"
        budget = f"{base}budget:{period}" if period is not None else ""
        return [base + "requests", base + "tokens", budget]

    async def _run(
        self, tenant: Tenant, tokens: int, now: float, dry: bool
    ) -> tuple[int, Counts, Grant]:
        s = tenant.settings
        bucket = int(now // BUCKET)
        period, end = (
            period_of(s.budget_period, now) if s.budget_period is not None else (None, None)
        )
        keys = self._keys(tenant.name, period)
        if not keys[2]:
            keys[2] = keys[0] + ":none"  # never written: the budget is 0 (none)
        ttl = int(WINDOW + 2 * BUCKET)
        budget_ttl = max(1, math.ceil((end or now) - now) + 60)
        args = [
            bucket,
            BUCKETS + 1,
            s.rpm or 0,
            s.tpm or 0,
            s.budget_tokens or 0,
            tokens,
            ttl,
            budget_ttl,
            1 if dry else 0,
        ]
        reply: list[Any] = await self._calls.run(
            lambda client, scripts: scripts["admit"](keys=keys, args=args, client=client)
        )
        verdict, used, oldest, taken, taken_oldest, spent = (int(v) for v in reply)
        counts = Counts(
            used,
            oldest if oldest >= 0 else None,
            taken,
            taken_oldest if taken_oldest >= 0 else None,
            spent,
        )
        return verdict, counts, Grant(tenant.name, bucket, period, tokens)

    def _broken(self, exc: BaseException, what: str) -> None:
        """Redis answered ``exc`` (a script's error, not an outage): logged, the mode kept."""
        log.error(
            "gateway limits: Redis refused the %s script (not an outage; %s): %s",
            what,
            "this request is refused" if what == "admission" else "the estimate stands",
            self._redis.reason(exc),
        )

    def _failed(self, exc: BaseException) -> None:
        if not self._down:
            how = "counting in this replica" if self._on_error == "local" else "refusing requests"
            log.warning(
                "gateway limits: Redis unreachable, %s until it answers: %s",
                how,
                self._redis.reason(exc),
            )
        self._down = True

    def _unavailable(self) -> Refusal:
        return Refusal(
            503,
            "limits_unavailable",
            "limits_unavailable",
            "server_error",
            "The gateway cannot count this key's limits right now (its Redis is unreachable); "
            "retry shortly.",
            _retry(1.0),
        )

    async def admit(self, tenant: Tenant, tokens: int) -> Grant | Refusal:
        tokens = _counted(tokens)
        now = self._clock()
        try:
            verdict, counts, grant = await self._run(tenant, tokens, now, False)
        except self._redis.unreachable as exc:
            self._failed(exc)
            if self._on_error == "refuse":
                return self._unavailable()
            return self._local.admit_now(tenant, tokens)
        except self._redis.errors as exc:
            self._broken(exc, "admission")
            return Refusal(
                500,
                "limits_error",
                "limits_error",
                "server_error",
                "The gateway could not count this key's limits: its Redis refused the limits "
                "script. This is the gateway's error, not the request's; it is logged.",
            )
        if self._down:
            log.info("gateway limits: Redis answers again; counting there")
        self._down = False
        end = _end(tenant.settings, now)
        refusal = _decide(tenant, tokens, counts, verdict, now, end)
        if refusal is not None:
            return refusal
        headers = _headers(tenant.settings, counts, now, end)
        return Grant(grant.key, grant.bucket, grant.period, tokens, headers)

    async def _correct(self, grant: Grant, delta: int) -> None:
        keys = self._keys(grant.key, grant.period)
        await self._calls.run(
            lambda client, scripts: scripts["settle"](
                keys=[keys[1], keys[2]], args=[grant.bucket, delta], client=client
            )
        )

    async def settle(self, grant: Grant, tokens: int) -> None:
        if grant.local:
            self._local.settle_now(grant, tokens)
            return
        delta = _counted(tokens) - grant.reserved
        if not delta:
            return
        try:
            with anyio.CancelScope(shield=True):
                await self._correct(grant, delta)
        except self._redis.unreachable as exc:
            self._failed(exc)  # the estimate stands
        except self._redis.errors as exc:
            self._broken(exc, "correction")

    async def peek(self, tenant: Tenant) -> Counts:
        """Raises what Redis answered other than an outage (the caller's 500)."""
        try:
            _, counts, _ = await self._run(tenant, 0, self._clock(), True)
        except self._redis.unreachable as exc:
            self._failed(exc)
            return await self._local.peek(tenant)
        return counts

    def close(self) -> None:
        self._redis.close()

    async def aclose(self) -> None:
        await self._calls.aclose()
