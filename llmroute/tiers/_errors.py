"""The tiers classifier's errors.

ValueError
└── TiersError                 a classifier that cannot be built or used
    ├── ExamplesError          a labelled-examples file with a bad line (names file and line)
    └── ArtefactError          a saved classifier that cannot be read
ImportError
└── TiersUnavailable           numpy or wordllama is missing: names the extra to install
"""

from __future__ import annotations

__all__ = ["ArtefactError", "ExamplesError", "TiersError", "TiersUnavailable"]


class TiersError(ValueError):
    """A request classifier that cannot be built or used; the message says why."""


class ExamplesError(TiersError):
    """A labelled-examples file that cannot be read: the message names the file and the line."""


class ArtefactError(TiersError):
    """A saved classifier that cannot be read: the message names the file and the fault."""


class TiersUnavailable(ImportError):
    """The classifier's optional dependencies are missing: the message names the pip command."""


def unavailable(module: str) -> TiersUnavailable:
    from .._install import install_hint

    return TiersUnavailable(
        f"the request classifier (tiers) needs {module}, which is not installed: "
        f"{install_hint('tiers')}"
    )
