"""wfc.tasks.math: final-number extraction on tricky model outputs, and the DSPy math metric."""

from __future__ import annotations

import dspy
import pytest

from wfc.tasks.math import extract_number, format_number, math_metric, numbers, numbers_match

CASES = [
    # plain numbers and formatting
    ("42", 42),
    ("1,234", 1234),
    ("1,234,567.89", 1234567.89),
    ("1{,}000", 1000),
    ("3.14", 3.14),
    (".5", 0.5),
    ("He has 42.", 42),
    ("1.5e3", 1500),
    # currency, units, percent
    ("$5.50", 5.5),
    ("It costs $1,234.56 in total.", 1234.56),
    ("€3", 3),
    ("12 apples", 12),
    ("5kg", 5),
    ("50%", 50),
    ("\\$18", 18),
    # signs
    ("-5", -5),
    ("−5", -5),
    ("-$5", -5),
    ("$-5", -5),
    ("the answer is -5.", -5),
    ("17-5=12", 12),
    ("5-10", 10),
    ("= -0.25", -0.25),
    # fractions
    ("3/4", 0.75),
    ("1 1/2", 1.5),
    ("\\frac{3}{4}", 0.75),
    ("\\dfrac{-1}{2}", -0.5),
    ("3/0", None),
    # markers
    ("Answer: 42", 42),
    ("answer = 7", 7),
    ("**Answer:** 18", 18),
    ("The answer is:\n\n 7 apples", 7),
    ("Answer: 17 + 25 = 42", 42),
    ("Answer: 42. Because 17 + 25 = 42 and 9 more.", 42),
    ("The final answer is 12, since we had 3 boxes of 4.", 12),
    ("#### 42", 42),
    ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", 18),
    ("#### 1,234", 1234),
    ("\\boxed{42}", 42),
    ("The final answer is $\\boxed{-3}$.", -3),
    ("\\boxed{\\frac{3}{4}} and then 99", 0.75),
    ("first \\boxed{1} then \\boxed{2}", 2),
    ("[[ ## reasoning ## ]]\n17 + 25 = 42, not 99\n\n[[ ## answer ## ]]\n42\n\n[[ ## completed ## ]]", 42),
    ("[[ ## answer ## ]]\n$1,250.00\n\n[[ ## completed ## ]]", 1250),
    ("[[ ## answer ## ]]\nI don't know\n[[ ## completed ## ]] 7", 7),
    # restated question: the last number wins without a marker
    ("17 + 25 = 42", 42),
    ("Tom has 12 apples and buys 7 more, so he has 19 apples.", 19),
    ("answer is unknown; 17 + 25 = 42", 42),
    # no number
    ("no numbers here", None),
    ("", None),
    ("v1.5 and x2", None),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_extract_number(text, expected):
    got = extract_number(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_extract_number_non_strings():
    assert extract_number(None) is None
    assert extract_number(7) == 7.0
    assert extract_number(2.5) == 2.5
    assert extract_number(float("nan")) is None


def test_numbers_in_order():
    assert numbers("from 3 to 1,000, then -2 and 1/4") == [3, 1000, -2, 0.25]


@pytest.mark.parametrize("value,text", [(18, "18"), (18.0, "18"), (-5, "-5"), (0.75, "0.75"), (1e6, "1000000")])
def test_format_number(value, text):
    assert format_number(value) == text


def test_numbers_match_tolerance():
    assert numbers_match(1_000_000, 1_000_000.5)  # within 1e-6 relative
    assert not numbers_match(1000, 1000.01)
    assert numbers_match(0, 1e-12)
    assert not numbers_match(None, 0)


def example(answer: str) -> dspy.Example:
    return dspy.Example(question="q", answer=answer).with_inputs("question")


def test_math_metric_accepts_predictions_objects_and_strings():
    gold = example("42")
    assert math_metric(gold, dspy.Prediction(answer="The answer is 42.")) == 1.0
    assert math_metric(gold, dspy.Prediction(answer="41")) == 0.0
    assert math_metric(gold, "17 + 25 = 42") == 1.0
    assert math_metric(gold, dspy.Prediction(answer="42.0000001")) == 1.0

    class Obj:
        answer = "$42"

    assert math_metric(gold, Obj(), None) == 1.0
    assert math_metric(example("0.75"), dspy.Prediction(answer="3/4")) == 1.0


def test_math_metric_unreadable_prediction_scores_zero():
    assert math_metric(example("42"), dspy.Prediction(answer="no idea")) == 0.0
    assert math_metric(example("42"), dspy.Prediction(answer=None)) == 0.0
    assert math_metric(example("42"), None) == 0.0


def test_math_metric_errors_say_what_is_wrong():
    with pytest.raises(TypeError, match="answer"):
        math_metric(example("42"), dspy.Prediction(code="42"))
    with pytest.raises(ValueError, match="holds no number"):
        math_metric(example("forty-two"), "42")
