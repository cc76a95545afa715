"""Formatting and summary helpers shared by the commands (percentiles, tables, consoles)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import httpx
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

__all__ = [
    "PLOT_FORMATS",
    "QUANTILES",
    "MissingExtra",
    "add_tls_options",
    "check_output_path",
    "check_plot_path",
    "error_text",
    "http_url",
    "make_console",
    "ms",
    "percentiles",
    "progress_bar",
    "ratio",
    "require",
    "table",
    "tls_verify",
]

QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
"""The quantiles every command reports: p50, p95, p99."""

PLOT_FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
"""The picture formats a ``--plot FILE`` may name by its extension."""


class MissingExtra(Exception):
    """Raised when a command needs an optional dependency that is not installed."""


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` naming the pip command for ``extra``."""
    from .._install import install_hint

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"{module} is not installed: {install_hint(extra)}") from None


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    """``--ca FILE`` and ``--insecure``: how a command trusts the targets' TLS certificates."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--ca",
        metavar="FILE",
        help=(
            "trust this CA file (PEM) for every target without its own verify in the config, "
            "e.g. a simulator's ca.pem (default: the system's roots, or $SSL_CERT_FILE)"
        ),
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify TLS certificates (a test server only: anyone can read the traffic)",
    )


def tls_verify(args: argparse.Namespace, flag_owner: str) -> bool | str:
    """The ``verify`` that :func:`add_tls_options` asked for; raises :class:`ValueError` with a
    sentence when ``--ca`` names no readable file."""
    if getattr(args, "insecure", False):
        return False
    ca: str | None = getattr(args, "ca", None)
    if ca is None:
        return True
    path = os.path.expanduser(ca)
    if not os.path.exists(path):
        raise ValueError(f"{flag_owner}: --ca {ca}: no such file")
    try:
        import ssl

        ssl.create_default_context(
            cafile=None if os.path.isdir(path) else path,
            capath=path if os.path.isdir(path) else None,
        )
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ValueError(f"{flag_owner}: --ca {ca}: not a CA file in PEM form ({exc})") from None
    return path


def error_text(exc: BaseException) -> str:
    """``str(exc)`` on one line; for openai's bare ``Connection error.`` (a model that is not a
    route goes through openai's own code, which keeps the transport's error as the cause) the
    cause too, such as a certificate that did not verify."""
    text = " ".join(str(exc).split())
    cause = " ".join(str(exc.__cause__ or "").split())
    if text == "Connection error." and cause:
        return f"Connection error: {cause}"
    return text


def http_url(url: str, example: str) -> httpx.URL:
    """``url`` parsed, a bare ``host:port`` taken as ``http://``; a ``ValueError`` sentence
    (suggesting ``example``) when it is not an http(s) URL."""
    import httpx

    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, ValueError):
        raise ValueError(f"{url!r} is not a URL; give one such as http://127.0.0.1:8000") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http(s) URL; give one such as {example}")
    return parsed


def check_output_path(path: str, flag: str) -> str | None:
    """Why ``path`` cannot be written (a sentence naming ``flag``), or ``None`` if it can.

    Checked before a long run, so a typo in the output's directory does not lose the run.
    """
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        return f"{flag} {path}: is a directory; give a file name"
    if not os.path.isdir(folder):
        return f"{flag} {path}: the directory {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK) or (
        os.path.exists(target) and not os.access(target, os.W_OK)
    ):
        return f"{flag} {path}: not writable by this user"
    return None


def plot_format(path: str) -> str | None:
    """The format ``path``'s extension names (``png``, ``svg``, ``pdf``), or ``None``."""
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    return extension if extension in PLOT_FORMATS else None


def check_plot_path(path: str, flag: str) -> str | None:
    """Why a picture cannot be written at ``path`` (:func:`check_output_path`'s reasons, or an
    extension that names no format the commands write), or ``None`` if it can."""
    problem = check_output_path(path, flag)
    if problem is not None or plot_format(path) is not None:
        return problem
    extension = os.path.splitext(path)[1]
    said = f"{extension} is not a picture format llmroute writes" if extension else "no extension"
    choices = ", ".join(f".{name}" for name in PLOT_FORMATS[:-1]) + f" or .{PLOT_FORMATS[-1]}"
    return f"{flag} {path}: {said}; end the name in {choices}"


def ms(seconds: float | None) -> str:
    """``seconds`` as whole milliseconds, or ``-`` when unknown."""
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def percentiles(values: Iterable[float], qs: Sequence[float] = QUANTILES) -> list[float | None]:
    """The ``qs``-quantiles of ``values`` (``None`` each when there are none).

    The same estimator as the live routing stats (linear interpolation between closest ranks),
    so a number a command prints means what ``client.stats()`` means.
    """
    from ..routing.stats import LatencyWindow

    samples = list(values)
    if not samples:
        return [None for _ in qs]
    window = LatencyWindow(window=float("inf"), max_samples=len(samples))
    for value in samples:
        window.add(value)
    return [window.quantile(q) for q in qs]


def ratio(before: float | None, after: float | None) -> str:
    """How many times smaller ``after`` is than ``before``, e.g. ``3.2x``; ``-`` if unknown."""
    if before is None or after is None or after <= 0:
        return "-"
    return f"{before / after:.1f}x"


def make_console(file: TextIO | None = None, *, width: int = 120) -> Console:
    """A rich console on ``file`` (stdout): live and coloured on a terminal, plain in a pipe."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    terminal = out.isatty()
    return Console(
        file=out,
        force_terminal=terminal,
        no_color=not terminal,
        highlight=False,
        width=None if terminal else width,
    )


def progress_bar(console: Console, *, disable: bool = False) -> Progress:
    """A rich progress display: description, bar, done of total, time elapsed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=disable,
    )


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table: the first column left-aligned, the others (numbers) right-aligned."""
    from rich import box
    from rich.table import Table

    out = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for index, column in enumerate(columns):
        out.add_column(column, justify="left" if index == 0 else "right", no_wrap=True)
    for row in rows:
        out.add_row(*(str(cell) for cell in row))
    return out
