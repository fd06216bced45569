"""compilers.role_report: what each role of a writer -> reviewer -> fixer program did, on hand-built rollouts whose
scores are worked out by hand (the writer's code right or wrong, the reviewer's verdicts, the fixer's fixes and
breaks)."""

from __future__ import annotations

import pytest

from compilers.role_report import (describe, reviewer_accept_rate, reviewer_agreement, revisions, roles_report,
                                   writer_pass_rate)
from wfc.rollout import CallNode, RolloutGraph
from wfc.tasks.code import code_metric
from wfc.tasks.codegen import make_codegen


def _rollout(example, writer_code, final_code, writer_status="ok"):
    calls = [CallNode(id=0, role="generator", invocation=0, messages=[{"role": "user", "content": "p"}],
                      outputs={"code": writer_code}, status=writer_status, started=1, finished=2),
             CallNode(id=1, role="optimizer", invocation=0, messages=[{"role": "user", "content": writer_code}],
                      outputs={"code": final_code}, started=3, finished=4)]
    return RolloutGraph(calls, example=dict(example), outputs={"code": final_code})


def test_writer_pass_rate_scores_the_writers_own_code_not_the_final_answer():
    example = make_codegen(1, seed=3)[0]
    right, wrong = example.solution, "def nothing():\n    return None\n"
    assert code_metric(example, right) == 1.0 and code_metric(example, wrong) == 0.0
    graphs = [_rollout(example, right, wrong),  # the fixer broke right code: writer 1, program 0
              _rollout(example, wrong, right),  # the fixer fixed it: writer 0
              _rollout(example, right, right, writer_status="format_error")]  # a failed writer call scores 0
    assert writer_pass_rate(graphs, code_metric) == pytest.approx(1 / 3)
    assert writer_pass_rate([], code_metric) == 0.0


def test_reviewer_accept_rate_counts_the_verdicts_evalopt_stopped_on():
    def judged(*verdicts):
        calls = [CallNode(id=i, role="evaluator", invocation=i, messages=[{"role": "user", "content": "p"}],
                          outputs={"verdict": v}, status="ok" if v is not None else "format_error", started=2 * i,
                          finished=2 * i + 1) for i, v in enumerate(verdicts)]
        return RolloutGraph(calls, example={}, outputs={})
    # "The code is correct." is prose, not an accept; a failed reviewer call is not counted
    graphs = [judged("correct", "The code is correct."), judged("incorrect: off by one", None), judged("Yes.")]
    assert reviewer_accept_rate(graphs) == pytest.approx(2 / 4)
    assert reviewer_accept_rate([]) == 0.0


def test_reviewer_agreement_compares_the_first_verdict_with_the_writers_tests():
    example = make_codegen(1, seed=3)[0]
    right, wrong = example.solution, "def nothing():\n    return None\n"

    def reviewed(code, verdict, status="ok"):
        calls = [CallNode(id=0, role="generator", invocation=0, messages=[{"role": "user", "content": "p"}],
                          outputs={"code": code}, started=1, finished=2),
                 CallNode(id=1, role="evaluator", invocation=0, messages=[{"role": "user", "content": code}],
                          outputs={"verdict": verdict}, status=status, started=3, finished=4)]
        return RolloutGraph(calls, example=dict(example), outputs={"code": code})
    # agree: right code accepted, wrong code rejected, wrong code met with prose (revised, as a reject);
    # disagree: right code rejected, right code met with prose; a failed reviewer call is left out
    graphs = [reviewed(right, "correct"), reviewed(wrong, "incorrect"), reviewed(wrong, "The code looks fine."),
              reviewed(right, "incorrect"), reviewed(right, "The code looks fine."),
              reviewed(right, "correct", status="format_error")]
    assert reviewer_agreement(graphs, code_metric) == pytest.approx(3 / 5)
    assert reviewer_agreement([], code_metric) is None


def test_revisions_count_the_fixers_fixes_and_breaks_against_the_writers_code():
    example = make_codegen(1, seed=3)[0]
    right, wrong = example.solution, "def nothing():\n    return None\n"
    alone = RolloutGraph([CallNode(id=0, role="generator", invocation=0, messages=[{"role": "user", "content": "p"}],
                                   outputs={"code": wrong}, started=1, finished=2)],
                         example=dict(example), outputs={"code": wrong})
    # fixed: wrong -> right; broken: right -> wrong; kept: right -> right and wrong -> wrong; not revised: alone
    graphs = [_rollout(example, wrong, right), _rollout(example, right, wrong), _rollout(example, right, right),
              _rollout(example, wrong, wrong), alone]
    assert revisions(graphs, code_metric) == {"revised": 4, "revision_calls": 4, "fixed": 1, "broken": 1}
    report = roles_report(graphs, code_metric, "after")
    assert report["reviewer_accept_after"] is None and report["reviewer_agreement_after"] is None  # no reviewer
    assert report["writer_after"] == pytest.approx(2 / 5) and report["fixed_after"] == 1


def test_retrys_first_answer_is_the_writer_and_its_later_answers_the_revisions():
    example = make_codegen(1, seed=3)[0]
    right, wrong = example.solution, "def nothing():\n    return None\n"

    def retried(*codes):
        calls = [CallNode(id=i, role="solver", invocation=i, messages=[{"role": "user", "content": "p"}],
                          outputs={"code": code}, started=2 * i + 1, finished=2 * i + 2) for i, code in enumerate(codes)]
        return RolloutGraph(calls, example=dict(example), outputs={"code": codes[-1]})

    # fixed on the third answer; right first time (no retry); wrong on all three
    graphs = [retried(wrong, wrong, right), retried(right), retried(wrong, wrong, wrong)]
    assert revisions(graphs, code_metric) == {"revised": 2, "revision_calls": 4, "fixed": 1, "broken": 0}
    assert writer_pass_rate(graphs, code_metric) == pytest.approx(1 / 3)


def test_the_report_reads_as_one_clause_per_run():
    example = make_codegen(1, seed=3)[0]
    right, wrong = example.solution, "def nothing():\n    return None\n"
    report = roles_report([_rollout(example, wrong, right), _rollout(example, right, right)], code_metric, "after")
    assert describe(report, "after") == (" (writer alone 0.500; fixer called in 2 (2 calls), fixed 1, broke 0)")
    assert describe({}, "after") == ""
    with_reviewer = {**report, "reviewer_accept_after": 0.25, "reviewer_agreement_after": None}
    assert "; reviewer accepted 25%, agreed with the tests on n/a;" in describe(with_reviewer, "after")


def test_roles_are_found_by_the_last_name_of_their_path():
    """A program nested in another (``team.generator``) reports as it does alone."""
    example = make_codegen(1, seed=3)[0]
    right, wrong = example.solution, "def nothing():\n    return None\n"
    graph = _rollout(example, wrong, right)
    for call in graph.calls:
        call.role = f"team.{call.role}"
    assert revisions([graph], code_metric) == {"revised": 1, "revision_calls": 1, "fixed": 1, "broken": 0}
    assert writer_pass_rate([graph], code_metric) == 0.0
