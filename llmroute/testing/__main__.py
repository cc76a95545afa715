"""Command line: ``python -m llmroute.testing serve [--port 0] [--tls/--no-tls] ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ._profile import Profile, profile_of
from ._server import serve_process


def _announce(info: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()


def _profile(text: str) -> Profile:
    """A :class:`Profile` from ``--profile-json``; a mistake is a sentence naming the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--profile-json is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("--profile-json must be a JSON object such as '{\"ttft_median\": 0.2}'")
    return profile_of(data, "--profile-json")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmroute.testing",
        description="One simulated provider in this process, for SimulatorProcess (users: "
        "llmroute sim).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a simulated provider until SIGTERM")
    serve.add_argument("--host", default="127.0.0.1", help="the address (127.0.0.1)")
    serve.add_argument("--port", type=_port, default=0, help="the port (0: any free one)")
    serve.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TLS with the simulators' CA (--no-tls: plain HTTP/1.1)",
    )
    serve.add_argument(
        "--http2",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offer HTTP/2 by ALPN (over TLS)",
    )
    serve.add_argument(
        "--profile-json",
        default="{}",
        help='Profile fields as a JSON object, optionally on a preset: \'{"preset": "flaky"}\'',
    )
    serve.add_argument("--seed", type=int, default=None, help="the random draws' seed")
    args = parser.parse_args(argv)
    try:
        profile = _profile(args.profile_json)
    except ValueError as exc:
        sys.stderr.write(f"python -m llmroute.testing serve: {exc}\n")
        return 2
    asyncio.run(
        serve_process(
            profile,
            host=args.host,
            port=args.port,
            tls=args.tls,
            http2=args.http2,
            seed=args.seed,
            announce=_announce,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
