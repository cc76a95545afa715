"""A token bucket that caps the extra requests hedging may send (a race is asked for explicitly)."""

from __future__ import annotations

__all__ = ["HedgeBudget"]

_SLACK = 1e-9  # so that ten deposits of 0.1 buy one request despite float rounding


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
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")
        if not burst >= 1.0:
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        self._ratio = float(ratio)
        self._burst = float(burst)
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
