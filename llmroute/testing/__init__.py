"""Simulated OpenAI-compatible LLM providers for tests, the demo and benchmarks.

A :class:`Simulator` serves a raw ASGI app with hypercorn on 127.0.0.1, over TLS (a trustme CA,
one per process: :func:`ca_pem_path`) with HTTP/2 and HTTP/1.1 by ALPN, or over plain HTTP/1.1
(``tls=False``)::

    with Simulator(profile=Profile(ttft_median=0.2, ttft_sigma=0.5)) as sim:
        client = AsyncOpenAI(base_url=sim.base_url, api_key="x",
                             http_client=httpx.AsyncClient(http2=True, verify=sim.ssl_context()))

:class:`SimulatorProcess` runs the same server in a child process
(``python -m llmroute.testing serve --port 0 --tls --profile-json '{...}'``), which prints one
JSON line (base_url, port, ca_pem_path, pid) once ready and serves until SIGTERM/SIGINT.

Routes: ``POST /v1/chat/completions`` (streamed or not, OpenAI's wire format, tool calls,
``json_schema``/``json_object`` structured outputs), ``POST /v1/responses`` (the Responses API,
streamed with OpenAI's event sequence; ``previous_response_id`` must be an id this simulator
issued), ``POST /v1/completions``, ``POST /v1/embeddings``, ``GET /v1/models``,
``POST /v1/messages`` (Anthropic), ``GET /_sim/stats`` (counters), ``POST /_sim/reset``,
``POST /_sim/profile`` (replace some Profile fields mid-run). ``/v1`` routes need
``Authorization: Bearer <anything>``; other paths are OpenAI's ``Invalid URL`` 404.
Every response has an ``x-request-id`` header. docs/simulator.md has the details.

Replies are deterministic: words drawn by an RNG seeded from the model name and the messages
(a trailing assistant message excluded), ``Profile.reply_tokens`` long, one SSE chunk per token.
A trailing assistant message that is a prefix of the reply makes the simulator answer only the
rest (like greedy decoding with an assistant prefill). ``max_tokens`` cuts with
``finish_reason="length"``.

Per-request faults, header ``x-sim-fault`` (comma-separated to combine, e.g. ``slow:0.2,drop:3``;
legacy completions and embeddings take the status faults, ``429`` to ``404``, only):

``429``                   429 with Retry-After and retry-after-ms (OpenAI's rate-limit JSON)
``500`` / ``503``         server_error JSON (503 also carries Retry-After)
``html502``               502 with an HTML body (``text/html``), like a proxy in front
``400``                   400 invalid_request_error (an invalid parameter)
``context-length``        400 ``context_length_exceeded`` (Anthropic: "prompt is too long")
``content-policy``        400 ``content_policy_violation`` (a refusal by the safety system)
``401`` / ``403`` / ``404``  a wrong key, no permission, an unknown model
``drop:K``                stream ends abruptly after K tokens: RST_STREAM (INTERNAL_ERROR) over
                          HTTP/2, connection closed without the last chunk over HTTP/1.1
                          (non-streamed: half the body, then the same break); ``drop:A-B``
                          draws K per request from A..B with the simulator's seeded RNG (so
                          do ``malformed`` and ``stream-error``)
``hang``                  headers (streamed) but never a first token, until the client goes
                          away or ``Profile.hang_max`` passes
``malformed:K``           a ``data: {not json`` line after K tokens (the stream then goes on)
``stream-error:K``        ``data: {"error": {...,"type": "server_error"}}`` after K tokens, then
                          the stream ends (non-streamed: a 500)
``truncate:K``            a clean end of the stream after K tokens, without finish_reason or
                          ``[DONE]`` (HTTP/2 END_STREAM, HTTP/1.1 last chunk)
``loris:K:SECONDS``       after K tokens, one byte of an event every SECONDS, never its end (a
                          slow loris), until the client goes away or ``Profile.hang_max``
``oversized:K:BYTES``     after K tokens, one valid ``data:`` event of BYTES bytes (default 32 MiB)
``slow:SECONDS``          TTFT override
``stall-between:K:SECS``  a pause of SECS before token K (K >= 1)

Header ``x-sim-context-window: N`` (or ``Profile.context_window``) refuses a request whose
prompt plus ``max_tokens`` exceeds N tokens with the vendor's 400 context-length error.
Header ``x-sim-retry-after: SECONDS`` sets the Retry-After value of a 429/503. With
``x-sim-fault-times: N`` the fault hits only the first N requests that carry the same
``x-sim-fault-key`` (default: the same fault spec); later ones are served normally, which is how
tests see a retry succeed. Without ``x-sim-fault``, faults are drawn from the profile's rates with
the instance's seeded RNG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._profile import DURATION_FIELDS, PRESETS, Profile, check_fields, profile_of

if TYPE_CHECKING:
    from ._server import Simulator, SimulatorProcess, ca_pem_path
    from ._sglang import sglang_standin_path

__all__ = [
    "DURATION_FIELDS",
    "PRESETS",
    "Profile",
    "Simulator",
    "SimulatorProcess",
    "ca_pem_path",
    "check_fields",
    "profile_of",
    "sglang_standin_path",
]


def __getattr__(name: str) -> Any:
    # The servers need the testing extra (hypercorn, trustme); a profile does not, so a config
    # naming a simulator is checked without them.
    if name in ("Simulator", "SimulatorProcess", "ca_pem_path"):
        from . import _server

        return getattr(_server, name)
    if name == "sglang_standin_path":
        from ._sglang import sglang_standin_path

        return sglang_standin_path
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
