"""Small formatting helpers shared by the commands."""

from __future__ import annotations

__all__ = ["ms"]


def ms(seconds: float | None) -> str:
    """``seconds`` as whole milliseconds, or ``-`` when unknown."""
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
