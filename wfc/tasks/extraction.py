"""Generated sentences about one person, to extract into typed fields: :func:`make_people` and
:func:`person_metric`.

A sentence names a person, their age and their city, in one of several word orders, sometimes with a distractor
number, e.g. ``"In Denver, Maria Lopez (34) keeps 3 cats."`` -> ``name="Maria Lopez"``, ``age=34``,
``city="Denver"``.

Invariants: ``age`` is an int in 18..90 and appears in the text as digits; ``name`` and ``city`` appear verbatim; the
same arguments give the same sentences (a local ``random.Random(seed)``), and sentence ``i`` does not depend on
``n``. Sentences may repeat within one call; split them with ``unique_splits(..., key="text")``.
"""

from __future__ import annotations

import json
import random
from typing import Any

import dspy

FIELDS = ("name", "age", "city")
FIRST = ("Maria", "James", "Aisha", "Kenji", "Olga", "Pedro", "Fatima", "Liam", "Chen", "Nora", "Omar", "Hannah",
         "Diego", "Priya", "Lukas", "Sofia")
LAST = ("Lopez", "Smith", "Khan", "Tanaka", "Ivanova", "Silva", "Haddad", "Murphy", "Wang", "Berg", "Farouk",
        "Fischer", "Rossi", "Patel", "Novak", "Costa")
CITIES = ("Denver", "Lisbon", "Osaka", "Nairobi", "Oslo", "Lima", "Cairo", "Dublin", "Hanoi", "Quebec", "Perth",
          "Seville")
TEMPLATES = (
    "{name} is {age} years old and lives in {city}.",
    "{name}, who lives in {city}, turned {age} last week.",
    "In {city}, {name} ({age}) keeps {k} cats.",
    "The {age}-year-old {name} moved to {city} {k} years ago.",
    "Born {age} years ago, {name} now calls {city} home.",
    "{name} ({age}) took a train from {city} with {k} friends.",
)


def _check_n(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")


def make_people(n: int, *, seed: int = 0) -> list[dspy.Example]:
    """``n`` sentences as ``dspy.Example(text, name, age, city)`` with input ``text``; see the module docstring."""
    _check_n(n)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, age, city = f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.randint(18, 90), rng.choice(CITIES)
        text = rng.choice(TEMPLATES).format(name=name, age=age, city=city, k=rng.randint(2, 9))
        out.append(dspy.Example(text=text, name=name, age=age, city=city).with_inputs("text"))
    return out


def _fields(value: Any) -> dict[str, Any]:
    """The person's fields from an object with attributes, a mapping or JSON text ({} when unreadable)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, dict):
        return value
    return {f: getattr(value, f) for f in FIELDS if hasattr(value, f)}


def _same(gold: Any, predicted: Any) -> bool:
    if isinstance(gold, int):
        try:
            return int(str(predicted).strip()) == gold
        except ValueError:
            return False
    return " ".join(str(predicted).split()).lower() == gold.lower()


def person_metric(example, prediction, trace=None) -> float:
    """1.0 when ``prediction.person`` (a typed object, a mapping or JSON text) has the example's name, age and city
    (text compared case- and blank-insensitively, age as an int), else 0.0."""
    got = _fields(getattr(prediction, "person", None))
    return float(all(f in got and _same(example[f], got[f]) for f in FIELDS))
