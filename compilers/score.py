"""Scoring: a rollout's outputs -> its reward through the user's metric, and validation accuracy.

A metric is DSPy-style: ``metric(example, prediction, trace=None) -> float | bool``. A rollout that did not finish
(crash, format error) is not shown to the metric: it scores ``failure_score``. A metric that raises or returns NaN
is an error naming the example, unless ``metric_failure_score`` is set, which is then its reward.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import dspy

from wfc.rollout import RolloutGraph

Metric = Callable[..., Any]


class MetricError(ValueError):
    pass


def score_rollout(metric: Metric, graph: RolloutGraph, *, failure_score: float,
                  metric_failure_score: float | None) -> float:
    if graph.status != "ok" or graph.outputs is None:
        graph.reward = failure_score
        return graph.reward
    example = dspy.Example(**graph.example)
    prediction = dspy.Prediction(**graph.outputs)
    try:
        value = metric(example, prediction)
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"metric returned {value}")
    except Exception as exc:
        if metric_failure_score is None:
            raise MetricError(
                f"the metric failed on example {graph.example!r} with prediction {graph.outputs!r}: {exc}. "
                "Fix the metric, or set metric_failure_score to score such rollouts instead") from exc
        value = metric_failure_score
    graph.reward = value
    return value
