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


def call_metric(metric: Metric, example: dict[str, Any], outputs: dict[str, Any], *,
                metric_failure_score: float | None) -> float:
    """The metric's finite float value on ``outputs``, the one place wfc calls a user metric. A metric that raises or
    returns NaN/inf gives ``metric_failure_score``, or a :class:`MetricError` naming the example when that is None."""
    try:
        value = float(metric(dspy.Example(**example), dspy.Prediction(**outputs)))
        if not math.isfinite(value):
            raise ValueError(f"metric returned {value}")
    except Exception as exc:
        if metric_failure_score is None:
            raise MetricError(
                f"the metric failed on example {example!r} with prediction {outputs!r}: {exc}. "
                "Fix the metric, or set metric_failure_score to score such rollouts instead") from exc
        value = float(metric_failure_score)
    return value


def score_rollout(metric: Metric, graph: RolloutGraph, *, failure_score: float,
                  metric_failure_score: float | None) -> float:
    if graph.status != "ok" or graph.outputs is None:
        graph.reward = failure_score
        return graph.reward
    graph.reward = call_metric(metric, graph.example, graph.outputs, metric_failure_score=metric_failure_score)
    return graph.reward


def mean_interval(values: list[float], *, z: float = 1.96) -> tuple[float, float]:
    """A ~95% confidence interval of the mean of ``values``: Wilson's score interval when every value is 0 or 1
    (accuracy; it stays inside [0, 1] and is sane at 0/n and n/n), else the normal interval with the sample std."""
    n = len(values)
    if n == 0:
        return (0.0, 1.0)
    mean = math.fsum(values) / n
    if all(v in (0.0, 1.0) for v in values):
        centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(0.0, centre - half), min(1.0, centre + half))
    if n == 1:
        return (mean, mean)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return (mean - z * std / math.sqrt(n), mean + z * std / math.sqrt(n))


def paired_difference(before: list[float], after: list[float], *, z: float = 1.96,
                      clusters: list | None = None) -> dict:
    """``after - before`` on the same items (two programs' scores per problem): the mean difference with its normal
    ~95% interval, and how many items only one of them solved (score above the other's).

    ``clusters`` (one label per item, e.g. a generated task's function name): items of one cluster are not
    independent (a model that cannot write ``clamp`` fails every ``clamp`` task), so the interval treats clusters,
    not items, as the draws: the variance of the mean is ``G / (G - 1) * sum_g (S_g - n_g * mean)^2 / n^2`` (``S_g``
    the sum of cluster g's differences, ``n_g`` its size, ``G`` clusters; the cluster-robust sandwich of a mean with
    the small-sample factor). The result then also has ``clusters`` (G). Treating clustered items as independent
    gives an interval too narrow whenever wins and losses come by cluster. One cluster gives ``(-inf, inf)``: there
    is no spread between clusters to estimate it from."""
    if len(before) != len(after) or not before:
        raise ValueError(f"paired scores need two equal, non-empty lists; got {len(before)} and {len(after)}")
    diffs = [b - a for a, b in zip(before, after)]
    n = len(diffs)
    mean = math.fsum(diffs) / n
    result = {"difference": mean, "only_after": sum(d > 0 for d in diffs), "only_before": sum(d < 0 for d in diffs)}
    if clusters is None:
        var = math.fsum((d - mean) ** 2 for d in diffs) / max(n - 1, 1) / n
    else:
        if len(clusters) != n:
            raise ValueError(f"clusters needs one label per item: {len(clusters)} labels for {n} items")
        sums: dict = {}
        for label, d in zip(clusters, diffs):
            total, size = sums.get(label, (0.0, 0))
            sums[label] = (total + d, size + 1)
        g = len(sums)
        var = (g / (g - 1)) * math.fsum((total - size * mean) ** 2 for total, size in sums.values()) / n ** 2 \
            if g > 1 else math.inf
        result["clusters"] = g
    half = z * math.sqrt(var)
    return {**result, "interval": [mean - half, mean + half]}
