"""wfc.tasks.wordproblems: SVAMP-style generated problems are correct, labelled, distinct, seeded and never SVAMP's."""

from __future__ import annotations

import inspect
import re

import dspy
import pytest

import wfc.tasks.wordproblems as wp
from wfc.tasks import get_task, math_metric
from wfc.tasks.math import extract_number, format_number
from wfc.tasks.math_data import load_svamp
from wfc.tasks.wordproblems import KINDS, make_wordproblems

# kind -> (the answer from the question's numbers in order of appearance, difficulty without an added distractor).
# Written independently of the generator: only the numbers in the text are used.
EXPECTED = {
    "combine": (lambda a, b: a + b, 0),
    "combine_types": (lambda a, b: a + b, 0),
    "increase": (lambda a, b: a + b, 0),
    "decrease": (lambda a, b: a - b, 0),
    "compare_more": (lambda a, b: a - b, 0),
    "compare_fewer": (lambda a, b: a - b, 0),
    "compare_larger": (lambda b, k: b + k, 0),
    "compare_smaller": (lambda a, k: a - k, 0),
    "times_as_many": (lambda b, k: b * k, 0),
    "groups_total": (lambda n, k: n * k, 0),
    "groups_count": (lambda total, k: total / k, 0),
    "share_each": (lambda total, n: total / n, 0),
    "price_total": (lambda x, y: x * y, 0),
    "price_each": (lambda total, n: total / n, 0),
    "price_count": (lambda total, price: total / price, 0),
    "money_left": (lambda had, spent: had - spent, 0),
    "rate_total": (lambda per_day, days: per_day * days, 0),
    "change_unknown_gain": (lambda before, after: after - before, 1),
    "change_unknown_loss": (lambda before, left: before - left, 1),
    "start_unknown_gain": (lambda got, now: now - got, 1),
    "start_unknown_loss": (lambda gone, left: gone + left, 1),
    "part_whole": (lambda total, part: total - part, 1),
    "compare_inverse_fewer": (lambda k, a: a + k, 1),
    "compare_inverse_more": (lambda a, k: a - k, 1),
    "distractor_decrease": (lambda a, _unused, b: a - b, 1),
    "distractor_increase": (lambda a, _unused, b: a + b, 1),
    "distractor_compare": (lambda a, _unused, b: a - b, 1),
    "distractor_price": (lambda price, _unused, n: price * n, 1),
    "combine_three": (lambda a, b, c: a + b + c, 2),
    "buy_then_give": (lambda a, b, c: a + b - c, 2),
    "lose_then_find": (lambda a, b, c: a - b + c, 2),
    "groups_then_remove": (lambda n, k, c: n * k - c, 2),
    "combine_then_share": (lambda a, b, n: (a + b) / n, 2),
    "money_after_purchase": (lambda had, n, price: had - n * price, 2),
    "spent_two": (lambda had, s1, s2: had - s1 - s2, 2),
    "compare_total": (lambda a, k: a + (a + k), 2),
    "start_unknown_two": (lambda b, c, left: b + c + left, 2),
    "price_two_kinds": (lambda n, price, other: n * price + other, 2),
}
DISTRACTOR = re.compile(r"years old|miles away|degrees\.|also has")  # the added irrelevant sentences


def sentences(question: str) -> list[str]:
    return re.split(r"(?<=[.?])\s+", question)


def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def solve(ex: dspy.Example) -> tuple[float, bool]:
    """The answer recomputed from the question's numbers alone, and whether an irrelevant sentence was dropped."""
    kept = [s for s in sentences(ex.question) if not DISTRACTOR.search(s)]
    formula, _ = EXPECTED[ex.kind]
    values = numbers(" ".join(kept))
    assert len(values) == len(inspect.signature(formula).parameters), (ex.kind, ex.question)
    return formula(*values), len(kept) < len(sentences(ex.question))


def test_every_kind_is_checked():
    assert set(EXPECTED) == set(KINDS) and len(KINDS) >= 25


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("max_operand", [5, 12, 50])
def test_answers_recomputed_from_the_question(kind, max_operand):
    for ex in make_wordproblems(25, seed=7, max_operand=max_operand, kinds=[kind]):
        value, has_distractor = solve(ex)
        assert value == int(value) and value >= 0, ex.question
        assert ex.answer == format_number(value) == str(int(value))
        assert ex.kind == kind
        base = EXPECTED[kind][1]
        assert ex.difficulty == (1 if has_distractor else base), ex.question
        assert not has_distractor or base == 0
        assert all(1 <= v <= max_operand for v in numbers(ex.question)), ex.question


def test_hand_written_instances():
    # a few problems read by hand from seed 0 (the first of each of three kinds), checked against the arithmetic
    combine, groups, money = (make_wordproblems(1, seed=0, kinds=[k])[0]
                              for k in ("combine", "groups_count", "money_after_purchase"))
    a, b = numbers(combine.question)
    assert int(combine.answer) == a + b
    total, per_box = numbers(groups.question)
    assert total % per_box == 0 and int(groups.answer) * per_box == total
    had, n, price = numbers(money.question)
    assert int(money.answer) == had - n * price >= 0
    assert "$" in money.question or "dollars" in money.question


def test_answers_are_non_negative_integers_and_shape_is_body_then_question():
    for ex in make_wordproblems(400, seed=1):
        assert re.fullmatch(r"\d+", ex.answer) and extract_number(ex.answer) == int(ex.answer)
        parts = sentences(ex.question)
        assert len(parts) >= 2 and parts[-1].endswith("?") and all(s.endswith(".") for s in parts[:-1])
        assert parts[-1].startswith(("How", "What", "If")) and parts[0][0].isupper()
        assert math_metric(ex, dspy.Prediction(answer=ex.answer)) == 1.0


def test_difficulty_and_kind_are_labels_not_inputs():
    for ex in make_wordproblems(50, seed=2):
        assert set(ex.inputs().keys()) == {"question"}
        assert {"answer", "difficulty", "kind"} <= set(ex.labels().keys())
        assert isinstance(ex.difficulty, int) and ex.difficulty in (0, 1, 2)
    task = get_task("wordproblems", n_train=5, n_val=0, n_test=0)
    assert list(task.signature.input_fields) == ["question"]


def test_every_kind_and_level_appears_in_400():
    examples = make_wordproblems(400)
    assert {ex.kind for ex in examples} == set(KINDS)
    levels = [ex.difficulty for ex in examples]
    assert {0, 1, 2} == set(levels) and min(levels.count(d) for d in (0, 1, 2)) >= 40
    added = [ex for ex in examples if ex.difficulty == 1 and EXPECTED[ex.kind][1] == 0]
    assert len(added) >= 20  # level-0 templates with an irrelevant sentence
    assert any("$" in ex.question for ex in examples) and any("dollars" in ex.question for ex in examples)


def test_questions_are_distinct():
    questions = [ex.question for ex in make_wordproblems(2000, seed=3)]
    assert len(set(questions)) == len(questions)


def test_deterministic_prefix_stable_and_seeded():
    a = [(e.question, e.answer, e.difficulty) for e in make_wordproblems(30, seed=3)]
    assert a == [(e.question, e.answer, e.difficulty) for e in make_wordproblems(30, seed=3)]
    assert [(e.question, e.answer, e.difficulty) for e in make_wordproblems(10, seed=3)] == a[:10]
    other = [e.question for e in make_wordproblems(30, seed=4)]
    assert not set(other) & {q for q, _, _ in a}


def test_registry_task_has_disjoint_seeded_splits():
    task = get_task("wordproblems")
    assert task.name == "wordproblems" and not task.eval_only and task.metric is math_metric
    assert task.sizes() == {"train": 400, "val": 100, "test": 200}
    train, val, test = ({e.question for e in s} for s in (task.trainset, task.valset, task.testset))
    assert len(train) == 400 and len(val) == 100 and len(test) == 200
    assert not train & val and not train & test and not val & test
    again = get_task("wordproblems", n_train=400, n_val=100, n_test=200, seed=0)
    assert [e.question for e in again.testset] == [e.question for e in task.testset]
    other = get_task("wordproblems", n_train=50, n_val=10, n_test=10, seed=1)
    assert [e.question for e in other.trainset] != [e.question for e in task.trainset[:50]]
    small = get_task("wordproblems", n_train=20, n_val=5, n_test=5, max_operand=9)
    assert all(v <= 9 for e in small.trainset for v in numbers(e.question))


def test_asking_for_more_than_the_templates_allow_raises(monkeypatch):
    # a space small enough to count: 3 names, 2 items, max_operand 5 -> (a, k) in {(4, 2), (5, 2), (5, 3)};
    # phrasing 1: 6 ordered pairs of people x 2 items x 3 = 36 questions, phrasing 2 (points): 6 x 3 = 18
    monkeypatch.setattr(wp, "NAMES", wp.NAMES[:3])
    monkeypatch.setattr(wp, "ITEMS", wp.ITEMS[:2])
    every = make_wordproblems(54, max_operand=5, kinds=["compare_inverse_more"])
    assert len({e.question for e in every}) == 54
    with pytest.raises(ValueError, match="distinct.*ask for fewer"):
        make_wordproblems(55, max_operand=5, kinds=["compare_inverse_more"])


@pytest.mark.parametrize("kwargs,match", [
    ({"n": -1}, "n must"), ({"n": 2.0}, "n must"), ({"n": True}, "n must"), ({"n": 3, "seed": "a"}, "seed"),
    ({"n": 3, "max_operand": 4}, "max_operand must be an int >= 5"), ({"n": 3, "max_operand": "50"}, "max_operand"),
    ({"n": 3, "kinds": []}, "kinds must not be empty"), ({"n": 3, "kinds": ["combine", "nope"]}, "unknown kinds"),
    ({"n": 3, "kinds": "combine"}, "list of kind names"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_wordproblems(**kwargs)


@pytest.mark.parametrize("kwargs,match", [({"n_val": -1}, "n_val"), ({"n_train": None}, "n_train"),
                                          ({"max_operand": 2}, "max_operand")])
def test_bad_task_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_task("wordproblems", **kwargs)


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower().replace("$ ", "$")).strip()


def test_no_question_is_an_svamp_question(data_dir):
    svamp = {normalize(ex.question) for ex in load_svamp(path=data_dir)}
    assert len(svamp) > 900
    task = get_task("wordproblems")
    generated = task.trainset + task.valset + task.testset + make_wordproblems(3000, seed=1, max_operand=20)
    assert not {normalize(ex.question) for ex in generated} & svamp
