import dspy
import pytest

from compilers.grounded import concludes, grounded, shows
from compilers.prompts import bootstrap_demos, reasoning_concludes
from programs.agents import math_cot
from wfc.engines.fake import ScriptedEngine
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


@pytest.mark.parametrize("outputs, expected", [
    ({"reasoning": "1. 13 + 7 = 20", "answer": 20}, True),
    ({"reasoning": "1. 3 x 2 = 6", "answer": 2}, False),  # the answer occurs on the way to another number
    ({"reasoning": "", "answer": 20}, False),
    ({"reasoning": None, "answer": 20}, False),
    ({"reasoning": "it is about football", "label": "sports"}, False),  # a text answer must occur in it
    ({"reasoning": "a sports story", "label": "sports"}, True),
    ({"answer": 20}, True),  # no reasoning field: nothing to check
    ({"reasoning": "1. 2 + 2 = 4", "name": "Ann", "age": 4}, True),  # several answer fields: not checked
])
def test_reasoning_concludes_table(outputs, expected):
    assert reasoning_concludes(outputs) is expected


def test_bootstrap_keeps_only_demos_whose_reasoning_ends_at_the_answer():
    # both scripted answers are right (the metric passes both); only the second one's reasoning ends at it
    train = [dspy.Example(question="What is 3 x 2 - 4?", answer="2").with_inputs("question"),
             dspy.Example(question="What is 13 + 7?", answer="20").with_inputs("question")]
    engine = ScriptedEngine({
        "3 x 2": "[[ ## reasoning ## ]]\n1. 3 x 2 = 6\n\n[[ ## answer ## ]]\n2\n\n[[ ## completed ## ]]",
        "13 + 7": "[[ ## reasoning ## ]]\n1. 13 + 7 = 20\n\n[[ ## answer ## ]]\n20\n\n[[ ## completed ## ]]"})
    stats: dict = {}
    demos = bootstrap_demos(math_cot(), train, engine, metric=math_metric, k=2, n_examples=2, repeats=1, seed=0,
                            stats=stats)
    assert stats["passing_runs"] == 2  # both passed the metric
    assert [(d.question, d.answer) for d in demos["predict"]] == [("What is 13 + 7?", 20)]
