"""Sizes in bytes as people read them: ``256 MiB``, not ``268435456 bytes``."""

from __future__ import annotations

__all__ = ["format_size"]

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def format_size(size: int) -> str:
    """``size`` bytes in binary units: ``512 bytes``, ``1.5 KiB``, ``256 MiB`` (whole numbers
    without a decimal; others to one decimal, or to three significant digits)."""
    if size < 1024:
        return f"{size} byte" if size == 1 else f"{size} bytes"
    value = float(size)
    unit = _UNITS[0]
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    if value == int(value):
        return f"{int(value)} {unit}"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
