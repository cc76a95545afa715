"""llmroute's own records, attached to responses and streams beside openai's objects."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._prices import Cost

__all__ = ["AttemptReport", "RouteCost", "RouteReport", "TierDecision", "Timings"]

COST_KINDS = ("answer", "hedge", "retry", "continuation")


@dataclass(slots=True)
class Timings:
    """Where the time of one request went, in seconds on the monotonic clock.

    Every duration is measured from ``started_at`` (when the request was handed to the
    transport); a field is ``None`` until its moment has happened.
    """

    started_at: float
    connection_reused: bool | None = None
    connect: float | None = None
    """Time spent opening the connection (TCP + TLS + HTTP/2 preface); 0.0 when reused."""
    headers: float | None = None
    """Until the response headers arrived."""
    first_byte: float | None = None
    """Until the first byte of the response body arrived."""
    first_token: float | None = None
    """Until the first content, tool-call or reasoning delta was decoded."""
    total: float | None = None
    """Until the response ended (or the stream was closed)."""
    tokens: int = 0
    """Number of content, tool-call or reasoning deltas received (a stream's chunks)."""
    http_version: str | None = None
    retries: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return self.first_token


@dataclass(slots=True)
class AttemptReport:
    """One attempt of a routed request on one target."""

    target: str
    """``"provider:model"``."""
    started: float
    """Seconds after the request began."""
    reason: str
    """Why it started: "first", "race", "hedge", "failover", "retry", "explore", "probe" (a
    target without enough samples, started beside the first choice to measure it: one request
    more, no wait for the caller), "continuation"."""
    outcome: str = "pending"
    """"won", "cancelled" (a losing hedge, race or probe), "error", "timeout", "rate_limited",
    "interrupted" (broke after tokens), or "pending" (a probe that lost runs on to its first
    token after the request has its answer)."""
    ttft: float | None = None
    """Seconds from this attempt's start to its first token (the winner's, or a probe's that
    ran on to it)."""
    error: str | None = None
    """The cause of a failure, one line."""
    request_id: str | None = None
    """The vendor's id of this request (``x-request-id``, Anthropic's ``request-id``), when
    its response carried one: what a vendor's support asks for."""
    tokens: int | None = None
    """Completion tokens this attempt delivered to the caller (a streamed attempt that won):
    the vendor's own usage count of the text when it sent one, else a count that is never
    more than the vendor's (``tokens_counted``; see :mod:`llmroute.routing.tokens`)."""
    tokens_counted: str | None = None
    """How ``tokens`` was counted: ``"usage"`` (the vendor's usage, exact) or ``"deltas"``
    (one token per streamed delta with text, after the vendor's usage where some covered
    the text: a lower bound, exact where the vendor streams one token a delta)."""
    tokens_estimate: int | None = None
    """Where ``tokens`` is a lower bound (``"deltas"``): an estimate of the vendor's count
    from the target's completed answers (:mod:`llmroute.routing.tokens`), for reading only;
    llmroute's accounts use ``tokens``."""
    span_id: str | None = None
    """The parent-id of the W3C ``traceparent`` this attempt was sent with (16 hex digits):
    its span in the request's trace (``RouteReport.trace_id``), where a vendor that traces
    shows its side of the attempt."""
    usage: Any = None
    """This attempt's own ``usage`` as its vendor sent it (a dict, or openai's object), when it
    sent one: what its cost is priced from (a Responses API usage in chat completions' shape:
    ``prompt_tokens``, ``completion_tokens`` and their details)."""
    cost: Cost | None = None
    """What this attempt cost (docs/cost.md): its vendor's usage priced, or llmroute's estimate
    where the vendor reported none (``cost.estimated`` says so); ``amount`` is ``None`` with
    the reason when the price is unknown. Set once the route's cost is read
    (``RouteReport.cost``), or when the attempt lost."""
    failed_open: bool = False
    """It went to its target although the target's circuit was open: none of the request's
    targets could be asked otherwise (docs/routing.md, "When every circuit is open")."""
    cut: bool = False
    """Its caller closed the answer's stream before its end (a streamed attempt that won):
    its ``usage``, when set, is what the vendor had reported by then (Anthropic's
    ``message_start``: the prompt, not the answer), its ``tokens`` what it delivered; its
    cost is an estimate (docs/cost.md)."""


@dataclass(frozen=True, slots=True)
class RouteCost:
    """What a routed request cost, every attempt included: ``route.cost``."""

    amount: Decimal | None
    """The sum of every attempt's cost (the answer, cancelled hedges, failed retries, broken
    attempts and continuations); ``None`` when one of them is unknown (``unknown`` says why)."""
    currency: str | None
    """``"USD"`` (or ``"CNY"``); ``None`` when nothing was priced."""
    kinds: Mapping[str, Decimal] = field(default_factory=dict)
    """The known amounts by kind of attempt: ``"answer"`` (the attempt whose text the caller
    got first, broken or not), ``"continuation"`` (attempts that continued it), ``"hedge"``
    (attempts that lost a race or hedge) and ``"retry"`` (attempts that failed before a first
    token)."""
    unknown: tuple[str, ...] = ()
    """Why an attempt's cost is unknown (``"openai:gpt-6.1-terra: no price known for ..."``)."""
    estimated: tuple[str, ...] = ()
    """Why the amount may differ from the vendors' bills (llmroute's own token counts where a
    vendor reported none, assumptions about cancelled attempts, estimated prices)."""
    saved: Decimal | None = None
    """A cache hit: what the stored answer cost when a target made it (``None``: unknown)."""

    @property
    def answer(self) -> Decimal | None:
        """The answer's own cost (its first attempt), without hedges, retries, continuations."""
        return self.kinds.get("answer")

    def __str__(self) -> str:
        if self.amount is None:
            return f"cost unknown ({'; '.join(self.unknown)})"
        text = f"cost {self.amount.normalize():f} {self.currency or ''}".rstrip()
        others = [f"{kind} {amount.normalize():f}" for kind, amount in self.kinds.items() if amount]
        if len(others) > 1:
            text += f" ({', '.join(others)})"
        if self.saved is not None:
            text += f", saved {self.saved.normalize():f}"
        return text + (" (estimated)" if self.estimated else "")


@dataclass(frozen=True, slots=True)
class TierDecision:
    """Which tier (route) a request for a tiered model name was sent to, and why."""

    model: str
    """The tiered model name the application asked for."""
    tier: str
    """The route the request was sent to."""
    label: str | None
    """The class: the classifier's (``None`` on an error), or the one a request forced."""
    probability: float
    """The classifier's calibrated probability of ``label`` (1.0 when forced, 0.0 on an
    error)."""
    reason: str
    """"classifier" (its class's tier), "default" (the classifier was unsure, or its class's
    tier cannot serve the call's API: the default tier), "override" (the request named its
    tier), "conversation" (a Responses follow-up, sent to the tier whose route holds its
    ``previous_response_id``; or a chat follow-up kept on the tier its conversation reached,
    ``chosen`` its own), "hedged" (unsure, hedged across two tiers: ``hedged``), "latency"
    (``chosen`` missed the request's ``ttft_target_ms`` by its live p95; another tier its class
    allows meets it), "shadow" (shadow mode: classified, sent to the default tier) or "error"
    (the classifier failed: the default tier)."""
    micros: float
    """The classifier's own time for this decision, in microseconds."""
    chosen: str | None = None
    """The tier of the classifier's class (where a shadow or unsure decision would go)."""
    error: str | None = None
    """Why the classifier failed, or why its class's tier could not be used, one line."""
    hedged: tuple[str, str] | None = None
    """With ``reason="hedged"``: the smaller tier the request started on and the larger one
    started too if the smaller had no first token by its live p95; ``tier`` is then the one
    whose answer the caller got (the smaller one when neither answered)."""


@dataclass(slots=True)
class RouteReport:
    """How a routed request was served: ``stream.route`` / ``completion.route``."""

    route: str
    """The model name the application asked for."""
    policy: str
    winner: str | None = None
    """The target whose answer the caller got (the first one when a stream was continued);
    ``"cache"`` when the cache answered (then ``ttft`` is the time to the replayed answer)."""
    ttft: float | None = None
    """Seconds from the request to its first token as the caller saw it (hedges included);
    ``stream.timings`` are the winning attempt's own."""
    attempts: list[AttemptReport] = field(default_factory=list)
    hedges: int = 0
    """Hedge attempts fired."""
    hedges_denied: int = 0
    """Hedges the budget did not allow."""
    continued_on: list[str] = field(default_factory=list)
    """Targets that continued the answer after a mid-stream break, in order."""
    explored: str | None = None
    """A target tried first to refresh its stats (exploration), if any."""
    reason: str = ""
    """Why the policy put its first target first, when its rule alone does not say (the
    ``prefix`` policy: ``"prefix: holds 92% of the prompt beyond its common prefix"``, or why
    the least-loaded target was chosen instead)."""
    prompt_class: str = ""
    cache_hit: bool = False
    """The answer was replayed from the cache (no target was asked)."""
    shared: bool = False
    """The answer came from an identical request's call in flight at the same time
    (single-flight); ``attempts`` are that call's."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Targets of the route this request was not sent to, each with the reason (its declared
    context window is smaller than the request's estimated size)."""
    usage_estimated: list[str] = field(default_factory=list)
    """The fields of the answer's ``usage`` that are llmroute's counts, not a vendor's: a
    continued answer's ``"completion_tokens"`` where a broken attempt was counted one token
    per delta (a lower bound), ``"prompt_tokens"`` where llmroute ended the answer and no
    vendor had counted the prompt (its estimate, four characters a token)."""
    tier: TierDecision | None = None
    """For a tiered model name: the classifier's decision (``route`` is then the tier's)."""
    usage: Any = None
    """A streamed answer's newest ``usage`` (a ``CompletionUsage``) as the vendors counted it,
    whether or not the caller asked for it (llmroute asks targets for it), with what earlier
    attempts delivered added when it was continued; ``None`` when no target sent one."""
    trace_id: str | None = None
    """The W3C trace id (32 hex digits) of the request: its caller's (a ``traceparent``
    header, an active OpenTelemetry span), else a new one; every attempt's upstream request
    carried a ``traceparent`` of this trace (docs/observability.md). A ``shared`` answer's
    ``attempts`` are in the trace of the call that made them."""
    request_id: str | None = None
    """The request's own id: the gateway's ``x-request-id`` (``gw-...``) for a request that
    came through ``llmroute serve``, else the call's ``x-llmroute-request-id`` header."""
    prompt_tokens: int = field(default=0, repr=False, compare=False)
    """llmroute's estimate of the prompt's tokens (four characters a token): what an attempt
    without the vendor's usage is priced with (docs/cost.md)."""
    pricer: Callable[[RouteReport], RouteCost] | None = field(
        default=None, repr=False, compare=False
    )
    """Prices the attempts of a routed request (:mod:`llmroute.routing.costs`); computed when
    :attr:`cost` is read, not on the request's path."""
    saved: Callable[[], Decimal | None] | None = field(default=None, repr=False, compare=False)
    """A cache hit: what the stored answer cost when it was made, computed when read."""

    @property
    def cost(self) -> RouteCost | None:
        """What the request cost, every attempt included (docs/cost.md); zero for an answer
        from the cache or from an identical request's call (that call paid); ``None`` for a
        request that was not routed. Read once the answer is whole: a stream's cost grows
        until its end."""
        if self.cache_hit or self.shared:
            saved = self.saved() if self.saved is not None else None
            return RouteCost(Decimal(0), None, saved=saved)
        return self.pricer(self) if self.pricer is not None else None

    def __str__(self) -> str:
        """One line: the route, its policy, the winner, the TTFT, hedges and the cache (what
        ``llmroute chat --show-route`` prints first); ``repr()`` has every field."""
        ttft = "-" if self.ttft is None else f"{self.ttft * 1000:.0f} ms"
        return (
            f"route {self.route!r} ({self.policy}): winner {self.winner or '-'}, "
            f"TTFT {ttft}, hedges {self.hedges} (denied {self.hedges_denied}), "
            f"cache hit {'yes' if self.cache_hit else 'no'}"
            + (", shared an identical request's call" if self.shared else "")
        )
