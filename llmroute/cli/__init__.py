"""The ``llmroute`` command line.

``demo``, ``bench``, ``chat``, ``serve``, ``sim``, ``cache stats|clear``, ``sglang launch``,
``doctor``, ``tiers fit|eval``, ``top`` and ``keys``; each command is one module here with a
``register(commands)`` function that adds its parser and sets ``run`` (a function of the parsed
arguments returning the exit status).

A command's mistakes are sentences on stderr and a non-zero status; an unexpected exception is
one line too (``--debug`` shows its traceback), never a traceback by default.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .._version import __version__
from . import (
    _bench,
    _cache,
    _chat,
    _completion,
    _demo,
    _doctor,
    _keys,
    _serve,
    _sglang,
    _sim,
    _tiers,
    _top,
)
from ._parser import DEBUG_HELP, Parser, add_debug_everywhere, examples

__all__ = ["build_parser", "main"]

_COMMANDS = (
    _demo,
    _bench,
    _chat,
    _serve,
    _sim,
    _cache,
    _sglang,
    _doctor,
    _tiers,
    _top,
    _keys,
    _completion,
)


def build_parser() -> Parser:
    """The whole command line's parser (``llmroute completion`` reads it too)."""
    parser = Parser(
        prog="llmroute",
        description="llmroute: the first token of an LLM answer, sooner and more reliably.",
        epilog=examples(
            "llmroute demo",
            "llmroute chat --simulator 'Hello!' --show-route",
            "llmroute serve --simulator",
        ),
    )
    parser.add_argument("--version", action="version", version=f"llmroute {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(commands)
    add_debug_everywhere(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error("arguments after -- are for llmroute sglang launch")
    args.extra = extra
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        sys.stderr.write(f"\nllmroute {args.command}: interrupted\n")
        return 130
    except Exception as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or "(no message)"
        sys.stderr.write(
            f"llmroute {args.command}: unexpected error: {type(exc).__name__}: {message}\n"
            "(this is a bug in llmroute, or a case it does not handle yet; run "
            f"'llmroute --debug {args.command} ...' for the traceback)\n"
        )
        return 1
