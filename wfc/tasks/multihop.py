"""Generated two-hop questions over a small local corpus: :func:`make_multihop` and :func:`exact_match`.

The corpus holds two passages per person, ``"<person> works at <place>."`` and ``"<place> is in <city>."``, in a
seeded shuffled order. A question asks for the city a person works in (``"In which city does Nora Berg work?"`` ->
``"Oslo"``): one search finds the person's place, a second finds the place's city; the question shares no word with
the place's passage but ``in``.

Invariants: every person and every place is unique, so each question has exactly one answer and names exactly one
person; the corpus holds both passages of every question and nothing else; the same arguments give the same corpus
and questions (a local ``random.Random(seed)``).
"""

from __future__ import annotations

import itertools
import random
import re

import dspy

FIRST = ("Nora", "Ivan", "Lena", "Hugo", "Mira", "Otto", "Rosa", "Theo", "Alma", "Felix", "Greta", "Jonas", "Kira",
         "Lars", "Maya", "Nils", "Petra", "Rafael", "Sana", "Tobias", "Ursula", "Viktor", "Wanda", "Yusuf")
LAST = ("Berg", "Crane", "Dahl", "Eder", "Frost", "Graf", "Holm", "Ibsen", "Jung", "Kolb", "Lind", "Moser", "Noor",
        "Ortiz", "Pike", "Quist", "Roth", "Stark", "Thorn", "Ueda", "Vance", "Wolf", "Yates", "Zeller")
ADJECTIVES = ("Blue", "Golden", "Silver", "Red", "Green", "Quiet", "Old", "Little", "Northern", "Bright", "Hidden",
              "Royal")
ANIMALS = ("Heron", "Fox", "Otter", "Falcon", "Badger", "Lynx", "Swan", "Hare", "Raven", "Bison", "Stork", "Wren")
KINDS = ("Bakery", "Library", "Clinic", "Garage", "Studio", "Brewery", "Bookshop", "Workshop")
CITIES = ("Lisbon", "Oslo", "Krakow", "Porto", "Bergen", "Ghent", "Turin", "Malmo", "Leeds", "Graz", "Lyon", "Basel")


def _check_n(n: int) -> None:
    limit = len(FIRST) * len(LAST)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= limit:
        raise ValueError(f"n must be an int in 0..{limit} (one unique person per question), got {n!r}")


def make_multihop(n: int, *, seed: int = 0) -> tuple[list[str], list[dspy.Example]]:
    """``(corpus, examples)``: ``n`` questions as ``dspy.Example(question, answer, person, place)`` with input
    ``question``, and the corpus they are answered from; see the module docstring."""
    _check_n(n)
    rng = random.Random(seed)
    people = rng.sample([f"{f} {l}" for f, l in itertools.product(FIRST, LAST)], n)
    places = rng.sample([f"the {a} {b} {k}" for a, b, k in itertools.product(ADJECTIVES, ANIMALS, KINDS)], n)
    corpus, examples = [], []
    for person, place in zip(people, places):
        city = rng.choice(CITIES)
        corpus += [f"{person} works at {place}.", f"{place[0].upper()}{place[1:]} is in {city}."]
        examples.append(dspy.Example(question=f"In which city does {person} work?", answer=city, person=person,
                                     place=place).with_inputs("question"))
    rng.shuffle(corpus)
    return corpus, examples


_WORDS = re.compile(r"[a-z0-9]+")


def normalize(text: object) -> str:
    """Lowercase words joined by one blank, punctuation and a leading article dropped (SQuAD-style)."""
    words = _WORDS.findall(str(text).lower())
    return " ".join(words[1:] if words[:1] in (["the"], ["a"], ["an"]) else words)


def exact_match(example, prediction, trace=None) -> float:
    """1.0 when ``prediction.answer`` equals the example's answer after :func:`normalize`, else 0.0."""
    return float(normalize(getattr(prediction, "answer", "")) == normalize(example.answer))
