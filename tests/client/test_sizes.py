"""Sizes as people read them (``256 MiB``, not ``268435456 bytes``), wherever one is said."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmroute._sizes import format_size
from llmroute.cli import main


@pytest.mark.parametrize(
    ("size", "said"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (1023, "1023 bytes"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (4 * 2**20, "4 MiB"),
        (256 * 2**20, "256 MiB"),
        (2**20 + 1, "1.0 MiB"),
        (150 * 2**20 + 12345, "150 MiB"),
        (10**9, "954 MiB"),
        (3 * 2**30, "3 GiB"),
        (5 * 2**40, "5 TiB"),
        (2**60, "1048576 TiB"),
    ],
)
def test_format_size(size: int, said: str) -> None:
    assert format_size(size) == said


def test_cache_stats_say_sizes_in_binary_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(f'[cache]\nbackend = "disk"\npath = "{tmp_path / "cache"}"\n')
    assert main(["cache", "stats", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"disk at {tmp_path / 'cache'} (up to 256 MiB)" in out  # the default max_bytes
    assert "268435456" not in out
    assert "  size      " in out
