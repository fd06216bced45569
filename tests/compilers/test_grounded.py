import dspy
import pytest

from compilers.grounded import concludes, grounded, shows
from wfc.tasks.math import math_metric


@pytest.mark.parametrize("evidence, answer, expected", [
    ("1. 5 + 4 = 9", 9, True),
    ("1. 5 + 4 = 9", "9", True),
    ("1. 5 + 14 = 19", 9, False),  # a digit inside a larger number
    ("9.5 apples", 9, False),  # the integer part of a decimal
    ("so the answer is 9.", 9, True),  # a full stop after the number
    ("1. 17", 2, False),  # the list continuation: no 2 in the reasoning
    ("{question}", 1, False),
    ("The topic is Sports", "sports", True),  # case-insensitive
    ("the sportsman", "sports", False),  # whole words only
    ("", 9, False),
    ("1. 3 - 2 = 1", "", False),
    ("None of them", None, False),
])
def test_shows_table(evidence, answer, expected):
    assert shows(evidence, answer) is expected


def test_grounded_passes_the_metric_through_only_when_the_reasoning_shows_the_answer():
    metric = grounded(math_metric)
    example = dspy.Example(question="5 + 4?", answer="9")
    assert metric(example, dspy.Prediction(reasoning="1. 5 + 4 = 9", answer=9)) == 1.0
    assert metric(example, dspy.Prediction(reasoning="1. 5 + 4", answer=9)) == 0.0  # right, but not reasoned
    assert metric(example, dspy.Prediction(reasoning="1. 5 + 4 = 8", answer=8)) == 0.0  # reasoned, wrong
    assert metric(example, dspy.Prediction(answer=9)) == 0.0  # no reasoning field
    assert metric.__name__ == "grounded_math_metric"


def test_grounded_names_other_fields():
    metric = grounded(lambda e, p, t=None: float(p.label == e.label), answer="label", evidence="notes")
    example = dspy.Example(text="x", label="sports")
    assert metric(example, dspy.Prediction(notes="about Sports", label="sports")) == 1.0
    assert metric(example, dspy.Prediction(notes="about music", label="sports")) == 0.0


@pytest.mark.parametrize("evidence, answer, expected", [
    ("1. 13 + 7 = 20", 20, True),
    ("1. 13 + 7 = 20 marbles.", "20", True),  # words after the last number
    ("1. Zoe sells 3 cookies. She has 3 x 2 = 6 cookies.", 2, False),  # shown on the way, not concluded
    ("1. 20 - 5 = 15", 15, True),
    ("1. 3 - 5 = -2", -2, True),
    ("1,200 + 300 = 1,500", 1500, True),  # thousands commas
    ("7 / 2 = 3.5", 3.5, True),
    ("no numbers here", 4, False),
    ("", 4, False),
    ("The topic is Sports", "sports", True),  # not a number: shows()
])
def test_concludes_table(evidence, answer, expected):
    assert concludes(evidence, answer) is expected


def test_grounded_with_conclusion_refuses_an_answer_shown_only_on_the_way():
    metric = grounded(math_metric, conclusion=True)
    example = dspy.Example(question="3 - 1?", answer="2")
    assert metric(example, dspy.Prediction(reasoning="3 x 2 = 6", answer=2)) == 0.0
    assert grounded(math_metric)(example, dspy.Prediction(reasoning="3 x 2 = 6", answer=2)) == 1.0
    assert metric(example, dspy.Prediction(reasoning="3 - 1 = 2", answer=2)) == 1.0
