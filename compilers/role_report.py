"""What each role of a writer -> reviewer -> fixer program did, read from its evaluated rollout graphs: where a change
in the program's score came from.

The roles are found by the last name of their path, so a program nested in another still reports:
- the writer: ``programs.EvalOpt``'s ``generator``, or the first call of ``programs.Retry``'s (and ``Single``'s)
  ``solver``;
- the reviewer: EvalOpt's ``evaluator`` (absent under ``EvalOpt(check=...)``, where a function judges instead);
- the fixer: EvalOpt's ``optimizer`` calls, and Retry's ``solver`` calls after its first.

Every score is the metric on the call's own outputs, through ``compilers.score.call_metric`` with a failing metric
scored 0; "passes" means a score of at least 1. These are evaluation reports: nothing here trains. (The per-role
figures of a training step are ``compilers.diagnostics``.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from compilers.score import call_metric
from programs.eval_opt import accepted
from wfc.rollout import CallNode, RolloutGraph

WRITERS = ("generator", "solver")  # EvalOpt's, Retry's and Single's first answer
REVIEWER = "evaluator"
FIXER = "optimizer"
RETRY = "solver"  # Retry's calls after its first replace the writer's answer too


def _name(call: CallNode) -> str:
    return call.role.split(".")[-1]


def _ok_calls(graph: RolloutGraph, role: str) -> list[CallNode]:
    """``graph``'s ok calls with outputs of the role named ``role`` (the last name of its path)."""
    return [c for c in graph.calls if _name(c) == role and c.status == "ok" and c.outputs]


def _writer_call(graph: RolloutGraph) -> CallNode | None:
    """The writer's first call when it succeeded with outputs, else None."""
    first = next((c for c in graph.calls if _name(c) in WRITERS), None)
    return first if first is not None and first.status == "ok" and first.outputs else None


def _score(metric: Callable, graph: RolloutGraph, outputs: dict[str, Any]) -> float:
    return call_metric(metric, graph.example, outputs, metric_failure_score=0.0)


def _revisions_made(graph: RolloutGraph) -> int:
    """Calls that replaced the writer's answer: EvalOpt's fixer calls, Retry's solver calls after the first."""
    names = [_name(c) for c in graph.calls]
    return names.count(FIXER) + max(names.count(RETRY) - 1, 0)


def writer_pass_rate(graphs: Sequence[RolloutGraph], metric: Callable) -> float:
    """Mean metric of the writer's own answer over ``graphs``: what the program would score without its reviewer and
    fixer, or its retries. A rollout whose writer call failed scores 0; no graphs score 0."""
    scores = []
    for graph in graphs:
        writer = _writer_call(graph)
        scores.append(_score(metric, graph, writer.outputs) if writer is not None else 0.0)
    return sum(scores) / max(len(scores), 1)


def reviewer_agreement(graphs: Sequence[RolloutGraph], metric: Callable) -> float | None:
    """Share of the rollouts whose first verdict EvalOpt acted on as the metric would: accepted when the writer's
    answer passes, revised when it fails (an unreadable verdict is revised). None when no rollout has both an ok
    writer call and an ok reviewer call. The reviewer decides well when this is above the writer's pass rate (what
    accepting everything would score) and above its fail rate (rejecting everything)."""
    agree = []
    for graph in graphs:
        writer, reviewer = _ok_calls(graph, "generator"), _ok_calls(graph, REVIEWER)
        if writer and reviewer:
            passed = _score(metric, graph, writer[0].outputs) >= 1.0
            agree.append(accepted(reviewer[0].outputs.get("verdict", "")) == passed)
    return sum(agree) / len(agree) if agree else None


def reviewer_accept_rate(graphs: Sequence[RolloutGraph]) -> float:
    """Share of the reviewer's ok calls over ``graphs`` whose verdict EvalOpt accepted
    (``programs.eval_opt.accepted``): each one is a fixer call saved. 0 when it made none."""
    verdicts = [accepted(c.outputs.get("verdict", "")) for g in graphs for c in _ok_calls(g, REVIEWER)]
    return sum(verdicts) / max(len(verdicts), 1)


def revisions(graphs: Sequence[RolloutGraph], metric: Callable) -> dict[str, int]:
    """What the fixer did over ``graphs``: ``revised`` (rollouts it was called in), ``revision_calls`` (its calls),
    ``fixed`` (of those rollouts, the writer's answer failed and the final one passes) and ``broken`` (the writer's
    passed, the final fails). The program scores the writer's pass rate plus (fixed - broken) / len(graphs)."""
    counts = {"revised": 0, "revision_calls": 0, "fixed": 0, "broken": 0}
    for graph in graphs:
        made = _revisions_made(graph)
        if not made:
            continue
        writer = _writer_call(graph)
        counts["revised"] += 1
        counts["revision_calls"] += made
        before = writer is not None and _score(metric, graph, writer.outputs) >= 1
        after = bool(graph.outputs) and _score(metric, graph, graph.outputs) >= 1
        counts["fixed"] += after and not before
        counts["broken"] += before and not after
    return counts


def roles_report(graphs: Sequence[RolloutGraph], metric: Callable, when: str) -> dict[str, Any]:
    """Every figure above over ``graphs``, keyed ``<name>_<when>``: ``writer`` (:func:`writer_pass_rate`),
    ``reviewer_accept`` and ``reviewer_agreement`` (None both when no rollout has an ok reviewer call, as under
    ``EvalOpt(check=...)`` or Retry), and :func:`revisions`' counts."""
    has_reviewer = any(_ok_calls(g, REVIEWER) for g in graphs)
    report = {"writer": writer_pass_rate(graphs, metric),
              "reviewer_accept": reviewer_accept_rate(graphs) if has_reviewer else None,
              "reviewer_agreement": reviewer_agreement(graphs, metric), **revisions(graphs, metric)}
    return {f"{name}_{when}": value for name, value in report.items()}


def describe(report: dict[str, Any], when: str) -> str:
    """:func:`roles_report`'s figures for ``when`` as one parenthesised clause for a result line ("" for an empty
    report)."""
    if not report:
        return ""
    accept, agreement = report[f"reviewer_accept_{when}"], report[f"reviewer_agreement_{when}"]
    agreed = "n/a" if agreement is None else f"{agreement:.0%}"
    reviewer = "" if accept is None else f"; reviewer accepted {accept:.0%}, agreed with the tests on {agreed}"
    return (f" (writer alone {report[f'writer_{when}']:.3f}{reviewer}; fixer called in {report[f'revised_{when}']} "
            f"({report[f'revision_calls_{when}']} calls), "
            f"fixed {report[f'fixed_{when}']}, broke {report[f'broken_{when}']})")
