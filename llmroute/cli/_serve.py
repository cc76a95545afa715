"""``llmroute serve``: an OpenAI-compatible gateway with the routing and cache behind it."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "serve", help="an OpenAI-compatible gateway with the routing and cache behind it"
    )
    parser.set_defaults(run=lambda args: parser.error("not built yet"))
