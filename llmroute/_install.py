"""How to install an optional extra, as a sentence that works where llmroute runs from."""

from __future__ import annotations

from pathlib import Path

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """The pip command that installs ``llmroute[extra]`` here.

    From a source checkout (an editable install: ``pyproject.toml`` beside the package) it names
    the checkout, since llmroute is not on PyPI yet; an installed wheel names the package.
    """
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "providers").is_dir():
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install 'llmroute[{extra}]'"
