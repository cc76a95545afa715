"""Latency and fault profile of one simulated provider."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODELS = ("sim-small", "sim-large", "gpt-6-luna", "deepseek-v4-flash")

# Fault kinds drawn from the profile's rates, in draw order.
RANDOM_FAULTS = ("429", "500", "503", "hang", "drop", "malformed", "stream-error")

DURATION_FIELDS = (
    "ttft_median",
    "ttft_per_prompt_token",
    "stall_range",
    "inter_token",
    "retry_after",
    "hang_max",
)
"""Profile fields in seconds (``stall_range``: two of them); a config may write them as
durations such as ``"70ms"``."""


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
    prompt_cache: str = ""
    """Simulate the vendor's automatic prompt cache: a request that begins with the messages
    of an earlier one reports their tokens as cached, as the family named does: ``"openai"``
    (``prompt_tokens_details.cached_tokens``, OpenAI, Gemini, Groq), ``"deepseek"``
    (``prompt_cache_hit_tokens`` / ``prompt_cache_miss_tokens``). Empty: no cache, no field.
    (Anthropic's cache is the request's ``cache_control``, simulated always.)"""
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
        return cls(**_converted(data))


_DEMO_COMMON: dict[str, Any] = {"reply_tokens": 16, "inter_token": 0.01}

PRESETS: dict[str, Profile] = {
    "instant": Profile(),
    "fast-but-spiky": Profile(
        ttft_median=0.07,
        ttft_sigma=0.3,
        stall_prob=0.12,
        stall_range=(0.7, 1.4),
        seed=1,
        **_DEMO_COMMON,
    ),
    "steady-slow": Profile(ttft_median=0.5, ttft_sigma=0.05, seed=2, **_DEMO_COMMON),
    "flaky": Profile(
        ttft_median=0.12,
        ttft_sigma=0.35,
        rate_429=0.06,
        rate_500=0.04,
        rate_503=0.02,
        retry_after=0.5,
        seed=3,
        **_DEMO_COMMON,
    ),
}
"""Named profiles: ``instant`` (no latency, no faults: the default) and the demo's three, each
winning on one measure and losing on another: ``fast-but-spiky`` (70 ms, a stall of 0.7-1.4 s on
12% of requests), ``steady-slow`` (500 ms, steady), ``flaky`` (120 ms; 6% 429s, 4% 500s, 2%
503s)."""


def check_fields(fields: Mapping[str, Any], where: str = "profile") -> dict[str, Any]:
    """Profile fields checked by name and type (a mistake is a ``ValueError`` naming the field
    after ``where``), as :meth:`Profile.from_dict` takes them."""
    known = {f.name for f in dataclasses.fields(Profile)}
    default = Profile()
    for name, value in fields.items():
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown field {name!r}{hint}; fields: {', '.join(known)}")
        current = getattr(default, name)
        if isinstance(current, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{where}.{name}: expected true or false, got {value!r}")
        elif isinstance(current, int | float) or name == "seed":
            _check_number(name, value, integer=isinstance(current, int), where=where)
        elif name == "stall_range":
            if not (
                isinstance(value, list | tuple)
                and len(value) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
                and 0 <= value[0] <= value[1]
            ):
                raise ValueError(
                    f"{where}.stall_range: expected [low, high] seconds, got {value!r}"
                )
        elif name in ("models", "accepted_fields", "listed_models"):
            if value is None and name == "listed_models":
                continue
            if not (isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)):
                raise ValueError(f"{where}.{name}: expected a list of names, got {value!r}")
            if name == "models" and not value:
                raise ValueError(f"{where}.models: expected at least one model name")
        elif name == "thinking_off" and not isinstance(value, dict):
            raise ValueError(f"{where}.thinking_off: expected a table of fields, got {value!r}")
        elif name == "prefix_flag" and not isinstance(value, str):
            raise ValueError(f"{where}.prefix_flag: expected a field name, got {value!r}")
        elif name == "prompt_cache" and value not in PROMPT_CACHES:
            raise ValueError(
                f"{where}.prompt_cache: expected one of {', '.join(map(repr, PROMPT_CACHES))}, "
                f"got {value!r}"
            )
    return dict(fields)


PROMPT_CACHES = ("", "openai", "deepseek")
"""The usage families ``Profile.prompt_cache`` reports cached tokens as (empty: none)."""


def _check_number(name: str, value: object, *, integer: bool, where: str) -> None:
    if value is None and name == "seed":
        return
    kind = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}.{name}: expected {kind}, got {value!r}")
    if integer and not isinstance(value, int):
        raise ValueError(f"{where}.{name}: expected {kind}, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}.{name}: expected {kind} at least 0, got {value!r}")
    if (name.startswith("rate_") or name == "stall_prob") and value > 1:
        raise ValueError(f"{where}.{name}: expected a probability from 0 to 1, got {value!r}")


def profile_of(value: str | Mapping[str, Any] | None, where: str = "profile") -> Profile:
    """A profile from a preset's name (:data:`PRESETS`) or a table of fields, optionally based on
    a preset (``{"preset": "flaky", "rate_503": 0.2}``); ``None`` is ``instant``."""
    if value is None:
        return PRESETS["instant"]
    if isinstance(value, str):
        return _preset(value, where)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{where}: expected a preset's name ({', '.join(PRESETS)}) or a table of fields, "
            f"got {value!r}"
        )
    fields = dict(value)
    base = _preset(fields.pop("preset", "instant"), f"{where}.preset")
    check_fields(fields, where)
    try:
        return dataclasses.replace(base, **_converted(fields))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _converted(data: Mapping[str, Any]) -> dict[str, Any]:
    """JSON's lists as the tuples a profile holds."""
    data = dict(data)
    if "stall_range" in data:
        low, high = data["stall_range"]
        data["stall_range"] = (float(low), float(high))
    for key in ("models", "accepted_fields", "listed_models"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    return data


def _preset(name: object, where: str) -> Profile:
    if isinstance(name, str) and name in PRESETS:
        return PRESETS[name]
    close = difflib.get_close_matches(str(name), list(PRESETS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"{where}: no preset {name!r}{hint}; presets: {', '.join(PRESETS)}")
