"""How well a classifier sorts labelled requests, beside baselines that need no classifier.

Cross-validation (stratified folds: each fold is classified by a classifier fitted on the
others), or a fitted classifier on a file it was not fitted on. The baselines are fitted on the
same training folds: ``random`` (a uniform guess among the classes), ``majority`` (always the
most common class) and ``length`` (logistic regression on the prompt's log length alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ._errors import TiersError
from ._examples import Example
from ._features import FeatureSpec, request_text
from ._model import Classifier, _logistic, fit_matrix, softmax, stratified_folds

__all__ = ["Evaluation", "cross_validate", "evaluate"]

BASELINES = ("random", "majority", "length")


@dataclass(slots=True)
class Evaluation:
    """Counts and figures of one evaluation; :meth:`accuracy` and friends derive from them."""

    labels: tuple[str, ...]
    method: str
    truth: list[int] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)
    uncertain: list[bool] = field(default_factory=list)
    probability: list[float] = field(default_factory=list)
    micros: list[float] = field(default_factory=list)
    errors: int = 0
    baselines: dict[str, list[int]] = field(default_factory=dict)

    def accuracy(self, predicted: Sequence[int] | None = None) -> float:
        guess = self.predicted if predicted is None else predicted
        return float(np.mean(np.asarray(guess) == np.asarray(self.truth))) if self.truth else 0.0

    def recall(self, predicted: Sequence[int] | None = None) -> dict[str, float]:
        guess = np.asarray(self.predicted if predicted is None else predicted)
        truth = np.asarray(self.truth)
        out: dict[str, float] = {}
        for index, label in enumerate(self.labels):
            members = truth == index
            out[label] = float(np.mean(guess[members] == index)) if members.any() else 0.0
        return out

    def confusion(self) -> np.ndarray:
        """Rows: the true class; columns: the class decided."""
        matrix = np.zeros((len(self.labels), len(self.labels)), dtype=np.int64)
        for truth, guess in zip(self.truth, self.predicted, strict=True):
            if guess >= 0:  # -1: the classifier erred
                matrix[truth, guess] += 1
        return matrix

    def share(self) -> dict[str, float]:
        """The share of requests decided for each class."""
        guess = np.asarray(self.predicted)
        n = max(len(guess), 1)
        return {label: float(np.sum(guess == i)) / n for i, label in enumerate(self.labels)}

    def latency(self, quantile: float) -> float:
        return float(np.quantile(self.micros, quantile)) if self.micros else 0.0

    def calibration_gap(self) -> float:
        """Mean decided probability minus accuracy: near 0 when probabilities mean what they say."""
        if not self.probability:
            return 0.0
        return float(np.mean(self.probability)) - self.accuracy()


def _lengths(bodies: Sequence[object]) -> np.ndarray:
    return np.asarray(
        [np.log1p(request_text(body).user_chars) for body in bodies],  # type: ignore[arg-type]
        dtype=np.float64,
    )


def _baselines(
    train_y: np.ndarray,
    train_len: np.ndarray,
    test_len: np.ndarray,
    classes: int,
    rng: np.random.Generator,
) -> dict[str, list[int]]:
    majority = int(np.bincount(train_y, minlength=classes).argmax())
    mean, std = float(train_len.mean()), float(train_len.std()) or 1.0
    weights, bias = _logistic(((train_len - mean) / std)[:, None], train_y, classes, 1e-3)
    scores = ((test_len - mean) / std)[:, None] @ weights + bias
    present = np.unique(train_y)
    return {
        "random": [int(v) for v in rng.choice(present, size=len(test_len))],
        "majority": [majority] * len(test_len),
        "length": [int(v) for v in np.argmax(softmax(scores), axis=1)],
    }


def cross_validate(
    examples: Sequence[Example],
    *,
    spec: FeatureSpec | None = None,
    folds: int = 5,
    seed: int = 0,
    uncertain_below: float | None = None,
) -> Evaluation:
    """Stratified ``folds``-fold cross-validation of :func:`fit` and of the baselines.

    Each held-out request is decided one at a time through :meth:`Classifier.decide`, so the
    latencies are those of single decisions, features included.
    """
    spec = spec or FeatureSpec()
    names = tuple(sorted({example.label for example in examples}))
    if len(names) < 2:
        raise TiersError("cross-validation needs examples of at least two classes")
    y = np.asarray([names.index(example.label) for example in examples], dtype=np.intp)
    smallest = int(np.bincount(y).min())
    k = min(folds, smallest)
    if k < 2:
        raise TiersError(
            "cross-validation needs at least two examples of every class "
            f"(the smallest class has {smallest})"
        )
    bodies = [example.body for example in examples]
    features = spec.matrix(bodies)
    lengths = _lengths(bodies)
    result = Evaluation(labels=names, method=f"{k}-fold cross-validation")
    per_baseline: dict[str, list[int]] = {name: [] for name in BASELINES}
    rng = np.random.default_rng(seed)
    for test in stratified_folds(y, k, seed):
        train = np.setdiff1d(np.arange(len(y)), test)
        labels = [names[i] for i in y[train]]
        model = fit_matrix(features[train], labels, spec=spec, seed=seed)
        _decide_into(result, model, [bodies[i] for i in test], y[test], names, uncertain_below)
        for name, guesses in _baselines(
            y[train], lengths[train], lengths[test], len(names), rng
        ).items():
            per_baseline[name].extend(guesses)
    result.baselines = per_baseline
    return result


def evaluate(
    classifier: Classifier,
    examples: Sequence[Example],
    *,
    folds: int = 5,
    seed: int = 0,
    uncertain_below: float | None = None,
) -> Evaluation:
    """A fitted classifier on labelled examples (not the ones it was fitted on).

    The baselines cannot be fitted on the classifier's own examples (the artefact does not keep
    them), so they are cross-validated on these examples: an advantage to the baselines.
    """
    names = classifier.labels
    unknown = sorted({e.label for e in examples} - set(names))
    if unknown:
        raise TiersError(
            f"the examples have classes the classifier does not know: {', '.join(unknown)} "
            f"(it knows {', '.join(names)})"
        )
    y = np.asarray([names.index(example.label) for example in examples], dtype=np.intp)
    bodies = [example.body for example in examples]
    result = Evaluation(labels=names, method="the fitted classifier on every example")
    _decide_into(result, classifier, bodies, y, names, uncertain_below)
    lengths = _lengths(bodies)
    present = np.unique(y)
    k = min(folds, int(np.bincount(y)[present].min())) if len(present) > 1 else 0
    per_baseline: dict[str, list[int]] = {name: [0] * len(y) for name in BASELINES}
    rng = np.random.default_rng(seed)
    splits = stratified_folds(y, k, seed) if k >= 2 else [np.arange(len(y))]
    for test in splits:
        train = np.setdiff1d(np.arange(len(y)), test) if k >= 2 else test
        guesses = _baselines(y[train], lengths[train], lengths[test], len(names), rng)
        for name, values in guesses.items():
            for index, value in zip(test, values, strict=True):
                per_baseline[name][int(index)] = value
    result.baselines = per_baseline
    return result


def _decide_into(
    result: Evaluation,
    classifier: Classifier,
    bodies: Sequence[object],
    y: np.ndarray,
    names: tuple[str, ...],
    uncertain_below: float | None,
) -> None:
    for body, truth in zip(bodies, y, strict=True):
        decision = classifier.decide(body, uncertain_below)  # type: ignore[arg-type]
        result.truth.append(int(truth))
        result.micros.append(decision.micros)
        if decision.label is None:
            result.errors += 1
            result.predicted.append(-1)
            result.uncertain.append(True)
            result.probability.append(0.0)
            continue
        result.predicted.append(names.index(decision.label))
        result.uncertain.append(decision.uncertain)
        result.probability.append(decision.probability)
