"""Per-role credit: which reward each LM call of a scored rollout trains on.

Variants (a small registry of :class:`Credit` rules, :data:`CREDIT`, selected by ``MMGRPOConfig.credit``):
- ``inherit``: every call inherits its rollout's reward (mmGRPO's default; nothing to do here).
- ``own_output``: a call whose parsed outputs hold every field of the program's final outputs (an *answerer*: a
  voter, a generator, an optimizer, an aggregator) is scored by the metric on its own outputs; other calls inherit.
  Why: in Voting the reward of a rollout is decided by the aggregator, so a voter that answered right in a rollout
  the aggregator got wrong learns "wrong", and with a weak base model almost every group is flat. Scoring the
  voter's own answer gives it a dense, correctly attributed signal.
- ``verified``: ``own_output``, plus two verifiable rules read off the rollout graph (an edge ``a -> b`` means b's
  prompt holds a's output):
  - a *selector* (an answerer fed by two or more other answerers, e.g. Voting's aggregator) is scored on its own
    answer only when at least one of its inputs was correct; when none was there was nothing right to pick, and the
    call is left out of its group (``CallNode.no_credit``) instead of learning "wrong" for it. An answerer fed by one
    answer (a *reviser*, e.g. EvalOpt's optimizer) is always scored on its own answer: fixing a wrong answer is its
    job, so a wrong input is where it learns most (measured on the code workflow: the untrained reviewer rejects
    every answer, so the optimizer rewrites every one; left out whenever the writer was wrong, it could only learn
    to keep right code, never to fix wrong code);
  - a *judge* (a call fed by an answerer that gives no answer of its own but a verdict, e.g. EvalOpt's evaluator) is
    scored 1 when its verdict (accept / reject, read by :func:`wfc.verdict.read_verdict`, the reader the program
    acts on) agrees with whether the judged answer was correct, else 0; an unreadable verdict inherits.
  "Correct" means the metric gives full marks (>= 1, ``True`` included).
- ``verified-strict``: ``verified``, except that an unreadable verdict is scored as the reject it is to EvalOpt
  (which revises on anything it cannot read as accept): 1 when the judged answer was wrong, else 0. Why: a small
  model's untrained judge writes prose ("The function `f` is indeed correct.") on every call, so under ``verified``
  every verdict inherits the rollout's reward and nothing teaches the judge to open with a verdict, or which one;
  scored on the decision the program took, a prose verdict on a right answer learns "wrong". Only for programs that,
  like EvalOpt, treat an unreadable verdict as a reject. It can only reinforce a readable verdict the judge samples:
  SmolLM2-135M's untrained code reviewer sampled none in 128 (T=0.7), so there it is not expected to help alone;
  not yet measured in training.

Invariant: credit only sets ``CallNode.reward`` / ``CallNode.no_credit`` on calls with status ``ok`` of rollouts with
status ``ok``; format errors and crashes keep their failure scores (``compilers.group.call_reward``). The user's metric
is called through :func:`compilers.score.call_metric` only, so a NaN or raising metric scores
``metric_failure_score`` (or raises :class:`compilers.score.MetricError`) the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from compilers.score import call_metric
from wfc.rollout import CallNode, RolloutGraph
from wfc.verdict import read_verdict

FULL_MARKS = 1.0 - 1e-9


def _answerers(metric: Callable, graph: RolloutGraph, metric_failure_score: float | None) -> dict[int, float]:
    """Call id -> metric value on its own outputs, for every ok call that answers the task itself."""
    fields = set(graph.outputs or {})
    scores: dict[int, float] = {}
    for call in graph.calls:
        if call.status == "ok" and call.outputs and fields and fields <= set(call.outputs):
            scores[call.id] = call_metric(metric, graph.example, {k: call.outputs[k] for k in fields},
                                          metric_failure_score=metric_failure_score)
    return scores


def inherit(metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None) -> None:
    return None


def own_output(metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None) -> None:
    if graph.status != "ok" or not graph.outputs:
        return
    for call_id, value in _answerers(metric, graph, metric_failure_score).items():
        graph.graph.nodes[call_id]["call"].reward = value


def _upstream(graph: RolloutGraph, call: CallNode, among: dict[int, float]) -> list[int]:
    return sorted(a for a in graph.graph.predecessors(call.id) if a in among)


def verified(metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None,
             unreadable_rejects: bool = False) -> None:
    if graph.status != "ok" or not graph.outputs:
        return
    scores = _answerers(metric, graph, metric_failure_score)
    for call in graph.calls:
        if call.status != "ok" or not call.outputs:
            continue
        fed_by = _upstream(graph, call, scores)
        if call.id in scores:
            call.reward = scores[call.id]
            if len(fed_by) >= 2 and not any(scores[a] >= FULL_MARKS for a in fed_by):
                call.no_credit = True  # a selector with nothing right to choose from (a reviser, fed by one, is not)
        elif fed_by and len(call.outputs) == 1:
            verdict = read_verdict(next(iter(call.outputs.values())))
            if verdict is None and unreadable_rejects:
                verdict = False
            if verdict is not None:
                judged_correct = scores[fed_by[-1]] >= FULL_MARKS  # the latest answer it was shown
                call.reward = 1.0 if verdict == judged_correct else 0.0


def verified_strict(metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None) -> None:
    verified(metric, graph, metric_failure_score=metric_failure_score, unreadable_rejects=True)


@dataclass(frozen=True)
class Credit:
    """A credit rule, called as ``rule(metric, graph, *, metric_failure_score)`` on a scored rollout. ``per_call``: it
    may score a call on something other than its rollout's reward (a call's reward then reads only what the rule
    looks at, which is what lets ``skip_frozen`` stop rollouts early)."""

    name: str
    assign: Callable[..., None]
    per_call: bool

    def __call__(self, metric: Callable, graph: RolloutGraph, *, metric_failure_score: float | None) -> None:
        self.assign(metric, graph, metric_failure_score=metric_failure_score)


CREDIT: dict[str, Credit] = {c.name: c for c in (
    Credit("inherit", inherit, per_call=False),
    Credit("own_output", own_output, per_call=True),
    Credit("verified", verified, per_call=True),
    Credit("verified-strict", verified_strict, per_call=True),
)}


def get_credit(name: str) -> Credit:
    if name not in CREDIT:
        raise ValueError(f"credit {name!r} is unknown: use one of {sorted(CREDIT)}")
    return CREDIT[name]
