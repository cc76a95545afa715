"""Latency and fault profile of one simulated provider."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODELS = ("sim-small", "sim-large", "gpt-6-luna", "deepseek-v4-flash")

# Fault kinds drawn from the profile's rates, in draw order.
RANDOM_FAULTS = ("429", "500", "503", "hang", "drop", "malformed", "stream-error")


@dataclass(frozen=True)
class Profile:
    """How a simulated provider behaves: latency distribution, reply length and fault rates.

    The default profile has zero latency and no faults (fast enough for benchmarks).
    """

    ttft_median: float = 0.0
    """Median time to first token in seconds (TTFT is lognormal; 0 means no delay)."""
    ttft_sigma: float = 0.0
    """Sigma of the lognormal TTFT (0: always the median)."""
    ttft_per_prompt_token: float = 0.0
    """Extra TTFT per prompt token (a prefill cost), in seconds."""
    stall_prob: float = 0.0
    """Probability that a request hits the stall tail before its first token."""
    stall_range: tuple[float, float] = (1.0, 3.0)
    """Extra TTFT, uniform in (min, max) seconds, for a stalled request."""
    inter_token: float = 0.0
    """Delay between tokens in seconds (0: no timer at all)."""
    reply_tokens: int = 32
    """Length of a full reply in tokens (one token is one word)."""
    tokens_per_chunk: int = 1
    """Tokens per streamed delta (Anthropic's streams, and others, often carry several); faults
    that count tokens (``drop:K``, ...) then count deltas. Usage still counts tokens."""
    token_bytes: int = 0
    """Pad each token of a chat reply to this many characters (0: a word as is); 4096 makes
    events as long as a vendor's tool-call arguments."""
    max_streams: int = 1000
    """The HTTP/2 streams a client may open at once on one connection (SETTINGS)."""
    hold_first_token: bool = False
    """Hold every stream before its first token (its headers already sent) until the next
    ``POST /_sim/release`` (``release()``), at most ``hang_max``; its TTFT starts then. A
    benchmark holds N streams open at once this way, however slowly a loaded machine opens
    them, and measures the client with all N open."""
    frame_per_event: bool = False
    """Send every SSE event in its own HTTP/2 DATA frame and TLS record, as vendors that flush
    each token do (False: hypercorn coalesces whatever the app sent meanwhile, often ~8 events
    per frame)."""
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_hang: float = 0.0
    rate_drop: float = 0.0
    rate_malformed: float = 0.0
    rate_stream_error: float = 0.0
    retry_after: float = 1.0
    """Seconds sent in Retry-After / retry-after-ms with a 429 or 503."""
    fault_after: int = 3
    """Tokens sent before a random drop, malformed line or in-stream error."""
    hang_max: float = 300.0
    """Upper bound of a hang (the handler also ends when the client goes away)."""
    context_window: int = 0
    """Tokens (the simulator's count of the prompt, plus the answer's ``max_tokens``) a model
    takes at most; past it a request is answered with the vendor's 400 context-length error
    (0: no window). Header ``x-sim-context-window`` sets it per request."""
    echo_prefix: bool = False
    """Begin the answer to a trailing assistant message (a prefix continuation) with that
    prefix, as Mistral's API does; the prefix is no part of the answer's usage."""
    echo_counted: bool = False
    """Count the echoed prefix (``echo_prefix``) in the answer's ``completion_tokens``, as a
    vendor may (Mistral does not say whether it does)."""
    prefix_flag: str = ""
    """The field a trailing assistant message must set to true to be continued (Mistral's and
    DeepSeek's ``prefix``, Moonshot's ``partial``); without it such a request is answered 400,
    as those vendors do. Empty: any trailing assistant message is continued."""
    reasoning_tokens: int = 0
    """Words of reasoning streamed first, as ``reasoning_content`` deltas, in every chat
    answer (a model that thinks by default, DeepSeek V4), unless the request carries all of
    ``thinking_off``."""
    thinking_off: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Top-level request fields that turn thinking off, e.g. ``{"thinking": {"type":
    "disabled"}}`` (empty: nothing does)."""
    accepted_fields: tuple[str, ...] = ()
    """The only top-level chat request fields accepted: any other is answered 422
    ``extra_forbidden`` naming the field, as Mistral's API does. Empty: all are accepted."""
    seed: int | None = 0
    """Seed of the instance's random.Random (None: not repeatable)."""
    models: tuple[str, ...] = field(default=DEFAULT_MODELS)
    """Model names listed by GET /v1/models (models seen in requests are added)."""
    listed_models: tuple[str, ...] | None = None
    """When set, GET /v1/models lists exactly these, whatever the requests named: a vendor that
    no longer lists a model (or lists newer ones), for ``llmroute doctor``."""

    def sample_ttft(self, rng: random.Random, prompt_tokens: int = 0) -> float:
        """Draw one TTFT in seconds."""
        ttft = 0.0
        if self.ttft_median > 0:
            ttft = (
                rng.lognormvariate(math.log(self.ttft_median), self.ttft_sigma)
                if self.ttft_sigma > 0
                else self.ttft_median
            )
        if self.stall_prob > 0 and rng.random() < self.stall_prob:
            ttft += rng.uniform(*self.stall_range)
        return ttft + self.ttft_per_prompt_token * prompt_tokens

    def sample_fault(self, rng: random.Random) -> str | None:
        """Draw the random fault of one request (None for most requests)."""
        rates = (
            self.rate_429,
            self.rate_500,
            self.rate_503,
            self.rate_hang,
            self.rate_drop,
            self.rate_malformed,
            self.rate_stream_error,
        )
        if not any(rates):
            return None
        draw = rng.random()
        acc = 0.0
        for kind, rate in zip(RANDOM_FAULTS, rates, strict=True):
            acc += rate
            if draw < acc:
                return kind
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for the subprocess mode)."""
        data = dataclasses.asdict(self)
        data["stall_range"] = list(self.stall_range)
        data["models"] = list(self.models)
        data["accepted_fields"] = list(self.accepted_fields)
        if self.listed_models is not None:
            data["listed_models"] = list(self.listed_models)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """Build a profile from a dict; unknown keys raise TypeError."""
        data = dict(data)
        if "stall_range" in data:
            low, high = data["stall_range"]
            data["stall_range"] = (float(low), float(high))
        for key in ("models", "accepted_fields", "listed_models"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)
