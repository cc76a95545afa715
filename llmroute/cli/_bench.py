"""``llmroute bench``: measure each target's time to first token (P50/P95/P99 by prompt length)."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "bench", help="measure each target's time to first token (P50/P95/P99 by prompt length)"
    )
    parser.set_defaults(run=lambda args: parser.error("not built yet"))
