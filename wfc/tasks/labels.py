"""Generated sentences to classify by topic: :func:`make_topics` and :func:`topic_metric`.

A sentence is a topic clause inside a neutral frame, e.g. ``"Ana said that the band played 9 songs at the
concert."`` -> ``"music"``. Every topic shares the same frames, names and numbers, so only the clause tells the topic.

Invariants: ``topic`` is one of :data:`TOPICS`; the same arguments give the same sentences (a local
``random.Random(seed)``), and sentence ``i`` does not depend on ``n``. Sentences may repeat within one call; split
them with ``wfc.tasks.registry.unique_splits(..., key="sentence")``.
"""

from __future__ import annotations

import random

import dspy

TOPICS = ("sports", "food", "weather", "music")
NAMES = ("Ana", "Tom", "Mia", "Leo", "Raj", "Zoe", "Sam", "Ivy", "Ben", "Eva")
FRAMES = ("{name} said that {clause}.", "Yesterday {clause}.", "Everyone was talking about how {clause}.",
          "I read in the paper that {clause}.", "According to {name}, {clause}.", "It turns out {clause}.")
CLAUSES: dict[str, tuple[str, ...]] = {
    "sports": ("the home team won the final by {k} points", "{other} scored twice in the last {k} minutes",
               "the coach benched the goalkeeper for {k} games", "the runners finished the race in {k} hours",
               "the striker was sold for {k} million", "the tennis match went to {k} sets"),
    "food": ("the new bakery sells {k} kinds of bread", "{other} cooked a curry with {k} different spices",
             "the soup needs to simmer for {k} minutes", "the cafe now serves {k} flavours of ice cream",
             "the recipe calls for {k} eggs and a cup of flour", "the chef grilled {k} fresh fish for dinner"),
    "weather": ("the storm dropped {k} centimetres of snow overnight", "the forecast promises {k} sunny days",
                "the wind reached {k} kilometres an hour", "it rained for {k} days without a break",
                "the temperature fell {k} degrees after the cold front", "{other} got caught in a hail shower"),
    "music": ("the band played {k} songs at the concert", "{other} practised the violin for {k} hours",
              "the choir learned {k} new hymns", "the album climbed {k} places in the charts",
              "the orchestra tuned up before the symphony", "the drummer broke {k} sticks during the show"),
}


def _check_n(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")


def _sentence(rng: random.Random) -> tuple[str, str]:
    topic = rng.choice(TOPICS)
    name, other = rng.sample(NAMES, 2)
    clause = rng.choice(CLAUSES[topic]).format(k=rng.randint(2, 40), other=other)
    text = rng.choice(FRAMES).format(name=name, clause=clause)
    return text[0].upper() + text[1:], topic


def make_topics(n: int, *, seed: int = 0) -> list[dspy.Example]:
    """``n`` sentences as ``dspy.Example(sentence, topic)`` with input ``sentence``; see the module docstring."""
    _check_n(n)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sentence, topic = _sentence(rng)
        out.append(dspy.Example(sentence=sentence, topic=topic).with_inputs("sentence"))
    return out


def topic_metric(example, prediction, trace=None) -> float:
    """1.0 when ``prediction.topic`` is the example's topic (case and surrounding blanks ignored), else 0.0."""
    predicted = getattr(prediction, "topic", None)
    return float(str(predicted).strip().lower() == example.topic)
