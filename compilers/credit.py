"""Per-role credit: which reward each LM call of a scored rollout trains on.

Variants (a small registry, selected by ``MMGRPOConfig.credit``):
- ``inherit``: every call inherits its rollout's reward (mmGRPO's default; nothing to do here).
- ``own_output``: a call whose parsed outputs hold every field of the program's final outputs (a voter, a
  generator, an optimizer: roles that answer the task themselves) is scored by the metric on its own outputs; other
  calls inherit. Why: in Voting the reward of a rollout is decided by the aggregator, so a voter that answered right
  in a rollout the aggregator got wrong learns "wrong", and with a weak base model almost every group is flat. Scoring
  the voter's own answer gives it a dense, correctly attributed signal.

Invariant: credit only sets ``CallNode.reward`` on calls with status ``ok`` of rollouts with status ``ok``; format
errors and crashes keep their failure scores (``compilers.group.call_reward``).
"""

from __future__ import annotations

from typing import Callable

import dspy

from wfc.rollout import RolloutGraph


def inherit(metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None) -> None:
    return None


def own_output(metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None) -> None:
    if graph.status != "ok" or not graph.outputs:
        return
    fields = set(graph.outputs)
    example = dspy.Example(**graph.example)
    for call in graph.calls:
        if call.status != "ok" or not call.outputs or not fields <= set(call.outputs):
            continue
        try:
            call.reward = float(metric(example, dspy.Prediction(**{k: call.outputs[k] for k in fields})))
        except Exception:
            if metric_failure_score is None:
                raise
            call.reward = metric_failure_score


CREDIT: dict[str, Callable[..., None]] = {"inherit": inherit, "own_output": own_output}


def get_credit(name: str) -> Callable[..., None]:
    if name not in CREDIT:
        raise ValueError(f"credit {name!r} is unknown: use one of {sorted(CREDIT)}")
    return CREDIT[name]
