"""programs/calculator.py: what the calculator reads (a hand-worked table), the Calculate predictor inside Voting on a
scripted engine (the graph keeps what the model wrote, the program passes on what was computed), and the metric that
scores each call as the program uses it."""

from __future__ import annotations

import dspy
import pytest

from compilers.credit import verified
from compilers.score import score_rollout
from programs import Voting
from programs.agents import math_cot
from programs.calculator import MAX_EXPRESSION_CHARS, Calculate, calculate, calculated, with_calculator
from wfc.lower import trace
from wfc.tasks.math import math_metric

QA = dspy.Signature("question -> answer", "Solve the arithmetic problem.")
EXAMPLE = dspy.Example(question="What is 2 + 3?", answer="5").with_inputs("question")
AGGREGATOR = "Several solvers proposed answers"


@pytest.mark.parametrize("text, value", [
    ("76 - 25 = 49 dollars", "51"),          # the model's sum is wrong, its operation right
    ("4 shirts * 5 minutes = 20 shirts", "20"),  # units between the numbers are dropped
    ("11 x 13 = 163\n", "143"),               # x between numbers is a multiplication
    ("11 × 13", "143"),
    ("180 ÷ 18 = 1", "10"),
    ("180 / 18 = 1\nThe groups", "10"),      # first line only
    ("$4 - $5 + 8 - 5 =", "2"),              # left to right: 4 - 5 + 8 - 5
    ("(3 + 4) * 2", "14"),
    ("1,000 + 5", "1005"),                   # a thousands separator
    ("7 / 2", "3.5"),
    ("1 / 3", "0.333333"),                   # rounded to 6 places
    ("3 - 4 = 5", "-1"),
    ("Sam has 14 + 16 = 30", "30"),
    ("  12 - 9 + 1 = 11", "4"),
])
def test_calculate_does_the_arithmetic_an_answer_opens_with(text, value):
    assert calculate(text) == value


@pytest.mark.parametrize("text", [
    "51", "-5", "The answer is 51.",          # no operation between two numbers
    "6 + 8 + ", "= 5 + 3",                    # a dangling operator; nothing left of the "="
    "6 more birds than 2 birds",             # a word between two numbers: no operator
    "2**100", "2 ** 3",                       # powers are not arithmetic here
    "10 / 0", "1e300 * 1e300", "99999999999999999 + 1",  # division by zero, out of range
    "x + 1", "", "   ",
    "1 + " * (MAX_EXPRESSION_CHARS // 4 + 1) + "1",  # too long to be an answer's arithmetic
])
def test_calculate_gives_none_when_there_is_no_arithmetic_to_do(text):
    assert calculate(text) is None
    assert calculated(text) == text


@pytest.mark.parametrize("value", [None, 5, 2.5, ["1 + 1"], {"answer": "1 + 1"}])
def test_calculate_reads_only_strings(value):
    assert calculate(value) is None and calculated(value) is value


def test_voting_with_calculate_votes_on_computed_answers_and_records_the_models_text(fake_engine):
    votes = iter(["2 + 3 = 6", "2 + 3", "5"])  # three texts, one value: unanimous after the calculator
    engine = fake_engine(by_system={AGGREGATOR: "9", "Solve": lambda r: next(votes)})
    g = trace(Voting(QA, n=3, skip_unanimous=True, predictor=Calculate), EXAMPLE, engine)
    assert g.status == "ok" and g.roles == ["voter"] and g.outputs == {"answer": "5"}
    voters = g.calls_of("voter")
    assert sorted(c.outputs["answer"] for c in voters) == ["2 + 3", "2 + 3 = 6", "5"]  # what the model wrote
    assert all(c.inputs == {"question": "What is 2 + 3?"} for c in voters)  # DSPy's trace matched every call


def test_the_aggregator_sees_computed_candidates_and_its_answer_is_computed(fake_engine):
    votes = iter(["2 + 3 = 6", "2 * 3", "9"])
    engine = fake_engine(by_system={AGGREGATOR: "2 + 3 = 4", "Solve": lambda r: next(votes)})
    g = trace(Voting(QA, n=3, skip_unanimous=True, predictor=Calculate), EXAMPLE, engine)
    (aggregator,) = g.calls_of("aggregator")
    shown = aggregator.messages[-1]["content"]
    assert "5" in shown and "6" in shown and "9" in shown and "2 * 3" not in shown
    assert aggregator.outputs == {"answer": "2 + 3 = 4"} and g.outputs == {"answer": "5"}


def test_with_calculator_scores_the_arithmetic_the_answer_writes():
    metric = with_calculator(math_metric)
    gold = dspy.Example(question="q", answer="51")
    assert math_metric(gold, dspy.Prediction(answer="76 - 25 = 49")) == 0.0
    assert metric(gold, dspy.Prediction(answer="76 - 25 = 49")) == 1.0
    assert metric(gold, dspy.Prediction(answer="51")) == 1.0  # a computed final answer is unchanged
    assert metric(gold, "76 - 25") == 1.0 and metric(gold, "50") == 0.0
    assert metric.__name__ == "math_metric_with_calculator"


def test_with_calculator_keeps_other_fields_and_the_metrics_own_errors():
    seen = []

    def metric(example, prediction, trace=None):
        seen.append(dict(prediction.items()))
        return 1.0

    with_calculator(metric)(None, dspy.Prediction(answer="1 + 1", reasoning="2 + 2"))
    assert seen == [{"answer": "2", "reasoning": "2 + 2"}]
    with pytest.raises(TypeError, match="answer"):
        with_calculator(math_metric)(dspy.Example(answer="1"), object())


def test_verified_credit_with_the_calculator_scores_each_voter_on_its_computed_answer(fake_engine):
    votes = iter(["2 + 3 = 6", "2 * 3 = 5", "4 + 1"])
    engine = fake_engine(by_system={AGGREGATOR: "5", "Solve": lambda r: next(votes)})
    g = trace(Voting(QA, n=3, predictor=Calculate), EXAMPLE, engine)
    metric = with_calculator(math_metric)
    assert score_rollout(metric, g, failure_score=0.0, metric_failure_score=0.0) == 1.0
    verified(metric, g, metric_failure_score=0.0)
    by_text = {c.text: c.reward for c in g.calls_of("voter")}
    assert by_text == {"2 + 3 = 6": 1.0, "2 * 3 = 5": 0.0, "4 + 1": 1.0}


def test_math_cot_caps_the_reasoning_and_types_the_answer():
    sig = math_cot(reasoning_tokens=16).predict.signature
    assert list(sig.output_fields) == ["reasoning", "answer"]
    assert sig.output_fields["answer"].annotation is int
    assert sig.output_fields["reasoning"].json_schema_extra["max_tokens"] == 16
