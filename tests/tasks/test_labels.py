"""wfc.tasks.labels: topic sentences are labelled by their clause, seeded and prefix-stable; the metric compares
labels case- and blank-insensitively."""

from __future__ import annotations

import re

import dspy
import pytest

from wfc.tasks.labels import CLAUSES, NAMES, TOPICS, make_topics, topic_metric


def _clause(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{k\}", r"\d+").replace(r"\{other\}", "(?:" + "|".join(NAMES) + ")")
    return re.compile(pattern, re.I)


def test_each_sentence_holds_a_clause_of_its_topic_only():
    clauses = {t: [_clause(c) for c in CLAUSES[t]] for t in TOPICS}
    for ex in make_topics(300, seed=4):
        assert ex.topic in TOPICS and set(ex.inputs().keys()) == {"sentence"}
        found = {t for t in TOPICS for c in clauses[t] if c.search(ex.sentence)}
        assert found == {ex.topic}, ex.sentence
        assert ex.sentence[0].isupper() and ex.sentence.endswith(".")


def test_every_topic_appears_and_the_stream_is_seeded_and_prefix_stable():
    examples = make_topics(100, seed=1)
    assert {ex.topic for ex in examples} == set(TOPICS)
    assert [e.sentence for e in make_topics(10, seed=1)] == [e.sentence for e in examples[:10]]
    assert [e.sentence for e in make_topics(10, seed=2)] != [e.sentence for e in examples[:10]]


def test_the_metric():
    ex = dspy.Example(sentence="x", topic="food")
    assert topic_metric(ex, dspy.Prediction(topic=" Food ")) == 1.0
    assert topic_metric(ex, dspy.Prediction(topic="music")) == 0.0
    assert topic_metric(ex, dspy.Prediction(answer="food")) == 0.0  # no topic field: not an answer


@pytest.mark.parametrize("n", [-1, 1.5, True])
def test_bad_n_is_refused(n):
    with pytest.raises(ValueError):
        make_topics(n)
