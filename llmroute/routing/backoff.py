"""Retry decisions as pure functions of status, headers, attempt and a random draw.

The same rules, constants and formula as openai's client (``_parse_retry_after_header``,
``_should_retry``, ``_calculate_retry_timeout``), with the clock and the jitter passed in so they
are tested without sleeping.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping

__all__ = [
    "INITIAL_RETRY_DELAY",
    "MAX_RETRY_AFTER_DELAY",
    "MAX_RETRY_DELAY",
    "parse_retry_after",
    "retry_delay",
    "should_retry_status",
]

INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER_DELAY = 2 * 60
_INFINITY_LITERALS = frozenset({"inf", "+inf", "infinity", "+infinity"})


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and not hasattr(headers, "get_list"):  # a plain dict: match any case
        for key, item in headers.items():
            if key.lower() == name:
                return item
    return value


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float) -> float | None:
    """Seconds the server asks to wait, or ``None`` if it does not say.

    ``retry-after-ms`` wins over ``retry-after``; both may be floats. Otherwise ``retry-after``
    may be an HTTP date, taken relative to ``now`` (a ``time.time()`` value). A number too large
    for a float reads as just over the two-minute maximum, so it is refused, not shortened.
    Header names match in any case.
    """
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = _header(headers, name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if delay == math.inf and value.strip().lower() not in _INFINITY_LITERALS:
            return MAX_RETRY_AFTER_DELAY + 1
        return delay / divisor

    retry_header = _header(headers, "retry-after")
    try:
        retry_date_tuple = email.utils.parsedate_tz(retry_header)  # type: ignore[arg-type]
        if retry_date_tuple is None:
            return None
        retry_date = email.utils.mktime_tz(retry_date_tuple)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return float(retry_date - now)


def should_retry_status(status_code: int, headers: Mapping[str, str], *, now: float) -> bool:
    """Whether an error response is worth retrying, by openai's rules, in openai's order.

    A finite ``Retry-After`` over two minutes means no; then ``x-should-retry: true``/``false``
    decides; then 408, 409, 429 and any 5xx are retried, nothing else.
    """
    retry_after = parse_retry_after(headers, now=now)
    if (
        retry_after is not None
        and math.isfinite(retry_after)
        and retry_after > MAX_RETRY_AFTER_DELAY
    ):
        return False
    should_retry = _header(headers, "x-should-retry")
    if should_retry == "true":
        return True
    if should_retry == "false":
        return False
    return status_code in (408, 409, 429) or status_code >= 500


def retry_delay(
    *,
    retries_done: int,
    max_retries: int,
    headers: Mapping[str, str] | None,
    now: float,
    rand: float,
) -> float:
    """Seconds to wait before retry number ``retries_done + 1``, as openai computes it.

    A server-given delay in (0, 120] seconds is honoured as is. Otherwise exponential backoff from
    0.5 s, capped at 8 s, less a jitter of up to 25 %: ``rand`` in [0, 1) is that draw (openai's
    ``random()``). ``max_retries`` is the budget the retry counts against; openai's formula
    depends only on the retries done.
    """
    retry_after = parse_retry_after(headers, now=now)
    if (
        retry_after is not None
        and math.isfinite(retry_after)
        and 0 < retry_after <= MAX_RETRY_AFTER_DELAY
    ):
        return retry_after
    del max_retries  # openai's max_retries - remaining_retries is exactly retries_done
    nb_retries = min(retries_done, 1000)
    sleep_seconds = min(INITIAL_RETRY_DELAY * pow(2.0, nb_retries), MAX_RETRY_DELAY)
    timeout = sleep_seconds * (1 - 0.25 * rand)
    return timeout if timeout >= 0 else 0
