"""Each key's requests and tokens per minute and its token budget — and its team's, and either's
for one model name — counted in one process (:class:`LocalLimits`) or shared by every gateway
replica through Redis (:class:`RedisLimits`).

**Scopes.** What a request is counted against is a list of :class:`~._tenants.Scope`: the key's
own limits, its team's (shared by every key of the team), and the key's and the team's limits
for the request's model name (``model_limits``). A request is admitted only when every scope
has room, and is then counted in all of them.

**Counting.** A minute is counted in buckets of :data:`BUCKET` seconds: a request adds 1 to each
scope's requests bucket and its token estimate (prompt and ``max_tokens``) to its tokens bucket;
what is in use is the sum of the newest ``BUCKETS + 1`` buckets, the one being filled included,
so any 60 seconds hold at most the limit (a count leaves 60-70 s after it was made: that is
the slack, and it only ever refuses early). When the request ends, its tokens are corrected to
its answer's ``usage`` (:meth:`Limits.settle`), in the bucket it was counted in, if that is
still in the window. A budget is one counter per period (a UTC day, a UTC month, or a
duration since 1970); admission needs some of it left, so the requests in flight when it runs
out can take it past its size by what they use. A scope with a ``soft_limit`` says so once per
period when its budget's spent share reaches it (an :class:`Alert`).

**One round trip.** The Redis side is one Lua script per admission that reads, checks and
counts every limit of every scope atomically — and takes the key's concurrency slot in the same
script (:meth:`RedisLimits.count`) — so two replicas cannot both take the last request of a
minute, a request refused on tokens has not spent a request, and a request pays one round trip
before its first token whatever limits it has. One more script when it ends corrects the
tokens, frees the slot and adds the request to the key's usage counters, shared by the fleet.
(The ``limits`` library was weighed and not used: a request's limits there are one call each,
not atomic together; a hit cannot be taken back, so a token estimate cannot be corrected to the
usage; its moving window stores one entry per unit, a million a minute at 1M tokens per minute;
and it has no calendar day or month. The concurrency slots' script, :mod:`._slots`, is the model
followed.)

**Counted clamped.** What enters a counter is at most
:data:`~llmroute.routing.windows.MAX_TOKENS_CAP` (2^40) tokens a request, whatever
``max_tokens`` (or a vendor's usage) says: Lua's numbers are doubles, and a count of 10^17
reached ``HINCRBY`` as ``1e+17``, which it refuses. The scripts check every argument before
their first write, and pass counts to ``HINCRBY`` as the strings they were given, so an error
leaves every counter as it was.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio

from .._redis import RedisCaller, RedisConnection
from ..routing.windows import MAX_TOKENS_CAP
from ._tenants import Scope, Tenant

__all__ = [
    "BUCKET",
    "BUCKETS",
    "MAX_TOKENS",
    "Alert",
    "Counts",
    "Grant",
    "Limits",
    "LocalLimits",
    "RedisLimits",
    "Refusal",
    "SlotClaim",
    "period_of",
    "reset_text",
]

log = logging.getLogger("llmroute.server")

WINDOW = 60.0
BUCKETS = 6
"""Buckets a minute is counted in; the newest ``BUCKETS + 1`` are summed."""
BUCKET = WINDOW / BUCKETS
"""Seconds a bucket covers."""
MAX_TOKENS = MAX_TOKENS_CAP
"""The most tokens one request is counted at, or corrected by (2^40): far above any answer, and
exact in a Lua number (a double)."""


def clamp(tokens: int) -> int:
    """``tokens`` within ``0..MAX_TOKENS`` (what can enter a counter)."""
    return max(0, min(int(tokens), MAX_TOKENS))


@dataclass(frozen=True, slots=True)
class Counts:
    """A scope's counters as one admission read them (after counting it, when admitted)."""

    requests: int = 0
    requests_oldest: int | None = None
    """The oldest bucket with a request in it."""
    tokens: int = 0
    tokens_oldest: int | None = None
    spent: int = 0
    """Of the budget, in the current period."""


@dataclass(frozen=True, slots=True)
class Alert:
    """A scope's budget reached its ``soft_limit`` share: said once per period."""

    scope: Scope
    spent: int
    ends: float | None
    """When the period ends (Unix seconds)."""


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """The key's concurrency slot, taken in the admission's own script."""

    limit: int
    lease: float
    token: str


@dataclass(frozen=True, slots=True)
class Grant:
    """An admitted request: where its tokens were counted, to correct them when it ends."""

    key: str
    bucket: int
    period: int | None
    """The budget period of its first scope (``None``: no budget)."""
    reserved: int
    """Tokens counted at admission (its estimate)."""
    headers: dict[str, str] = field(default_factory=dict)
    """OpenAI's ``x-ratelimit-*`` headers for the answer."""
    local: bool = False
    """Counted in this process (Redis was down)."""
    counted: tuple[tuple[Scope, int | None], ...] = ()
    """Each scope counted, with its budget period."""
    slot: str | None = None
    """The concurrency slot taken with it (:class:`SlotClaim`'s token)."""
    alerts: tuple[Alert, ...] = ()
    """Soft limits this admission reached."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the limits refuse: an OpenAI-shaped 429 (or 503)."""

    status: int
    reason: str
    """``requests``, ``tokens``, ``too_large``, ``budget``, ``concurrency``,
    ``limits_unavailable`` or ``limits_error``."""
    code: str
    type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


class Limits(Protocol):
    async def admit(
        self, tenant: Tenant, tokens: int, *, model: str | None = None
    ) -> Grant | Refusal:
        """Count one request of ``tenant`` to ``model`` estimated at ``tokens``, or refuse it."""
        ...

    async def settle(self, grant: Grant, tokens: int) -> tuple[Alert, ...]:
        """The request ended having used ``tokens``: correct its estimate."""
        ...

    async def peek(self, tenant: Tenant) -> Counts:
        """The counters of the key's first scope now (nothing counted)."""
        ...

    async def peek_scope(self, scope: Scope) -> Counts:
        """A scope's counters now (nothing counted)."""
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


def _period(scope: Scope, now: float) -> tuple[int | None, float | None]:
    """The scope's budget period now and its end (``None, None`` without a budget)."""
    if scope.budget_tokens is None or scope.budget_period is None:
        return None, None
    return period_of(scope.budget_period, now)


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


_Row = tuple[Scope, Counts, float | None]
"""A scope, its counters and when its budget period ends."""


def _headers(settings: Any, counts: Counts, now: float, end: float | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers (and the budget's) of one scope (or a key's
    settings: anything with ``rpm``, ``tpm`` and ``budget_tokens``)."""
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


def _rows_headers(rows: Sequence[_Row], now: float) -> dict[str, str]:
    """The headers of the scope with the least left, for requests, tokens and the budget each
    (with one scope: its own headers)."""
    if len(rows) == 1:
        scope, counts, end = rows[0]
        return _headers(scope, counts, now, end)
    out: dict[str, str] = {}
    kinds = (
        ("rpm", lambda s, c: (s.rpm or 0) - c.requests, "-requests"),
        ("tpm", lambda s, c: (s.tpm or 0) - c.tokens, "-tokens"),
        ("budget_tokens", lambda s, c: (s.budget_tokens or 0) - c.spent, "x-llmroute-budget"),
    )
    for attribute, left, mark in kinds:
        candidates = [r for r in rows if getattr(r[0], attribute) is not None]
        if not candidates:
            continue
        scope, counts, end = min(candidates, key=lambda r: left(r[0], r[1]))
        own = _headers(scope, counts, now, end)
        out.update((k, v) for k, v in own.items() if mark in k)
    return out


# What an admission decided: admitted, or refused on one limit.
_ADMITTED, _REQUESTS, _TOKENS, _TOO_LARGE, _BUDGET, _CONCURRENCY = range(6)


def _upper(label: str) -> str:
    return label[:1].upper() + label[1:]


def _decide(
    scope: Scope,
    tokens: int,
    counts: Counts,
    verdict: int,
    now: float,
    end: float | None,
    headers: dict[str, str],
) -> Refusal:
    """The refusal for ``verdict`` on ``scope``; ``headers``: the answer's limits headers."""
    s = scope
    if verdict == _REQUESTS:
        wait = _leaves(counts.requests_oldest, now)
        return Refusal(
            429,
            "requests",
            "rate_limit_exceeded",
            "requests",
            f"Rate limit reached for {s.label} on requests per minute (RPM): "
            f"Limit {s.rpm}, Used {counts.requests}. Please try again in {reset_text(wait)}.",
            headers | _retry(wait),
        )
    if verdict == _TOO_LARGE:
        return Refusal(
            429,
            "too_large",
            "rate_limit_exceeded",
            "tokens",
            f"Request too large for {s.label} on tokens per minute (TPM): Limit "
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
            f"Rate limit reached for {s.label} on tokens per minute (TPM): Limit "
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
        f"{_upper(s.label)} has used its budget of {s.budget_tokens} tokens for this period; "
        f"it renews in {reset_text(wait)}.",
        headers | _retry(wait) | {"x-should-retry": "false"},
    )


def _verdict(scopes: Sequence[Scope], rows: Sequence[Counts], tokens: int) -> tuple[int, int]:
    """The first limit a request of ``tokens`` would pass, and its scope's index (``_ADMITTED,
    -1`` when none): too large for any scope first (it can never be admitted), then each
    scope's requests, tokens and budget in order."""
    for i, s in enumerate(scopes):
        if s.tpm is not None and tokens > s.tpm:
            return _TOO_LARGE, i
    for i, (s, c) in enumerate(zip(scopes, rows, strict=True)):
        if s.rpm is not None and c.requests + 1 > s.rpm:
            return _REQUESTS, i
        if s.tpm is not None and c.tokens + tokens > s.tpm:
            return _TOKENS, i
        if s.budget_tokens is not None and c.spent >= s.budget_tokens:
            return _BUDGET, i
    return _ADMITTED, -1


def _soft_reached(scope: Scope, before: int, after: int) -> bool:
    at = scope.soft_at
    return at is not None and before < at <= after


class LocalLimits:
    """Limits counted in this process (see the module's docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._requests: dict[str, dict[int, int]] = {}
        self._tokens: dict[str, dict[int, int]] = {}
        self._budgets: dict[str, tuple[int, int]] = {}  # scope id -> (period, spent)
        self._soft: dict[str, int] = {}  # scope id -> the period its soft limit was said in

    @staticmethod
    def _window(buckets: dict[int, int], now: int) -> tuple[int, int | None]:
        for old in [b for b in buckets if b <= now - BUCKETS - 1]:
            del buckets[old]
        used = sum(buckets.values())
        oldest = min((b for b, n in buckets.items() if n > 0), default=None)
        return used, oldest

    def _read(self, scope: Scope, bucket: int, period: int | None) -> Counts:
        used, oldest = self._window(self._requests.setdefault(scope.id, {}), bucket)
        taken, taken_oldest = self._window(self._tokens.setdefault(scope.id, {}), bucket)
        own_period, spent = self._budgets.get(scope.id, (period, 0))
        if own_period != period:
            spent = 0
        return Counts(used, oldest, taken, taken_oldest, spent)

    def _add(
        self,
        scope: Scope,
        counts: Counts,
        bucket: int,
        period: int | None,
        end: float | None,
        tokens: int,
    ) -> tuple[Counts, Alert | None]:
        requests, taken = self._requests[scope.id], self._tokens[scope.id]
        requests[bucket] = requests.get(bucket, 0) + 1
        taken[bucket] = taken.get(bucket, 0) + tokens
        alert = None
        if period is not None:
            self._budgets[scope.id] = (period, counts.spent + tokens)
            alert = self._alert(scope, period, end, counts.spent, counts.spent + tokens)
        return (
            Counts(
                counts.requests + 1,
                bucket if counts.requests_oldest is None else counts.requests_oldest,
                counts.tokens + tokens,
                bucket if counts.tokens_oldest is None and tokens else counts.tokens_oldest,
                counts.spent + tokens,
            ),
            alert,
        )

    def _alert(
        self, scope: Scope, period: int, end: float | None, before: int, after: int
    ) -> Alert | None:
        at = scope.soft_at
        if at is None or after < at or self._soft.get(scope.id) == period:
            return None
        self._soft[scope.id] = period
        return Alert(scope, after, end)

    async def admit(
        self, tenant: Tenant, tokens: int, *, model: str | None = None
    ) -> Grant | Refusal:
        return self.admit_now(tenant, tokens, model=model)

    def admit_now(
        self, tenant: Tenant, tokens: int, *, model: str | None = None
    ) -> Grant | Refusal:
        tokens = clamp(tokens)
        scopes = tenant.scopes_for(model)
        now = self._clock()
        bucket = int(now // BUCKET)
        periods = [_period(s, now) for s in scopes]
        rows = [self._read(s, bucket, p) for s, (p, _) in zip(scopes, periods, strict=True)]
        verdict, at = _verdict(scopes, rows, tokens)
        if verdict != _ADMITTED:
            listed = [(s, c, e) for s, c, (_, e) in zip(scopes, rows, periods, strict=True)]
            headers = _rows_headers(listed, now)
            return _decide(scopes[at], tokens, rows[at], verdict, now, periods[at][1], headers)
        alerts: list[Alert] = []
        counted: list[_Row] = []
        for s, c, (p, e) in zip(scopes, rows, periods, strict=True):
            after, alert = self._add(s, c, bucket, p, e, tokens)
            counted.append((s, after, e))
            if alert is not None:
                alerts.append(alert)
        return Grant(
            tenant.name,
            bucket,
            periods[0][0] if periods else None,
            tokens,
            _rows_headers(counted, now) if counted else {},
            local=True,
            counted=tuple((s, p) for s, (p, _) in zip(scopes, periods, strict=True)),
            alerts=tuple(alerts),
        )

    async def settle(self, grant: Grant, tokens: int) -> tuple[Alert, ...]:
        return self.settle_now(grant, tokens)

    def settle_now(self, grant: Grant, tokens: int) -> tuple[Alert, ...]:
        delta = clamp(tokens) - grant.reserved
        if not delta:
            return ()
        alerts: list[Alert] = []
        for scope, period in grant.counted:
            taken = self._tokens.get(scope.id, {})
            if grant.bucket in taken:
                taken[grant.bucket] = max(0, taken[grant.bucket] + delta)
            budget = self._budgets.get(scope.id)
            if period is not None and budget is not None and budget[0] == period:
                spent = max(0, budget[1] + delta)
                self._budgets[scope.id] = (period, spent)
                ends = _period(scope, self._clock())[1]
                alert = self._alert(scope, period, ends, budget[1], spent)
                if alert is not None:
                    alerts.append(alert)
        return tuple(alerts)

    async def peek(self, tenant: Tenant) -> Counts:
        return await self.peek_scope(tenant.scopes[0]) if tenant.scopes else Counts()

    async def peek_scope(self, scope: Scope) -> Counts:
        now = self._clock()
        return self._read(scope, int(now // BUCKET), _period(scope, now)[0])

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


# KEYS: the key's slots (a sorted set), then per scope: requests hash, tokens hash, budget
#       counter, soft-limit flag.
# ARGV: bucket, buckets summed, tokens, hashes' ttl, dry (1: count nothing), now, lease,
#       slot limit (0: no slot), slot token, scopes; then per scope: rpm, tpm, budget (0: none),
#       budget's ttl, soft-limit tokens (0: none).
# Returns {verdict, scope index (0-based, -1: none), then per scope: requests, oldest request
#          bucket (-1: none), tokens, oldest tokens bucket, spent, soft limit reached (1)}.
# Every argument is checked (whole numbers, tokens of at most 15 digits; now and lease
# numbers) before anything is read or written: an error writes nothing. Every write happens
# after every check, so a refused request has changed nothing.
_ADMIT = """
local whole = {1, 2, 3, 4, 5, 8, 10}
for _, i in ipairs(whole) do
  if not string.match(ARGV[i], '^%d+$') then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
for _, i in ipairs({6, 7}) do
  if not string.match(ARGV[i], '^%d+%.?%d*$') then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a number')
  end
end
if #ARGV[3] > 15 then return redis.error_reply('llmroute limits: tokens of more than 15 digits') end
if #ARGV ~= 10 + 5 * tonumber(ARGV[10]) or #KEYS ~= 1 + 4 * tonumber(ARGV[10]) then
  return redis.error_reply('llmroute limits: arguments do not match the scopes')
end
for i = 11, #ARGV do
  if not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 16 then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
local bucket = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local tokens, ttl, dry = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local now, lease, slots = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local n = tonumber(ARGV[10])
local function window(key)
  local used, oldest = 0, -1
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local b, c = tonumber(fields[i]), tonumber(fields[i + 1])
    if b <= bucket - span then
      redis.call('HDEL', key, fields[i])
    else
      used = used + c
      if c > 0 and (oldest < 0 or b < oldest) then oldest = b end
    end
  end
  return used, oldest
end
if slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= slots then return {5, -1} end
end
local rows = {}
for i = 0, n - 1 do
  local k, a = 2 + 4 * i, 11 + 5 * i
  local used, oldest = window(KEYS[k])
  local taken, taken_oldest = window(KEYS[k + 1])
  local spent = 0
  if tonumber(ARGV[a + 2]) > 0 then spent = tonumber(redis.call('GET', KEYS[k + 2]) or '0') end
  rows[i] = {used, oldest, taken, taken_oldest, spent, 0}
end
local verdict, at = 0, -1
for i = 0, n - 1 do
  local tpm = tonumber(ARGV[12 + 5 * i])
  if tpm > 0 and tokens > tpm then verdict, at = 3, i break end
end
if verdict == 0 then
  for i = 0, n - 1 do
    local a, r = 11 + 5 * i, rows[i]
    local rpm, tpm, budget = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    if rpm > 0 and r[1] + 1 > rpm then verdict, at = 1, i break end
    if tpm > 0 and r[3] + tokens > tpm then verdict, at = 2, i break end
    if budget > 0 and r[5] >= budget then verdict, at = 4, i break end
  end
end
if verdict == 0 and not dry then
  if slots > 0 then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[9])
    redis.call('EXPIRE', KEYS[1], math.ceil(lease) + 1)
  end
  for i = 0, n - 1 do
    local k, a, r = 2 + 4 * i, 11 + 5 * i, rows[i]
    redis.call('HINCRBY', KEYS[k], ARGV[1], 1)
    redis.call('EXPIRE', KEYS[k], ttl)
    r[1] = r[1] + 1
    if r[2] < 0 then r[2] = bucket end
    -- Written for 0 tokens too: it is where the answer's usage is corrected to.
    redis.call('HINCRBY', KEYS[k + 1], ARGV[1], ARGV[3])
    redis.call('EXPIRE', KEYS[k + 1], ttl)
    r[3] = r[3] + tokens
    if tokens > 0 and r[4] < 0 then r[4] = bucket end
    if tonumber(ARGV[a + 2]) > 0 then
      local budget_ttl, soft = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
      redis.call('INCRBY', KEYS[k + 2], ARGV[3])
      redis.call('EXPIRE', KEYS[k + 2], budget_ttl)
      r[5] = r[5] + tokens
      local flag = KEYS[k + 3]
      if soft > 0 and r[5] >= soft and redis.call('SET', flag, 1, 'EX', budget_ttl, 'NX') then
        r[6] = 1
      end
    end
  end
end
local out = {verdict, at}
for i = 0, n - 1 do
  for j = 1, 6 do out[#out + 1] = rows[i][j] end
end
return out
"""

# KEYS: the key's slots, its usage hash, the set of keys with usage, then per scope: tokens
#       hash, budget counter (or ''), soft-limit flag.
# ARGV: slot token ('': none), bucket, delta, scopes, usage (1: count it), the usage's five
#       increments (requests, errors, prompt_tokens, completion_tokens, cache_hits), the key's
#       name; then per scope: soft-limit tokens (0: none), budget's ttl.
# Corrects an estimate where it is still counted (never below 0), frees the slot and counts the
# usage. Returns per scope {soft limit reached (1), spent}. Every argument is checked (whole
# numbers of at most 15 digits, the delta signed) before the first write: an error writes
# nothing.
_SETTLE = """
if not string.match(ARGV[3], '^%-?%d+$') or #ARGV[3] > 16 then
  return redis.error_reply('llmroute limits: the correction is not a whole number of 15 digits')
end
for i = 6, 10 do
  if not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 15 then
    return redis.error_reply('llmroute limits: a usage count is not a whole number of 15 digits')
  end
end
if not string.match(ARGV[2], '^%d+$') or not string.match(ARGV[4], '^%d+$') then
  return redis.error_reply('llmroute limits: the bucket or the scopes are not whole numbers')
end
if #ARGV ~= 11 + 2 * tonumber(ARGV[4]) or #KEYS ~= 3 + 3 * tonumber(ARGV[4]) then
  return redis.error_reply('llmroute limits: arguments do not match the scopes')
end
for i = 12, #ARGV do
  if not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 16 then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
if ARGV[5] == '1' then
  local names = {'requests', 'errors', 'prompt_tokens', 'completion_tokens', 'cache_hits'}
  for i = 1, 5 do
    if ARGV[5 + i] ~= '0' then redis.call('HINCRBY', KEYS[2], names[i], ARGV[5 + i]) end
  end
  redis.call('SADD', KEYS[3], ARGV[11])
end
local delta = tonumber(ARGV[3])
local out = {}
for i = 0, tonumber(ARGV[4]) - 1 do
  local k, a = 4 + 3 * i, 12 + 2 * i
  local reached, spent = 0, -1
  if delta ~= 0 then
    if redis.call('HEXISTS', KEYS[k], ARGV[2]) == 1 then
      local c = redis.call('HINCRBY', KEYS[k], ARGV[2], ARGV[3])
      if c < 0 then redis.call('HSET', KEYS[k], ARGV[2], 0) end
    end
    if KEYS[k + 1] ~= '' and redis.call('EXISTS', KEYS[k + 1]) == 1 then
      spent = redis.call('INCRBY', KEYS[k + 1], ARGV[3])
      if spent < 0 then
        redis.call('SET', KEYS[k + 1], 0, 'KEEPTTL')
        spent = 0
      end
      local soft, ttl = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
      if soft > 0 and spent >= soft and redis.call('SET', KEYS[k + 2], 1, 'EX', ttl, 'NX') then
        reached = 1
      end
    end
  end
  out[#out + 1] = reached
  out[#out + 1] = spent
end
return out
"""

USAGE_FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cache_hits")
"""A key's usage counters, in Redis and in ``GET /admin/usage``."""


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
        self._root = prefix
        self._prefix = f"{prefix}:gateway-limits:"
        self._on_error = on_error
        self._clock = clock
        self._local = LocalLimits(clock=clock)
        self._down = False

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """What a call raises: an outage (:attr:`unreachable`) or an error Redis answered."""
        return self._redis.errors

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]:
        """What a call raises when Redis cannot be used now (an outage)."""
        return self._redis.unreachable

    def _scope_keys(self, scope_id: str, period: int | None) -> list[str]:
        # {id} is a Redis Cluster hash tag: a scope's counters are in one slot.
        base = f"{self._prefix}{{{scope_id}}}:"
        suffix = str(period) if period is not None else "none"
        return [
            base + "requests",
            base + "tokens",
            base + "budget:" + suffix,
            base + "soft:" + suffix,
        ]

    def _keys(self, name: str, period: int | None) -> list[str]:
        """A key's own counters (requests, tokens, budget), as they have always been named."""
        return self._scope_keys(name, period)[:3]

    def slot_key(self, name: str) -> str:
        """The sorted set of the key's requests in flight (as :class:`~._slots.RedisSlots`)."""
        return f"{self._root}:gateway-slots:{name}"

    def usage_key(self, name: str) -> str:
        """The hash of the key's usage counters, summed over every replica."""
        return f"{self._root}:gateway-usage:{{{name}}}"

    @property
    def usage_index(self) -> str:
        """The set of key names with usage counters."""
        return f"{self._root}:gateway-usage-keys"

    async def _script(
        self,
        name: str,
        scopes: tuple[Scope, ...],
        tokens: int,
        slot: SlotClaim | None,
        dry: bool,
    ) -> tuple[
        int, int, list[Counts], list[bool], list[tuple[int | None, float | None]], float, int
    ]:
        """Run the admission script: its verdict, the scope refused (-1: none), each scope's
        counts and whether it reached its soft limit, the periods, now, and the bucket."""
        now = self._clock()
        bucket = int(now // BUCKET)
        periods = [_period(s, now) for s in scopes]
        keys = [self.slot_key(name)]
        args: list[Any] = [bucket, BUCKETS + 1, tokens, int(WINDOW + 2 * BUCKET), 1 if dry else 0]
        args += [time.time(), slot.lease if slot else 0, slot.limit if slot else 0]
        args += [slot.token if slot else "", len(scopes)]
        for s, (period, end) in zip(scopes, periods, strict=True):
            keys += self._scope_keys(s.id, period)
            budget_ttl = max(1, math.ceil((end or now) - now) + 60)
            args += [s.rpm or 0, s.tpm or 0, s.budget_tokens or 0, budget_ttl, s.soft_at or 0]
        reply: list[Any] = await self._calls.run(
            lambda client, scripts: scripts["admit"](keys=keys, args=args, client=client)
        )
        verdict, at = int(reply[0]), int(reply[1])
        rows: list[Counts] = []
        reached: list[bool] = []
        if verdict != _CONCURRENCY:
            for i in range(len(scopes)):
                used, oldest, taken, taken_oldest, spent, soft = (
                    int(v) for v in reply[2 + 6 * i : 8 + 6 * i]
                )
                rows.append(
                    Counts(
                        used,
                        oldest if oldest >= 0 else None,
                        taken,
                        taken_oldest if taken_oldest >= 0 else None,
                        spent,
                    )
                )
                reached.append(soft == 1)
        return verdict, at, rows, reached, periods, now, bucket

    async def count(
        self,
        tenant: Tenant,
        tokens: int,
        *,
        model: str | None = None,
        slot: SlotClaim | None = None,
    ) -> Grant | Refusal:
        """One admission script: the slot (if claimed) and every scope's limits; raises
        :attr:`errors` when Redis cannot be reached. Refused for the slot: reason
        ``concurrency`` (the caller words it)."""
        tokens = clamp(tokens)
        scopes = tenant.scopes_for(model)
        verdict, at, rows, reached, periods, now, bucket = await self._script(
            tenant.name, scopes, tokens, slot, False
        )
        if verdict == _CONCURRENCY:
            return Refusal(429, "concurrency", "rate_limit_exceeded", "requests", "")
        listed = [(s, c, e) for s, c, (_, e) in zip(scopes, rows, periods, strict=True)]
        headers = _rows_headers(listed, now) if listed else {}
        if verdict != _ADMITTED:
            return _decide(scopes[at], tokens, rows[at], verdict, now, periods[at][1], headers)
        alerts = tuple(
            Alert(s, c.spent, e)
            for s, c, (_, e), hit in zip(scopes, rows, periods, reached, strict=True)
            if hit
        )
        return Grant(
            tenant.name,
            bucket,
            periods[0][0] if periods else None,
            tokens,
            headers,
            counted=tuple((s, p) for s, (p, _) in zip(scopes, periods, strict=True)),
            slot=slot.token if slot else None,
            alerts=alerts,
        )

    async def finish(
        self, grant: Grant, tokens: int, usage: Sequence[int] | None = None
    ) -> tuple[Alert, ...]:
        """One script when a request ends: its tokens corrected in each scope, its slot freed,
        ``usage`` (:data:`USAGE_FIELDS`' increments) added to the key's; raises :attr:`errors`
        when Redis cannot be reached."""
        delta = clamp(tokens) - grant.reserved
        keys = [self.slot_key(grant.key), self.usage_key(grant.key), self.usage_index]
        counts = [str(clamp(n)) for n in usage] if usage is not None else ["0"] * 5
        args: list[Any] = [grant.slot or "", grant.bucket, delta, len(grant.counted)]
        args += ["1" if usage is not None else "0", *counts, grant.key]
        now = self._clock()
        for scope, period in grant.counted:
            own = self._scope_keys(scope.id, period)
            keys += [own[1], own[2] if period is not None else "", own[3]]
            end = _period(scope, now)[1]
            args += [scope.soft_at or 0, max(1, math.ceil((end or now) - now) + 60)]
        reply: list[Any] = await self._calls.run(
            lambda client, scripts: scripts["settle"](keys=keys, args=args, client=client)
        )
        alerts: list[Alert] = []
        for i, (scope, _) in enumerate(grant.counted):
            if int(reply[2 * i]) == 1:
                alerts.append(Alert(scope, int(reply[2 * i + 1]), _period(scope, now)[1]))
        return tuple(alerts)

    async def usage(self) -> dict[str, dict[str, int]]:
        """Every key's usage counters (summed by every replica's :meth:`finish`): key name ->
        :data:`USAGE_FIELDS`; raises :attr:`errors` when Redis cannot be reached."""
        index = self.usage_index
        members = await self._calls.run(lambda client, _: client.smembers(index))
        names = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        keys = [self.usage_key(name) for name in names]

        def read(client: Any, _: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            return pipe.execute()

        hashes: list[dict[bytes, bytes]] = await self._calls.run(read) if keys else []
        return {
            name: {f: int(counters.get(f.encode(), 0)) for f in USAGE_FIELDS}
            for name, counters in zip(names, hashes, strict=True)
        }

    async def add_calls(self, calls: dict[str, list[int]]) -> None:
        """Add API calls no request's end counted (key -> [requests, errors]) to the keys'
        usage counters, in one round trip; raises :attr:`errors`."""
        usage = {self.usage_key(key): counts for key, counts in calls.items()}
        index = self.usage_index

        def add(client: Any, _: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            for (key, (requests, errors)), name in zip(usage.items(), calls, strict=True):
                pipe.hincrby(key, "requests", clamp(requests))
                if errors:
                    pipe.hincrby(key, "errors", clamp(errors))
                pipe.sadd(index, name)
            return pipe.execute()

        await self._calls.run(add)

    def broken(self, exc: BaseException, what: str) -> None:
        """Redis answered ``exc`` (a script's error, not an outage): logged, the mode kept."""
        log.error(
            "gateway limits: Redis refused the %s script (not an outage; %s): %s",
            what,
            "this request is refused" if what == "admission" else "the estimate stands",
            self._redis.reason(exc),
        )

    def limits_error(self) -> Refusal:
        """The answer to a request whose admission script Redis refused: the gateway's 500."""
        return Refusal(
            500,
            "limits_error",
            "limits_error",
            "server_error",
            "The gateway could not count this key's limits: its Redis refused the limits "
            "script. This is the gateway's error, not the request's; it is logged.",
        )

    def failed(self, exc: BaseException) -> None:
        """Say once per outage that Redis cannot be reached."""
        if not self._down:
            how = "counting in this replica" if self._on_error == "local" else "refusing requests"
            log.warning(
                "gateway limits: Redis unreachable, %s until it answers: %s",
                how,
                self._redis.reason(exc),
            )
        self._down = True

    def answered(self) -> None:
        """Redis answered: say so once after an outage."""
        if self._down:
            log.info("gateway limits: Redis answers again; counting there")
        self._down = False

    @property
    def local(self) -> LocalLimits:
        """Where this replica counts while Redis cannot be reached."""
        return self._local

    def unavailable(self) -> Refusal:
        return Refusal(
            503,
            "limits_unavailable",
            "limits_unavailable",
            "server_error",
            "The gateway cannot count this key's limits right now (its Redis is unreachable); "
            "retry shortly.",
            _retry(1.0),
        )

    async def admit(
        self, tenant: Tenant, tokens: int, *, model: str | None = None
    ) -> Grant | Refusal:
        try:
            decided = await self.count(tenant, tokens, model=model)
        except self._redis.unreachable as exc:
            self.failed(exc)
            if self._on_error == "refuse":
                return self.unavailable()
            return self._local.admit_now(tenant, tokens, model=model)
        except self._redis.errors as exc:
            self.broken(exc, "admission")
            return self.limits_error()
        self.answered()
        return decided

    async def settle(self, grant: Grant, tokens: int) -> tuple[Alert, ...]:
        if grant.local:
            return self._local.settle_now(grant, tokens)
        if clamp(tokens) == grant.reserved:
            return ()
        alerts: tuple[Alert, ...] = ()
        try:
            with anyio.CancelScope(shield=True):
                alerts = await self.finish(grant, tokens)
        except self._redis.unreachable as exc:
            self.failed(exc)  # the estimate stands
        except self._redis.errors as exc:
            self.broken(exc, "correction")
        return alerts

    async def peek(self, tenant: Tenant) -> Counts:
        return await self.peek_scope(tenant.scopes[0]) if tenant.scopes else Counts()

    async def peek_scope(self, scope: Scope) -> Counts:
        """Raises what Redis answered other than an outage (the caller's 500)."""
        try:
            _, _, rows, _, _, _, _ = await self._script(scope.owner, (scope,), 0, None, True)
        except self._redis.unreachable as exc:
            self.failed(exc)
            return await self._local.peek_scope(scope)
        return rows[0]

    def close(self) -> None:
        self._redis.close()

    async def aclose(self) -> None:
        await self._calls.aclose()
