"""Command line: ``python -m llmroute.testing serve [--port 0] [--tls/--no-tls] ...``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import json
import sys
from typing import Any

from ._profile import Profile
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
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    for name, value in data.items():
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"--profile-json: unknown field {name!r}{hint}; fields: {', '.join(fields)}"
            )
        default = getattr(Profile(), name)
        number = isinstance(default, int | float) and not isinstance(default, bool)
        if (number or name == "seed") and (
            isinstance(value, bool) or not isinstance(value, int | float | None)
        ):
            raise ValueError(f"--profile-json: {name} must be a number, got {value!r}")
        if name == "stall_range" and not (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(
                f"--profile-json: stall_range must be [low, high] seconds, got {value!r}"
            )
        if name == "models" and not (
            isinstance(value, list) and value and all(isinstance(v, str) for v in value)
        ):
            raise ValueError(f"--profile-json: models must be an array of names, got {value!r}")
    try:
        return Profile.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--profile-json: {exc}") from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmroute.testing")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a simulated provider until SIGTERM")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=0)
    serve.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--http2", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--profile-json", default="{}", help="Profile fields as a JSON object")
    serve.add_argument("--seed", type=int, default=None)
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
