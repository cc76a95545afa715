"""Command line: ``python -m llmroute.testing serve [--port 0] [--tls/--no-tls] ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ._profile import Profile
from ._server import serve_process


def _announce(info: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmroute.testing")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a simulated provider until SIGTERM")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--http2", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--profile-json", default="{}", help="Profile fields as a JSON object")
    serve.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    profile = Profile.from_dict(json.loads(args.profile_json))
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
