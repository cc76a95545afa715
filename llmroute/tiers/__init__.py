"""Tiers: an in-process, offline classifier of chat requests (the first part of issue 27).

Pure logic: it knows nothing of HTTP or of the routing engine. It needs numpy and ``wordllama``
(the ``tiers`` extra); ``import llmroute`` never imports it, and importing it without them
raises :class:`TiersUnavailable` naming the pip command.

    from llmroute.tiers import Classifier, fit, read_examples

    classifier = fit(read_examples("labelled.jsonl"))
    classifier.save("tiers.npz")
    decision = Classifier.open("tiers.npz").decide({"messages": [...]})
    decision.label, decision.probability, decision.uncertain, decision.micros

See docs/tiers.md.
"""

from __future__ import annotations

from ._errors import ArtefactError, ExamplesError, TiersError, TiersUnavailable, unavailable
from ._examples import Example, examples_from, read_examples

try:
    import numpy as _numpy  # noqa: F401
except ImportError:
    raise unavailable("numpy") from None

from ._cache import cached_fit
from ._eval import cross_validate, evaluate
from ._features import FeatureSpec, load_embedding, request_text
from ._model import Classifier, Decision, fit

__all__ = [
    "ArtefactError",
    "Classifier",
    "Decision",
    "Example",
    "ExamplesError",
    "FeatureSpec",
    "TiersError",
    "TiersUnavailable",
    "cached_fit",
    "cross_validate",
    "evaluate",
    "examples_from",
    "fit",
    "load_embedding",
    "read_examples",
    "request_text",
]
