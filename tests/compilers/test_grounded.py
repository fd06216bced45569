import dspy
import pytest

from compilers.grounded import grounded, shows
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
