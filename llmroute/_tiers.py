"""The routing stage of a tiered model name: which route (tier) a request goes to.

A :class:`TieredModel` holds one ``[models.<name>]`` table with ``tiers``. Its classifier
(:mod:`llmroute.tiers`, the ``tiers`` extra) is built from the examples or read from the
artefact on the first request or at ``warmup()``, in a worker thread (fitting takes up to a
second; the embedding loads in ~0.2 s), never at import. A decision itself costs 0.1-0.5 ms
of CPU and runs inline. Nothing here fails a request: a classifier that cannot be built or
that errs sends the request to the default tier, with ``reason="error"``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import anyio

from ._config import TieredSettings
from ._types import TierDecision

__all__ = ["TierError", "TieredModel"]

log = logging.getLogger("llmroute")


class TierError(ValueError):
    """A request's ``llmroute.tier`` option that names no tier of its model."""


class TieredModel:
    """One tiered model name: its tiers, default, classifier and decisions."""

    def __init__(self, settings: TieredSettings) -> None:
        self.name = settings.name
        self.settings = settings
        config = settings.config
        self.tiers: dict[str, str] = dict(config.tiers)
        self.default = config.default
        self.shadow = config.shadow
        self.uncertain_below = config.uncertain_below
        self.classifier: Any = None
        self.error: str | None = None
        self._lock = threading.Lock()

    @property
    def routes(self) -> set[str]:
        """Every route a request for this name may go to."""
        return {*self.tiers.values(), self.default}

    def forced(self, option: object) -> str:
        """The route a request's ``llmroute.tier`` names (a class or one of the routes)."""
        if isinstance(option, str):
            if option in self.tiers:
                return self.tiers[option]
            if option in self.routes:
                return option
        choices = ", ".join(repr(c) for c in [*self.tiers, *sorted(self.routes)])
        raise TierError(
            f"llmroute.tier: {str(option)[:80]!r} is not a class or tier of model "
            f"{self.name!r} (one of: {choices})"
        )

    @property
    def ready(self) -> bool:
        return self.classifier is not None or self.error is not None

    async def prepare(self) -> None:
        """Build the classifier (once), in a worker thread."""
        if not self.ready:
            await anyio.to_thread.run_sync(self.build)

    def build(self) -> None:
        """Build the classifier now (blocking); a failure is kept and logged, not raised."""
        with self._lock:
            if self.ready:
                return
            try:
                self.classifier = self._build()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                log.warning(
                    "tiers: models.%s: the classifier cannot be built (every request goes to "
                    "the default tier %r): %s",
                    self.name,
                    self.default,
                    self.error,
                )

    def _build(self) -> Any:
        from .tiers import Classifier, Example, TiersError, fit, read_examples

        settings = self.settings
        if settings.classifier is not None:
            classifier = Classifier.open(settings.classifier)
            where = str(settings.classifier)
        else:
            examples = read_examples(settings.examples) if settings.examples else []
            for label, given in settings.config.classes.items():
                texts = [*(given.examples or ()), *filter(None, [given.description])]
                examples += [
                    Example({"messages": [{"role": "user", "content": t}]}, label) for t in texts
                ]
            where = str(settings.examples or f"models.{self.name}.classes")
            unknown = sorted({e.label for e in examples} - set(self.tiers))
            if unknown:
                raise TiersError(f"{where}: classes {unknown} are not in models.{self.name}.tiers")
            missing = sorted(set(self.tiers) - {e.label for e in examples})
            if missing:
                raise TiersError(f"models.{self.name}: no examples of classes {missing}")
            classifier = fit(examples)
        unknown = sorted(set(classifier.labels) - set(self.tiers))
        if unknown:
            raise TiersError(f"{where}: classes {unknown} are not in models.{self.name}.tiers")
        missing = sorted(set(self.tiers) - set(classifier.labels))
        if missing:  # those tiers would never be chosen by the classifier
            raise TiersError(f"{where}: has no classes {missing} of models.{self.name}.tiers")
        classifier.load()
        return classifier

    def conversation(self, route: str) -> TierDecision:
        """The tier of a follow-up whose earlier response is held by ``route``'s target: no
        decision, as the conversation can be continued only there."""
        label = next((k for k, v in self.tiers.items() if v == route), None)
        return TierDecision(self.name, route, label, 1.0, "conversation", 0.0, route)

    def decide(self, body: Mapping[str, Any], forced: str | None = None) -> TierDecision:
        """The tier of one request body (``forced``: the route its options named)."""
        if forced is not None:
            label = next((k for k, v in self.tiers.items() if v == forced), None)
            return TierDecision(self.name, forced, label, 1.0, "override", 0.0, forced)
        classifier = self.classifier
        if classifier is None:
            error = self.error or "the classifier is not built"
            return TierDecision(self.name, self.default, None, 0.0, "error", 0.0, None, error)
        try:
            decision = classifier.decide(body, self.uncertain_below)
        except Exception as exc:  # decide() never raises; if it ever did, no request fails
            error = f"{type(exc).__name__}: {exc}"[:300]
            return TierDecision(self.name, self.default, None, 0.0, "error", 0.0, None, error)
        if decision.label is None:
            return TierDecision(
                self.name, self.default, None, 0.0, "error", decision.micros, None, decision.error
            )
        chosen = self.tiers[decision.label]
        if self.shadow:
            tier, reason = self.default, "shadow"
        elif decision.uncertain:
            tier, reason = self.default, "default"
        else:
            tier, reason = chosen, "classifier"
        return TierDecision(
            self.name, tier, decision.label, decision.probability, reason, decision.micros, chosen
        )
