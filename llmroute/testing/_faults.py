"""The OpenAI wire mode's decisions before an answer: whether a request fits the context window,
and which fault it gets (header ``x-sim-fault`` or drawn from the profile); a request that is
answered here (a 400, a status fault) goes no further. Every fault is counted.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ._counters import SimCounters
from ._profile import Profile
from ._wire import (
    STATUS_FAULTS,
    Fault,
    Send,
    error_body,
    over_window,
    requested_fault,
    respond,
    status_fault,
)

__all__ = ["FaultDecisions"]


class FaultDecisions:
    """Decides and answers a request's context-window refusal and faults."""

    def __init__(
        self,
        profile: Callable[[], Profile],
        rng: random.Random,
        counters: SimCounters,
        uses: dict[str, int],
    ) -> None:
        """``profile()`` is the simulator's profile now; ``uses`` counts ``x-sim-fault-key``
        uses for ``x-sim-fault-times`` (shared with the Anthropic wire mode)."""
        self.profile = profile
        self.rng = rng
        self.counters = counters
        self.uses = uses

    async def too_long(
        self,
        headers: dict[str, str],
        prompt: int,
        room: Any,
        send: Send,
        rid: str,
        *,
        responses: bool = False,
    ) -> bool:
        """Answer OpenAI's 400 ``context_length_exceeded`` when the request does not fit the
        context window; whether it was answered so."""
        try:
            over = over_window(self.profile().context_window, headers, prompt, room)
        except ValueError as exc:
            await respond(send, 400, error_body(str(exc), "invalid_request_error"), rid)
            return True
        if over is None:
            return False
        window, asked = over
        self.counters.count_fault("context-window")
        if responses:
            message = (
                f"Your input exceeds the context window of this model ({window} tokens, "
                f"{asked} asked for). Please adjust your input and try again. (simulated)"
            )
            param = "input"
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {asked} tokens ({prompt} in the messages, {asked - prompt} in the "
                "completion). Please reduce the length of the messages or completion. (simulated)"
            )
            param = "messages"
        body = error_body(message, "invalid_request_error", "context_length_exceeded", param)
        await respond(send, 400, body, rid)
        return True

    async def fault(self, headers: dict[str, str], send: Send, rid: str) -> Fault | None:
        """The request's fault (``x-sim-fault`` or drawn from the profile), counted; None when
        the request is already answered (a status fault, or a malformed fault header)."""
        try:
            fault = requested_fault(headers, self.rng, self.uses, self._drawn)
            retry_after = float(headers.get("x-sim-retry-after", self.profile().retry_after))
        except ValueError as exc:
            await respond(send, 400, error_body(str(exc), "invalid_request_error"), rid)
            return None
        count = self.counters.count_fault
        if fault.kind in STATUS_FAULTS:
            count(fault.kind)
            key = headers.get("authorization", "").removeprefix("Bearer ").strip()
            await status_fault(send, fault.kind, retry_after, rid, key)
            return None
        if fault.slow is not None:
            count("slow")
        if fault.stall_after is not None:
            count("stall-between")
        if fault.kind is not None:
            count(fault.kind)
        return fault

    async def status_only(self, headers: dict[str, str], send: Send, rid: str) -> bool:
        """For legacy completions and embeddings, which have no latency or stream faults: a
        status fault the request's ``x-sim-fault`` header names, answered; whether it was
        (the profile's drawn faults never hit these endpoints)."""
        spec = headers.get("x-sim-fault")
        try:
            kind = Fault.parse(spec, self.rng).kind if spec else None
        except ValueError:  # answered as a 400 by fault(), as on every endpoint
            return await self.fault(headers, send, rid) is None
        if kind not in STATUS_FAULTS:
            return False
        return await self.fault(headers, send, rid) is None

    def _drawn(self) -> Fault:
        profile = self.profile()
        return Fault(kind=profile.sample_fault(self.rng), after=profile.fault_after)
