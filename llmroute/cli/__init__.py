"""The ``llmroute`` command line.

``demo``, ``bench``, ``chat``, ``serve``, ``sim``, ``cache stats|clear``, ``sglang launch``,
``doctor``, ``tiers fit|eval``, ``top`` and ``keys``; each command is one module here with a
``register(commands)`` function that adds its parser and sets ``run`` (a function of the parsed
arguments returning the exit status).

A command's mistakes are sentences on stderr and a non-zero status; an unexpected exception is
one line too (``--debug`` shows its traceback), never a traceback by default. When whatever reads
stdout goes away (``llmroute top --once | head -1``), the command stops at once, silently, with
status 141, as git and the coreutils do when SIGPIPE ends them.
"""

from __future__ import annotations

import os
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

__all__ = ["CLOSED_PIPE", "build_parser", "main"]

CLOSED_PIPE = 141
"""The status when stdout's reader has gone: 128 + SIGPIPE, what a shell reports for git, cat
or yes ended by the signal (Python ignores SIGPIPE, so a write raises BrokenPipeError instead)."""

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
    # ``llmroute completion`` reads the whole parser from its arguments (importing this package
    # from _completion.py would be an import circle).
    parser.set_defaults(root_parser=parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(argv)
    except BrokenPipeError as exc:  # --help or --version into a closed pipe
        if _stdout_gone(exc):
            return _stop_writing()
        raise
    if extra and not getattr(args, "takes_extra", False):
        parser.error("arguments after -- are for llmroute sglang launch")
    args.extra = extra
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        sys.stderr.write(f"\nllmroute {args.command}: interrupted\n")
        return 130
    except Exception as exc:
        if _stdout_gone(exc):
            return _stop_writing()
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or "(no message)"
        sys.stderr.write(
            f"llmroute {args.command}: unexpected error: {type(exc).__name__}: {message}\n"
            "(this is a bug in llmroute, or a case it does not handle yet; run "
            f"'llmroute --debug {args.command} ...' for the traceback)\n"
        )
        return 1


def _stdout_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is (or groups) a BrokenPipeError and stdout's reader has gone: a broken
    socket to a server is an error to report, not a closed pipe."""
    if isinstance(exc, BaseExceptionGroup):
        if exc.subgroup(BrokenPipeError) is None:
            return False
    elif not isinstance(exc, BrokenPipeError):
        return False
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stdout (tests) cannot break
        return False
    if not hasattr(select, "poll"):  # Windows: the likeliest pipe to break is stdout
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _stop_writing() -> int:
    """Point stdout at /dev/null, so what is still buffered cannot fail again when Python flushes
    it at exit (which would print "Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return CLOSED_PIPE
