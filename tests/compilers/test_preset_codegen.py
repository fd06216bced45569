"""compilers.presets.codegen: which code workflow the options build, the options that contradict each other refused,
labels that never collide, the config fields a workflow sets, and the held-out comparison on a hand-worked table."""

from __future__ import annotations

import argparse
import itertools

import dspy
import pytest

from compilers.presets.codegen import (CodeWorkflow, add_workflow_flags, compare_held_out, describe_held_out,
                                       workflow_from_args)
from programs import EvalOpt, Retry, Single

SIG = dspy.Signature("prompt -> code", "Write the function.")


def test_each_program_is_built_with_its_options():
    assert isinstance(CodeWorkflow("single").build(SIG), Single)
    evalopt = CodeWorkflow(check=True, fresh_fix=True).build(SIG)
    assert isinstance(evalopt, EvalOpt) and evalopt.check.__name__ == "example_check" and not evalopt.show_previous
    assert {name for name, _ in evalopt.named_predictors()} == {"generator", "optimizer"}  # no reviewer
    retry = CodeWorkflow("retry", attempts=2, sample_retries=0, vary_demos=True, retrieved_demos=1,
                         train_retries=False).build(SIG)
    assert isinstance(retry, Retry) and (retry.attempts, retry.sample_retries, retry.vary_demos,
                                         retry.train_retries) == (2, None, True, False)


@pytest.mark.parametrize("options", [
    dict(program="retry", frozen_fixer=True),  # Retry has no fixer to freeze
    dict(program="single", check=True), dict(program="single", choose_verdict=True),
    dict(program="retry", attempts=-1), dict(retrieved_demos=-1), dict(sample_retries=float("nan")),
    dict(program="retry", vary_demos=True),  # no retrieved demos to vary
    dict(program="single", vary_demos=True, retrieved_demos=1),  # no retries
    dict(program="retry", sample_retries=0, retrieved_demos=1),  # greedy retries repeat the first answer
    dict(program="single", train_retries=False), dict(check=True, choose_verdict=True), dict(program="react")])
def test_options_the_program_lacks_or_that_contradict_are_refused(options):
    with pytest.raises(ValueError):
        CodeWorkflow(**options)


def test_labels_differ_between_workflows_and_name_the_run_folders_in_use():
    assert CodeWorkflow().label == "evalopt"
    assert CodeWorkflow("retry", attempts=2, retrieved_demos=1).label == "retry-2x0.8-rag1"
    assert CodeWorkflow("retry", attempts=2, sample_retries=0, vary_demos=True, train_retries=False,
                        retrieved_demos=1).label == "retry-2x0-vary-first-rag1"
    assert CodeWorkflow(check=True, frozen_fixer=True, fresh_fix=True).label == "evalopt-check-frozen-fresh"
    workflows = [CodeWorkflow(check=c, frozen_fixer=f, fresh_fix=x, retrieved_demos=k)
                 for c, f, x, k in itertools.product((False, True), (False, True), (False, True), (0, 1, 2))]
    assert len({w.label for w in workflows}) == len(workflows)


def test_the_config_a_workflow_sets():
    assert CodeWorkflow().config() == {}
    assert CodeWorkflow(frozen_fixer=True).config() == {"frozen_roles": ["optimizer"], "skip_frozen": False}
    assert CodeWorkflow(frozen_fixer=True, check=True).config()["skip_frozen"] is True  # skipped only with the check
    assert CodeWorkflow("single", retrieved_demos=2).config() == {"retrieved_demos": 2,
                                                                  "demo_labels": {"code": "solution"}}
    assert CodeWorkflow().options() == {"program": "evalopt", "choose_verdict": False, "check": False,
                                        "frozen_fixer": False, "fresh_fix": False}
    assert CodeWorkflow("retry").options()["attempts"] == 4


def test_the_flags_build_the_same_workflow_and_refuse_as_it_does():
    parser = argparse.ArgumentParser()
    add_workflow_flags(parser)
    assert workflow_from_args(parser.parse_args([])) == CodeWorkflow()
    args = parser.parse_args(["--program", "retry", "--attempts", "2", "--no-train-retries", "--retrieved-demos", "1"])
    assert workflow_from_args(args) == CodeWorkflow("retry", attempts=2, train_retries=False, retrieved_demos=1)
    with pytest.raises(ValueError, match="EvalOpt options"):
        workflow_from_args(parser.parse_args(["--program", "single", "--check"]))


def test_held_out_scores_are_paired_by_task_and_by_function_and_the_unseen_apart():
    train = [dspy.Example(solution="s0"), dspy.Example(solution="s1")]
    test = [dspy.Example(solution=s, entry_point=f) for s, f in (("s0", "f"), ("s2", "f"), ("s3", "g"), ("s1", "h"))]
    # tasks 1 and 2 are unseen (their solutions are no training task's): before 0, 0 -> after 1, 0
    result = compare_held_out(test, train, [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    assert result["paired"]["difference"] == pytest.approx(0.25)
    assert (result["paired"]["only_after"], result["paired"]["only_before"]) == (2, 1)
    assert result["by_function"]["clusters"] == 3 and result["by_function"]["difference"] == pytest.approx(0.25)
    assert result["unseen"] == {"n": 2, "before": 0.0, "after": 0.5}
    assert result["tasks"][1] == {"task": 1, "function": "f", "seen_solution": False, "before": 0.0, "after": 1.0}
    assert [t["seen_solution"] for t in result["tasks"]] == [True, False, False, True]
    text = describe_held_out(result)
    assert text.startswith("paired difference +0.250 [") and "(3 functions)" in text
    assert text.endswith("\non the 2 tasks whose solution no training task has: 0.000 -> 0.500")
    all_seen = compare_held_out(test[:1] + test[3:], train, [0.0, 1.0], [1.0, 1.0])
    assert all_seen["unseen"] == {"n": 0, "before": None, "after": None}
    assert "\n" not in describe_held_out(all_seen)
