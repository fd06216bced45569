"""wfc.tasks.extraction: every sentence states its person's name, age and city verbatim; the stream is seeded and
prefix-stable; the metric reads a typed object, a mapping or JSON text and needs all three fields right."""

from __future__ import annotations

import json

import dspy
import pytest
from pydantic import BaseModel

from wfc.tasks.extraction import make_people, person_metric


class Person(BaseModel):
    name: str
    age: int
    city: str


def test_fields_appear_in_the_text():
    for ex in make_people(200, seed=3):
        assert ex.name in ex.text and ex.city in ex.text and str(ex.age) in ex.text
        assert 18 <= ex.age <= 90 and set(ex.inputs().keys()) == {"text"}


def test_seeded_and_prefix_stable():
    a = make_people(30, seed=5)
    assert [e.text for e in make_people(10, seed=5)] == [e.text for e in a[:10]]
    assert [e.text for e in make_people(10, seed=6)] != [e.text for e in a[:10]]


def test_the_metric_reads_each_form_and_needs_every_field():
    ex = dspy.Example(text="t", name="Maria Lopez", age=34, city="Denver")
    right = {"name": "maria  lopez", "age": 34, "city": "Denver "}
    assert person_metric(ex, dspy.Prediction(person=Person(name="Maria Lopez", age=34, city="Denver"))) == 1.0
    assert person_metric(ex, dspy.Prediction(person=right)) == 1.0
    assert person_metric(ex, dspy.Prediction(person=json.dumps({**right, "age": "34"}))) == 1.0
    for wrong in ({**right, "age": 35}, {**right, "city": "Lima"}, {"name": "Maria Lopez", "age": 34}, "not json",
                  {**right, "age": "thirty"}, None):
        assert person_metric(ex, dspy.Prediction(person=wrong)) == 0.0


def test_bad_n_is_refused():
    with pytest.raises(ValueError):
        make_people(-1)
