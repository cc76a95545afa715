"""The command line's parser: argparse, with the conventions of ``gh``, ``uv`` and ``httpie``.

- a command that needs a subcommand and got none prints its help (on stderr, status 2, as
  ``uv`` does), not only a one-line error;
- a misspelt subcommand, choice or flag gets a did-you-mean (difflib), at whichever level it
  was given (argparse in Python 3.11 suggests nothing);
- ``--debug`` is read before or after the subcommand;
- help keeps the examples of an epilog as written (:func:`examples`), and wraps the rest.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

__all__ = ["Parser", "examples", "port", "walk"]

DEBUG_HELP = "show the traceback of an unexpected error"


def examples(*lines: str) -> str:
    """An epilog of example command lines, kept as written in ``--help``."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def port(text: str) -> int:
    """A ``--port`` value: a whole number from 0 to 65535 (0: any free one)."""
    try:
        number = int(text)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return number


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions as argparse does, but keeps the lines of an epilog's examples (those
    indented by two spaces) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        for line in text.splitlines():
            if line.startswith("  "):
                out.append(indent + line)
            else:
                out.append(super()._fill_text(line, width, indent))
        return "\n".join(out)


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` with did-you-mean suggestions and help for a missing
    subcommand; every subparser is one too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace or argparse.Namespace())
        if extras:
            chosen = self._chosen(parsed)
            chosen.error(f"unrecognized arguments: {' '.join(extras)}{chosen._flag_hint(extras)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        missing = "the following arguments are required: "
        if message.startswith(missing):
            wanted = message[len(missing) :].split(", ")
            for action in self._subcommands():
                if action.dest in wanted or (action.metavar or "") in wanted:
                    self.print_help(sys.stderr)
                    self.exit(2, f"\n{self.prog}: error: give a command: {_names(action)}\n")
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)  # type: ignore[misc]
        except argparse.ArgumentError as exc:
            choices = [str(choice) for choice in action.choices or ()]
            match = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
            if not match:
                raise
            raise argparse.ArgumentError(
                action, f"{exc.message}; did you mean {match[0]!r}?"
            ) from None

    def _subcommands(self) -> list[argparse._SubParsersAction[Parser]]:
        return [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]

    def _chosen(self, parsed: argparse.Namespace) -> Parser:
        """The deepest subparser the parsed arguments went through."""
        parser = self
        while True:
            found = [
                sub.choices[name]
                for sub in parser._subcommands()
                if isinstance(name := getattr(parsed, sub.dest, None), str) and name in sub.choices
            ]
            if not found:
                return parser
            parser = found[0]

    def _flag_hint(self, extras: Sequence[str]) -> str:
        known = [flag for action in self._actions for flag in action.option_strings]
        hints: dict[str, str] = {}
        for extra in extras:
            flag = extra.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            match = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            if match:
                hints[flag] = match[0]
        if len(hints) == 1 and len(extras) == 1:
            return f"; did you mean {next(iter(hints.values()))}?"
        said = "; ".join(f"{flag}: did you mean {match}?" for flag, match in hints.items())
        return f" ({said})" if hints else ""


def _names(action: argparse._SubParsersAction[Parser]) -> str:
    return ", ".join(action.choices)


def walk(parser: Parser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Parser]]:
    """``parser`` and every subparser below it, each with its command path (``("sglang",
    "launch")``), parents first."""
    yield path, parser
    for action in parser._subcommands():
        for name, sub in action.choices.items():
            yield from walk(sub, (*path, name))


def add_debug_everywhere(parser: Parser) -> None:
    """``--debug`` on every subparser too, so it works after the subcommand (it sets nothing
    unless given, so the top level's stays when it comes first)."""
    for path, sub in walk(parser):
        if path:
            sub.add_argument(
                "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
            )
