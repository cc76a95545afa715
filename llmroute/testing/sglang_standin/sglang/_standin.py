"""Runs llmroute's SGLang stand-in server without importing the ``llmroute`` package.

``llmroute/testing/_sglang.py`` and its sibling modules are loaded as the package
``_llmroute_sglang_standin``: importing ``llmroute`` itself would load the whole client (about
0.8 s) into a process that only serves HTTP.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any, NoReturn

from . import __version__

_TESTING_DIR = Path(__file__).resolve().parents[2]
_PACKAGE = "_llmroute_sglang_standin"


def implementation() -> Any:
    """The module ``llmroute/testing/_sglang.py``, loaded from beside this package."""
    if _PACKAGE not in sys.modules:
        package = types.ModuleType(_PACKAGE)
        package.__path__ = [str(_TESTING_DIR)]
        package.__spec__ = importlib.machinery.ModuleSpec(_PACKAGE, None, is_package=True)
        sys.modules[_PACKAGE] = package
    return importlib.import_module(f"{_PACKAGE}._sglang")


def run(entry: str, argv: list[str]) -> NoReturn:
    """Parse SGLang's server flags and serve until SIGTERM; exit with the server's status."""
    sys.exit(implementation().main(argv, entry=entry, version=__version__))
