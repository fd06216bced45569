"""What a program that ignores its input scores: the trivial bar a compiled program must clear.

``constant_answer(trainset, testset, metric)`` gives every test example the most common labels of the training
set (an example's labels: its fields that are not inputs, e.g. ``answer``), scored by the task's metric. Why: a
reward that a constant answer can earn is one GRPO can climb to without learning the task (a 135M ChainOfThought
answering ``2``, the most common training answer, to every problem: docs/results.md). A compiled program at or
under this figure has learned nothing input-dependent, whatever its gain over the base.

Contract: labels are compared by their ``repr`` (ties: the first seen in training order); a metric that raises on
the constant prediction scores 0.0 for that example; an empty train or test set is a ``ValueError``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Callable, Sequence

import dspy


def _labels(example) -> dict[str, Any]:
    return dict(example.labels()) if hasattr(example, "labels") else {}


def constant_answer(trainset: Sequence, testset: Sequence, metric: Callable[..., Any]) -> dict[str, Any]:
    """``{"labels": the constant prediction's fields, "accuracy": its mean metric on testset}`` (module doc)."""
    if not trainset or not testset:
        raise ValueError("constant_answer needs non-empty train and test sets")
    counts = Counter(repr(sorted(_labels(e).items())) for e in trainset)
    common = counts.most_common(1)[0][0]
    labels = next(_labels(e) for e in trainset if repr(sorted(_labels(e).items())) == common)
    prediction = dspy.Prediction(**labels)
    scores = []
    for example in testset:
        try:
            scores.append(float(metric(example, prediction)))
        except Exception:  # a metric that cannot read a constant (code under tests, say) gives it nothing
            scores.append(0.0)
    return {"labels": {k: str(v) for k, v in labels.items()}, "accuracy": statistics.fmean(scores)}
