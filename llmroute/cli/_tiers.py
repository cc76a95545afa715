"""``llmroute tiers fit|eval``: fit the request classifier from labelled JSONL, or measure it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ._parser import examples

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tiers = commands.add_parser(
        "tiers",
        help="the offline request classifier: fit it from labelled examples, or eval it",
        epilog=examples(
            "llmroute tiers fit labelled.jsonl --out tiers.npz",
            "llmroute tiers eval labelled.jsonl --model tiers.npz --plot eval.svg",
        ),
    )
    actions = tiers.add_subparsers(dest="action", required=True)
    fit = actions.add_parser(
        "fit",
        help="fit and calibrate a classifier, write its artefact",
        epilog=examples(
            "llmroute tiers fit labelled.jsonl --out tiers.npz",
            "llmroute tiers fit labelled.jsonl --out tiers.npz --no-embedding",
        ),
    )
    fit.add_argument(
        "file", help='labelled examples, JSONL: {"text"|"messages": ..., "label": ...}'
    )
    fit.add_argument("--out", required=True, help="the artefact to write (.npz)")
    eval_ = actions.add_parser(
        "eval",
        help="accuracy, recall, confusion and latency beside baselines",
        epilog=examples(
            "llmroute tiers eval labelled.jsonl --folds 5",
            "llmroute tiers eval labelled.jsonl --model tiers.npz --json",
            "llmroute tiers eval labelled.jsonl --model tiers.npz --plot eval.svg",
        ),
    )
    eval_.add_argument("file", help="labelled examples, JSONL")
    eval_.add_argument(
        "--model",
        help="a fitted artefact to evaluate on FILE (default: cross-validate fitting on FILE)",
    )
    eval_.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    eval_.add_argument("--json", action="store_true", help="the figures as one JSON object")
    eval_.add_argument(
        "--plot",
        metavar="FILE",
        help="also write a picture (PNG, SVG or PDF by the extension): accuracy beside the "
        "baselines, confusion, reliability (needs llmroute[plot])",
    )
    for parser in (fit, eval_):
        parser.add_argument(
            "--uncertain-below",
            type=float,
            default=None,
            help="a decision less probable than this is uncertain (default 0.6)",
        )
        parser.add_argument(
            "--no-embedding",
            action="store_true",
            help="character n-grams and structure only (no wordllama embedding)",
        )
        parser.add_argument("--seed", type=int, default=0, help="the folds' shuffle (default 0)")
    fit.set_defaults(run=_fit)
    eval_.set_defaults(run=_eval)


def _fail(message: str) -> int:
    """A mistake (a bad file, a missing extra) as a sentence on stderr: exit status 2."""
    sys.stderr.write(f"llmroute tiers: {message}\n")
    return 2


def _fit(args: argparse.Namespace) -> int:
    try:
        from ..tiers import FeatureSpec, TiersError, TiersUnavailable, fit, read_examples
    except ImportError as exc:
        return _fail(str(exc))
    try:
        examples = read_examples(args.file)
        spec = FeatureSpec(embedding=not args.no_embedding)
        start = time.perf_counter()
        classifier = fit(
            examples,
            spec=spec,
            uncertain_below=0.6 if args.uncertain_below is None else args.uncertain_below,
            seed=args.seed,
        )
        seconds = time.perf_counter() - start
        classifier.save(args.out)
    except (TiersError, TiersUnavailable) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot write {args.out}: {exc.strerror or exc}")
    counts = ", ".join(f"{label} {n}" for label, n in classifier.counts.items())
    calibration = (
        f"temperature {classifier.temperature:.3g} fitted on held-out folds"
        if classifier.calibrated
        else "uncalibrated (fewer than two examples of some class)"
    )
    sys.stdout.write(
        f"Fitted {len(examples)} examples ({counts}) in {seconds:.1f} s: penalty "
        f"{classifier.reg:g}, {calibration}; wrote {args.out}.\n"
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    try:
        from ..tiers import (
            Classifier,
            FeatureSpec,
            TiersError,
            TiersUnavailable,
            cross_validate,
            evaluate,
            read_examples,
        )
    except ImportError as exc:
        return _fail(str(exc))
    if args.folds < 2:
        return _fail(f"--folds must be at least 2, got {args.folds}")
    if args.plot:
        from ._format import MissingExtra, check_plot_path, require

        problem = check_plot_path(args.plot, "--plot")
        if problem:
            return _fail(problem)
        try:
            require("matplotlib", "plot")
        except MissingExtra as exc:
            return _fail(str(exc))
    try:
        examples = read_examples(args.file)
        if args.model:
            classifier = Classifier.open(args.model)
            classifier.load()
            result = evaluate(
                classifier,
                examples,
                folds=args.folds,
                seed=args.seed,
                uncertain_below=args.uncertain_below,
            )
        else:
            spec = FeatureSpec(embedding=not args.no_embedding)
            if spec.embedding:
                from ..tiers import load_embedding

                load_embedding()
            result = cross_validate(
                examples,
                spec=spec,
                folds=args.folds,
                seed=args.seed,
                uncertain_below=args.uncertain_below,
            )
    except (TiersError, TiersUnavailable) as exc:
        return _fail(str(exc))
    figures = _figures(result)
    if args.plot:
        try:
            _plot(args.plot, result, figures)
        except OSError as exc:
            return _fail(f"cannot write {args.plot}: {exc.strerror or exc}")
    if args.json:
        sys.stdout.write(json.dumps(figures) + "\n")
    else:
        sys.stdout.write(_table(figures))
    return 0


def _figures(result: Any) -> dict[str, Any]:
    labels = list(result.labels)
    return {
        "examples": len(result.truth),
        "method": result.method,
        "labels": labels,
        "accuracy": result.accuracy(),
        "recall": result.recall(),
        "share": result.share(),
        "confusion": result.confusion().tolist(),
        "uncertain_share": sum(result.uncertain) / max(len(result.uncertain), 1),
        "calibration_gap": result.calibration_gap(),
        "errors": result.errors,
        "latency_us": {"p50": result.latency(0.5), "p99": result.latency(0.99)},
        "baselines": {
            name: {"accuracy": result.accuracy(guesses), "recall": result.recall(guesses)}
            for name, guesses in result.baselines.items()
        },
    }


def _table(f: dict[str, Any]) -> str:
    labels: list[str] = f["labels"]
    width = max(12, *(len(label) + 2 for label in labels))
    lines = [f"{f['examples']} labelled requests, {f['method']}", ""]
    header = f"{'':<14}{'accuracy':>10}" + "".join(
        f"{'recall ' + label:>{width + 7}}" for label in labels
    )
    lines.append(header)

    def row(name: str, accuracy: float, recall: dict[str, float]) -> str:
        return f"{name:<14}{accuracy:>10.1%}" + "".join(
            f"{recall[label]:>{width + 7}.1%}" for label in labels
        )

    lines.append(row("classifier", f["accuracy"], f["recall"]))
    for name, values in f["baselines"].items():
        lines.append(row(name, values["accuracy"], values["recall"]))
    lines += ["", "confusion (rows: true class, columns: decided)"]
    lines.append(f"{'':<{width}}" + "".join(f"{label:>{width}}" for label in labels))
    for label, counts in zip(labels, f["confusion"], strict=True):
        lines.append(f"{label:<{width}}" + "".join(f"{n:>{width}}" for n in counts))
    shares = ", ".join(f"{label} {f['share'][label]:.1%}" for label in labels)
    lines += [
        "",
        f"share decided: {shares}",
        f"uncertain: {f['uncertain_share']:.1%}   mean probability - accuracy: "
        f"{f['calibration_gap']:+.3f}   errors: {f['errors']}",
        f"decision latency: p50 {f['latency_us']['p50']:.0f} us, "
        f"p99 {f['latency_us']['p99']:.0f} us (features included, one request at a time)",
    ]
    return "\n".join(lines) + "\n"


def _plot(path: str, result: Any, f: dict[str, Any]) -> None:
    """The picture of one evaluation: accuracy and recall beside the baselines, the confusion matrix
    (each row a share of its true class) and reliability (decided probability against accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ._bench_plot import save

    labels: list[str] = f["labels"]
    figure, (bars, matrix, reliability) = plt.subplots(
        1,
        3,
        figsize=(15, 4.5 + 0.1 * max(len(labels) - 4, 0)),
        gridspec_kw={"width_ratios": [1.4, 1, 1]},
    )
    _baseline_bars(bars, f)
    _confusion(matrix, f)
    _reliability(reliability, result, f)
    figure.suptitle(f"llmroute tiers eval: {f['examples']} labelled requests, {f['method']}")
    figure.tight_layout()
    save(figure, path)
    plt.close(figure)


def _baseline_bars(bars: Any, f: dict[str, Any]) -> None:
    """Accuracy and each class's recall, the classifier's beside each baseline's."""
    import numpy as np

    labels: list[str] = f["labels"]
    rows = [("classifier", f["accuracy"], f["recall"])] + [
        (name, values["accuracy"], values["recall"]) for name, values in f["baselines"].items()
    ]
    groups = ["accuracy", *(f"recall {label}" for label in labels)]
    width = 0.8 / len(rows)
    for i, (name, accuracy, recall) in enumerate(rows):
        heights = [accuracy, *(recall[label] for label in labels)]
        bars.bar(
            np.arange(len(groups)) + (i - (len(rows) - 1) / 2) * width, heights, width, label=name
        )
    bars.set_xticks(
        np.arange(len(groups)),
        groups,
        rotation=30 if len(groups) > 4 else 0,
        ha="right" if len(groups) > 4 else "center",
        fontsize="small",
    )
    bars.set_ylim(0, 1.18)
    bars.set_yticks(np.linspace(0, 1, 6))
    bars.set_title("beside the baselines")
    bars.legend(fontsize="small", loc="upper center", ncol=len(rows))
    bars.grid(True, axis="y", alpha=0.3)


def _confusion(matrix: Any, f: dict[str, Any]) -> None:
    """The confusion matrix: counts, each row shaded by its share of its true class."""
    import numpy as np

    labels: list[str] = f["labels"]
    counts = np.asarray(f["confusion"], dtype=float)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    matrix.imshow(shares, vmin=0, vmax=1, cmap="Blues")
    ticks = np.arange(len(labels))
    matrix.set_xticks(ticks, labels, rotation=90 if len(labels) > 4 else 0, fontsize="small")
    matrix.set_yticks(ticks, labels, fontsize="small")
    if len(labels) <= 12:
        for (row, column), n in np.ndenumerate(counts):
            matrix.text(
                column,
                row,
                f"{n:.0f}",
                ha="center",
                va="center",
                fontsize="small",
                color="white" if shares[row, column] > 0.5 else "black",
            )
    matrix.set_xlabel("decided")
    matrix.set_ylabel("true class")
    matrix.set_title("confusion (counts; shade: share of the row)")


def _reliability(reliability: Any, result: Any, f: dict[str, Any]) -> None:
    """Reliability: the decided probability, in bins of 0.1, against the accuracy there."""
    import numpy as np

    probability = np.asarray(result.probability, dtype=float)
    right = np.asarray(result.predicted) == np.asarray(result.truth)
    decided = np.asarray(result.predicted) >= 0
    bins = np.minimum((probability * 10).astype(int), 9)  # 0.0-0.1, ..., 0.9-1.0
    centres, accuracies, sizes = [], [], []
    for index in range(10):
        members = decided & (bins == index)
        if members.any():
            centres.append(float(probability[members].mean()))
            accuracies.append(float(right[members].mean()))
            sizes.append(int(members.sum()))
    reliability.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
    reliability.scatter(centres, accuracies, s=[20 + 200 * n / max(sizes or [1]) for n in sizes])
    reliability.plot(centres, accuracies)
    reliability.set_xlim(0, 1)
    reliability.set_ylim(0, 1)
    reliability.set_xlabel("decided probability (bins of 0.1; dot size: requests)")
    reliability.set_ylabel("accuracy")
    reliability.set_title(f"reliability (mean probability - accuracy {f['calibration_gap']:+.3f})")
    reliability.grid(True, alpha=0.3)
