"""Each key's requests and tokens per minute and its token budget — and its team's, and either's
for one model name — counted in one process (:class:`LocalLimits`) or shared by every gateway
replica through Redis (:class:`RedisLimits`).

**Scopes.** What a request is counted against is a list of :class:`~.._tenants.Scope`: the key's
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
and it has no calendar day or month. The concurrency slots' script, :mod:`.._slots`, is the model
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

**Where.** The counters' units and an admission's answer in :mod:`._counts`, its verdict,
refusal and headers in :mod:`._verdicts`, the two backends in :mod:`._local` and :mod:`._redis`
(its scripts in ``admit.lua`` and ``settle.lua``, beside them).
"""

from __future__ import annotations

from ._counts import (
    BUCKET,
    BUCKETS,
    MAX_TOKENS,
    Alert,
    Counts,
    Grant,
    Limits,
    Refusal,
    SlotClaim,
    period_of,
)
from ._local import LocalLimits
from ._redis import TARGET_SPEND, USAGE_FIELDS, RedisLimits
from ._verdicts import reset_text

__all__ = [
    "BUCKET",
    "BUCKETS",
    "MAX_TOKENS",
    "TARGET_SPEND",
    "USAGE_FIELDS",
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
