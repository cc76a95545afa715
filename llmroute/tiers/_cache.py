"""Fitted classifiers kept on disk by their examples' hash, so only a process's first fit pays.

A tiered name built from examples (not from a saved artefact) was fitted anew by every process:
about a second of CPU before its first decision (``llmroute chat --model auto`` each time).
:func:`cached_fit` keeps the fitted artefact, in :meth:`Classifier.save`'s format (a ``.npz`` of
arrays and a JSON header, read with ``allow_pickle=False``), under ``tiers/<key>.npz`` in the
user's cache directory (``LLMROUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/llmroute``, else
``~/.cache/llmroute``). The key is a SHA-256 of the examples (labels and bodies), the feature
spec and the fitting code's version; the artefact carries it too, so a file that is damaged, of
another format or made from other examples is ignored and replaced, never trusted. Files are
written to a temporary name and renamed (readers never see half of one); a directory that cannot
be written only costs the fit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .._version import __version__
from ..config import default_cache_dir
from ._errors import ArtefactError
from ._examples import Example
from ._features import FeatureSpec
from ._model import FORMAT, Classifier, fit

__all__ = ["cache_dir", "cached_fit", "examples_key"]

log = logging.getLogger("llmroute")


def cache_dir() -> Path:
    """``$LLMROUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/llmroute``, else ``~/.cache/llmroute``."""
    return Path(default_cache_dir())


def examples_key(examples: Sequence[Example], spec: FeatureSpec) -> str:
    """A SHA-256 (hex) of what a fit depends on: the examples, the features and the code."""
    try:
        from importlib.metadata import version

        wordllama = version("wordllama")
    except Exception:  # not installed: the spec then has no embedding, or fails later anyway
        wordllama = ""
    header = {
        "format": FORMAT,
        "llmroute": __version__,
        "wordllama": wordllama,
        "features": spec.to_json(),
    }
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for example in examples:
        line = json.dumps([example.label, example.body], sort_keys=True, default=str)
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def cached_fit(examples: Sequence[Example], directory: Path | None = None) -> Classifier:
    """:func:`fit` of ``examples``, read from the cache when a valid artefact of the same key is
    there, else fitted and stored (a cache that cannot be read or written is skipped)."""
    spec = FeatureSpec()
    key = examples_key(examples, spec)
    path = (directory or cache_dir()) / "tiers" / f"{key}.npz"
    if path.is_file():
        try:
            return Classifier.open(path, key=key)
        except ArtefactError as exc:
            log.warning("tiers: ignoring a cached classifier, fitting again: %s", exc)
    classifier = fit(examples, spec=spec)
    try:
        _store(classifier, path, key)
    except OSError as exc:
        log.debug("tiers: cannot keep the fitted classifier in %s: %s", path.parent, exc)
    return classifier


def _store(classifier: Classifier, path: Path, key: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".fit-", suffix=".tmp")  # 0600
    try:
        os.close(fd)
        classifier.save(temporary, key=key)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
