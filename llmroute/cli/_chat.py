"""``llmroute chat``: stream one answer through the routing to the terminal."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "chat", help="stream one answer through the routing to the terminal"
    )
    parser.set_defaults(run=lambda args: parser.error("not built yet"))
