"""llmroute's own records, attached to responses and streams beside openai's objects."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Timings"]


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
