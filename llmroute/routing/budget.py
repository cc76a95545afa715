"""Token buckets that cap what hedging may add: extra requests (:class:`HedgeBudget`), or extra
spend (:class:`CostBudget`). A race is asked for explicitly and is not capped."""

from __future__ import annotations

__all__ = ["CostBudget", "HedgeBudget"]

_SLACK = 1e-9  # so that ten deposits of 0.1 buy one request despite float rounding


def _checked(ratio: float, burst: float) -> tuple[float, float]:
    """A budget's ``ratio`` and ``burst`` as floats; a ``ValueError`` naming the one out of
    range."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")
    if not burst >= 1.0:
        raise ValueError(f"burst must be at least 1, got {burst!r}")
    return float(ratio), float(burst)


class HedgeBudget:
    """Allows extra requests at ``ratio`` per primary request, with up to ``burst`` saved up.

    It starts full, except that a ratio of 0 allows no extra request at all. Over any run of
    requests, the extra ones that lost (hedges that did not answer first) are at most
    ``ratio * requests + burst``: a hedge that wins is refunded (:meth:`refund`), since it is
    what saved its request and a run of them says the first choice got slow; the budget must
    not starve exactly those hedges.
    """

    __slots__ = ("_burst", "_ratio", "_tokens")

    def __init__(self, ratio: float = 0.1, burst: float = 5.0) -> None:
        self._ratio, self._burst = _checked(ratio, burst)
        self._tokens = self._burst if ratio > 0 else 0.0

    @property
    def ratio(self) -> float:
        """Tokens earned per primary request."""
        return self._ratio

    @property
    def burst(self) -> float:
        """The most tokens the bucket holds."""
        return self._burst

    @property
    def tokens(self) -> float:
        """Tokens available now."""
        return self._tokens

    def on_request(self) -> None:
        """A primary request went out: earn ``ratio`` tokens, up to ``burst``."""
        self._tokens = min(self._burst, self._tokens + self._ratio)

    def refund(self, cost: float = 1.0) -> None:
        """An extra request paid off (a hedge answered first): give its tokens back."""
        self._tokens = min(self._burst, self._tokens + cost) if self._ratio > 0 else 0.0

    def try_spend(self, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens for an extra request if there are that many; whether it did."""
        if not cost >= 0.0:
            raise ValueError(f"cost must not be negative, got {cost!r}")
        if self._tokens + _SLACK < cost:
            return False
        self._tokens = max(0.0, self._tokens - cost)
        return True


class CostBudget:
    """Allows hedges whose expected cost is at most ``ratio`` of the first attempts' expected
    cost, in money: a hedge to a target ten times dearer than the first choice takes ten
    times what a hedge to an equal one takes.

    Each request earns ``ratio`` times its first attempt's expected cost (:meth:`on_request`);
    a hedge spends its own (:meth:`try_spend`), and is refunded when it answered first. The
    bucket holds up to ``burst`` times the dearest first attempt seen, or the dearest hedge
    asked for if that is more (so a hedge dearer than five first attempts can still be saved
    up for), and starts full of the first part. So over any run, the lost hedges cost at most
    ``ratio`` times the first attempts plus that cap. A hedge of unknown price is refused (it
    could cost anything); a first attempt of unknown price earns nothing.
    """

    __slots__ = ("_burst", "_dearest_first", "_dearest_hedge", "_ratio", "_tokens")

    def __init__(self, ratio: float = 0.1, burst: float = 5.0) -> None:
        self._ratio, self._burst = _checked(ratio, burst)
        self._tokens = 0.0
        self._dearest_first = 0.0
        self._dearest_hedge = 0.0

    @property
    def ratio(self) -> float:
        """The share of the first attempts' expected cost that hedges may add."""
        return self._ratio

    @property
    def tokens(self) -> float:
        """Money available for hedges now (USD)."""
        return self._tokens

    def _cap(self) -> float:
        return max(self._burst * self._dearest_first, self._dearest_hedge)

    def on_request(self, cost: float | None) -> None:
        """A request's first attempt went out, expected to cost ``cost`` (``None``: unknown)."""
        if cost is None or self._ratio <= 0 or not cost > 0:
            return
        if cost > self._dearest_first:
            self._tokens += self._burst * (cost - self._dearest_first)  # it starts full
            self._dearest_first = cost
        self._tokens = min(self._cap(), self._tokens + self._ratio * cost)

    def refund(self, cost: float | None) -> None:
        """A hedge expected to cost ``cost`` answered first: it saved its request."""
        if cost is not None and self._ratio > 0:
            self._tokens = min(self._cap(), self._tokens + cost)

    def try_spend(self, cost: float | None) -> bool:
        """Take ``cost`` for a hedge if the bucket holds that much; whether it did."""
        if cost is None or not cost >= 0.0:
            return False
        self._dearest_hedge = max(self._dearest_hedge, cost)
        if self._tokens < cost * (1.0 - _SLACK):  # relative: prices are tiny amounts
            return False
        self._tokens = max(0.0, self._tokens - cost)
        return True
