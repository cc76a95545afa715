"""Reading SGLang's command-line flags out of an argument list (the user's ``extra_args``):
the last value a flag is given, under any of its spellings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

_ALIASES: Final = {"--model": "--model-path"}
"""Spellings SGLang accepts for the same option (``--model`` is ``--model-path``'s alias)."""

_PARALLEL_SPELLINGS: Final = {
    "--tp-size": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "--dp-size": ("--dp-size", "--data-parallel-size", "--dp"),
}
"""SGLang's spellings of the parallel sizes; ``--tp`` and ``--dp`` are argparse's prefix
matches of ``--tp-size`` and ``--dp-size``, which users write."""


def _flag_name(token: str) -> str | None:
    if not token.startswith("--") or token == "--":
        return None
    name = token.split("=", 1)[0]
    return _ALIASES.get(name, name)


def _user_value(args: Sequence[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag value`` or ``--flag=value``; the last wins)."""
    value: str | None = None
    for i, token in enumerate(args):
        if _flag_name(token) != flag:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
    return value


def _parallel_size(args: Sequence[str], flag: str) -> int | None:
    """The value ``args`` give a parallel size under any of its spellings (the last wins)."""
    value: int | None = None
    spellings = _PARALLEL_SPELLINGS[flag]
    for i, token in enumerate(args):
        name, _, inline = token.partition("=")
        if name not in spellings:
            continue
        text = inline if "=" in token else (args[i + 1] if i + 1 < len(args) else "")
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} takes a whole number, got {text!r}") from None
    return value
