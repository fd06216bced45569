"""compilers.presets.suite: every task's splits are disjoint and of the documented sizes, its program is a fresh
DSPy module with the roles its shape names, its metric scores a gold answer 1; overlapping splits and unknown task
names are refused; GSM8K is skipped, not downloaded, without WFC_DATA_DIR."""

from __future__ import annotations

import dspy
import pytest

from compilers.presets.suite import ALL, SIZES, TASKS, DataMissing, Splits, task_names

ROLES = {"arithmetic": {"voter", "aggregator"}, "multistep": {"draft", "check"}, "classify": {"self"},
         "extract": {"self"}, "multihop": {"hop.predict", "answer"}, "agent": {"react", "extract.predict"},
         "code": {"self"}, "code-evalopt": {"generator", "evaluator", "optimizer"}}


def gold(name: str, ex: dspy.Example) -> dspy.Prediction:
    """A prediction carrying the example's own answer, in the program's output field."""
    if name == "classify":
        return dspy.Prediction(topic=ex.topic)
    if name == "extract":
        return dspy.Prediction(person={"name": ex.name, "age": ex.age, "city": ex.city})
    if name.startswith("code"):
        return dspy.Prediction(code=ex.solution)
    return dspy.Prediction(answer=ex.answer)


@pytest.mark.parametrize("name", [*ALL, "code-evalopt"])
def test_each_task_has_disjoint_splits_a_fresh_program_and_a_metric(name):
    task = TASKS[name]
    splits = task.splits()
    inputs = [{tuple(sorted(ex.inputs().items())) for ex in s} for s in (splits.train, splits.val, splits.test)]
    assert not (inputs[0] & inputs[1] or inputs[0] & inputs[2] or inputs[1] & inputs[2])
    assert [len(s) for s in inputs] == [len(splits.train), len(splits.val), len(splits.test)]  # no repeats either
    if name not in ("arithmetic", "code", "code-evalopt"):
        assert tuple(splits.sizes().values()) == SIZES
    program = task.program()
    assert isinstance(program, dspy.Module) and program is not task.program()
    assert {path for path, _ in program.named_predictors()} == ROLES[name]
    if not name.startswith("code"):  # the code metric runs the sandbox; tests/tasks cover it
        assert task.metric(splits.test[0], gold(name, splits.test[0])) == 1.0
    assert splits.head(3).sizes() == {"train": 3, "val": 3, "test": 3} and splits.head(None) is splits


def test_overlapping_splits_and_unknown_names_are_refused():
    ex = dspy.Example(question="q", answer="1").with_inputs("question")
    with pytest.raises(ValueError, match="both train and test"):
        Splits([ex], [], [ex.copy(answer="2")])
    assert task_names("all") == list(ALL) and task_names("code, classify") == ["code", "classify"]
    for spec in ("nope", "classify,nope", " , "):
        with pytest.raises(ValueError, match="unknown suite task"):
            task_names(spec)


def test_gsm8k_without_data_is_missing_not_downloaded(monkeypatch, tmp_path):
    monkeypatch.delenv("WFC_DATA_DIR", raising=False)
    with pytest.raises(DataMissing, match="WFC_DATA_DIR"):
        TASKS["gsm8k"].splits()
    monkeypatch.setenv("WFC_DATA_DIR", str(tmp_path))
    with pytest.raises(DataMissing):
        TASKS["gsm8k"].splits()
