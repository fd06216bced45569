"""Generated arithmetic word problems, the quick default task: :func:`make_arithmetic`.

A problem is a start amount and ``steps`` operations told as a story, e.g. (steps=2)::

    Tom has 12 apples. He buys 7 more. He gives 4 to Mia. How many apples does Tom have now?   -> "15"

Invariants: every intermediate and final answer is a non-negative integer; the answer string is the decimal
integer; the same arguments give the same problems (a local ``random.Random(seed)``, never the global RNG), and
problem ``i`` does not depend on ``n`` (``make_arithmetic(5)`` is a prefix of ``make_arithmetic(10)``).

Difficulty: ``steps`` (1-3 is the intended range; more is allowed), ``max_operand`` (start amounts are drawn
from 2..max_operand, +/- amounts from 1..max_operand; multipliers and divisors from 2..5), and ``ops``, a string
of ``+-*/``. An operation that cannot apply (subtracting from 0, dividing a number with no divisor in 2..5) is
replaced by ``+``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import dspy

OPS = "+-*/"
NAMES = (("Tom", "he", "his"), ("Mia", "she", "her"), ("Sam", "he", "his"), ("Ana", "she", "her"),
         ("Leo", "he", "his"), ("Zoe", "she", "her"), ("Raj", "he", "his"), ("Ivy", "she", "her"))
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "coins", "shells", "cards", "stamps")
FACTORS = (2, 3, 4, 5)
_TIMES = {2: "doubles", 3: "triples"}


@dataclass(frozen=True)
class _Person:
    name: str
    subject: str  # he / she
    possessive: str  # his / her


def _add(rng: random.Random, p: _Person, friend: str, items: str, amount: int) -> str:
    return rng.choice([
        f"{p.subject.capitalize()} buys {amount} more.",
        f"{friend} gives {p.name} {amount} more {items}.",
        f"{p.subject.capitalize()} finds {amount} more {items}.",
    ])


def _sub(rng: random.Random, p: _Person, friend: str, items: str, amount: int) -> str:
    return rng.choice([
        f"{p.subject.capitalize()} gives {amount} to {friend}.",
        f"{p.subject.capitalize()} loses {amount} of them.",
        f"{p.subject.capitalize()} sells {amount} {items}.",
    ])


def _mul(p: _Person, items: str, k: int) -> str:
    grows = _TIMES.get(k, f"becomes {k} times as large")
    return f"Then the number of {items} {p.subject} has {grows}."


def _div(p: _Person, items: str, k: int) -> str:
    return f"Then {p.subject} shares {p.possessive} {items} equally among {k} boxes and keeps just one box."


def _check_args(n: int, steps: int, max_operand: int, ops: str) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1 (1-3 are the usual levels), got {steps!r}")
    if not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"max_operand must be an int >= 1, got {max_operand!r}")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops must be a non-empty string of characters from {OPS!r}, got {ops!r}")


def _problem(rng: random.Random, *, steps: int, max_operand: int, ops: str) -> tuple[str, int]:
    person = _Person(*rng.choice(NAMES))
    friend = rng.choice([n for n, _, _ in NAMES if n != person.name])
    items = rng.choice(ITEMS)
    value = rng.randint(min(2, max_operand), max_operand)  # "has 1 apples" reads badly
    sentences = [f"{person.name} has {value} {items}."]
    for _ in range(steps):
        op = rng.choice(ops)
        divisors = [k for k in FACTORS if value % k == 0 and value > 0]
        if (op == "-" and value == 0) or (op == "/" and not divisors):
            op = "+"
        if op == "+":
            amount = rng.randint(1, max_operand)
            sentences.append(_add(rng, person, friend, items, amount))
            value += amount
        elif op == "-":
            amount = rng.randint(1, min(value, max_operand))
            sentences.append(_sub(rng, person, friend, items, amount))
            value -= amount
        elif op == "*":
            k = rng.choice(FACTORS)
            sentences.append(_mul(person, items, k))
            value *= k
        else:
            k = rng.choice(divisors)
            sentences.append(_div(person, items, k))
            value //= k
    sentences.append(f"How many {items} does {person.name} have now?")
    return " ".join(sentences), value


def make_arithmetic(
    n: int, *, seed: int = 0, steps: int = 1, max_operand: int = 20, ops: str = "+-"
) -> list[dspy.Example]:
    """``n`` word problems as ``dspy.Example(question, answer)`` with input ``question``; see the module docstring."""
    _check_args(n, steps, max_operand, ops)
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        question, value = _problem(rng, steps=steps, max_operand=max_operand, ops=ops)
        assert value >= 0, "every operation keeps the amount a non-negative integer"
        examples.append(dspy.Example(question=question, answer=str(value)).with_inputs("question"))
    return examples
