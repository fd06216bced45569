import dspy
import pytest

from compilers.baselines import constant_answer
from wfc.tasks.math import math_metric


def _ex(question, answer):
    return dspy.Example(question=question, answer=answer).with_inputs("question")


def test_the_most_common_training_answer_scored_on_the_test_set():
    train = [_ex("a", "2"), _ex("b", "3"), _ex("c", "2"), _ex("d", "5")]
    test = [_ex("e", "2"), _ex("f", "7"), _ex("g", "2"), _ex("h", "1")]
    out = constant_answer(train, test, math_metric)
    assert out == {"labels": {"answer": "2"}, "accuracy": 0.5}


def test_ties_go_to_the_first_seen_and_a_failing_metric_scores_zero():
    train = [_ex("a", "3"), _ex("b", "2")]
    assert constant_answer(train, [_ex("c", "3")], math_metric)["labels"] == {"answer": "3"}

    def strict(example, prediction, trace=None):
        raise RuntimeError("cannot run a constant")

    assert constant_answer(train, [_ex("c", "3")], strict)["accuracy"] == 0.0


def test_empty_sets_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        constant_answer([], [_ex("c", "3")], math_metric)
