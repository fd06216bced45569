"""wfc.tasks.multihop: each question has one answer, reachable in two keyword searches over the corpus it comes
with (which holds exactly its questions' passages); exact match normalises like SQuAD."""

from __future__ import annotations

import dspy
import pytest

from programs.agents import KeywordSearch
from wfc.tasks.multihop import FIRST, LAST, exact_match, make_multihop, normalize


def test_two_searches_reach_the_answer_and_the_corpus_is_exactly_the_facts():
    corpus, examples = make_multihop(120, seed=1)
    assert len(corpus) == 2 * len(examples) == len(set(corpus))
    assert len({e.person for e in examples}) == len({e.place for e in examples}) == 120
    search = KeywordSearch(corpus)
    for ex in examples:
        assert set(ex.inputs().keys()) == {"question"} and ex.person in ex.question
        assert f"{ex.person} works at {ex.place}." in search(ex.question)  # hop 1: the question finds the place
        assert any(p.endswith(f"is in {ex.answer}.") and ex.place[4:] in p for p in search(ex.place))  # hop 2


def test_seeded():
    assert make_multihop(20, seed=3) == make_multihop(20, seed=3)
    assert make_multihop(20, seed=3)[0] != make_multihop(20, seed=4)[0]


def test_exact_match_normalises():
    ex = dspy.Example(question="q", answer="Lisbon")
    assert normalize("The  Lisbon!") == "lisbon"
    assert exact_match(ex, dspy.Prediction(answer="lisbon.")) == 1.0
    assert exact_match(ex, dspy.Prediction(answer="Lisbon, Portugal")) == 0.0
    assert exact_match(ex, dspy.Prediction(query="Lisbon")) == 0.0


@pytest.mark.parametrize("n", [-1, len(FIRST) * len(LAST) + 1])
def test_more_questions_than_people_is_refused(n):
    with pytest.raises(ValueError, match="unique person"):
        make_multihop(n)
