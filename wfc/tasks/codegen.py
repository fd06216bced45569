"""Generated function-writing tasks with tests, the quick code task: :func:`make_codegen`.

Each example: input ``prompt`` ("Write a Python function `clamp(x)` that returns x limited to the range [-3, 12].
For example, clamp(20) should return 12."), ``tests`` (``def check(candidate)`` asserting on several inputs),
``entry_point`` and ``solution`` (a reference implementation that passes the tests). Same fields as HumanEval
examples, minus ``stub``: answers must define the whole function.

Invariants: expected values in the tests are computed by running the template's own reference source (so tests and
solution cannot disagree); values are ints, strs, bools or lists of them (``==`` is exact); the same ``(n, seed)``
gives the same tasks (a local ``random.Random``), and task ``i`` does not depend on ``n``.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Callable

import dspy

N_TESTS = 5


@dataclass(frozen=True)
class _Spec:
    entry_point: str
    params: str  # "a, b"
    description: str  # completes "that ..."
    solution: str  # full reference source
    inputs: tuple[tuple, ...]  # argument tuples for the tests; the first is the prompt's example


def _ints(rng: random.Random, lo: int, hi: int, n: int = N_TESTS) -> tuple[tuple, ...]:
    return tuple((rng.randint(lo, hi),) for _ in range(n))


def _word(rng: random.Random, alphabet: str, lo: int = 0, hi: int = 8) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def _int_list(rng: random.Random) -> list[int]:
    return [rng.randint(-9, 20) for _ in range(rng.randint(0, 7))]


def _linear(rng):
    a, b = rng.randint(2, 9), rng.randint(0, 20)
    name = rng.choice(["scale_and_shift", "linear", "transform"])
    return _Spec(name, "x", f"returns x multiplied by {a}, plus {b}",
                 f"def {name}(x):\n    return x * {a} + {b}\n", _ints(rng, -20, 20))


_BINOPS = {
    "add": ("returns the sum of a and b", "a + b"),
    "subtract": ("returns a minus b", "a - b"),
    "multiply": ("returns the product of a and b", "a * b"),
    "larger": ("returns the larger of a and b", "max(a, b)"),
    "smaller": ("returns the smaller of a and b", "min(a, b)"),
}


def _binop(rng):
    name = rng.choice(sorted(_BINOPS))
    description, expr = _BINOPS[name]
    inputs = tuple((rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(N_TESTS))
    return _Spec(name, "a, b", description, f"def {name}(a, b):\n    return {expr}\n", inputs)


def _count_char(rng):
    c = rng.choice("abcdexyz")
    alphabet = "abc" + c
    inputs = tuple((_word(rng, alphabet, 0, 10),) for _ in range(N_TESTS))
    return _Spec("count_char", "s", f"returns how many times the character '{c}' appears in the string s",
                 f"def count_char(s):\n    return s.count({c!r})\n", inputs)


_FILTERS = {
    "even": ("x % 2 == 0", "the even numbers"),
    "odd": ("x % 2 == 1", "the odd numbers"),
    "positive": ("x > 0", "the positive numbers"),
}


def _sum_filtered(rng):
    kind = rng.choice(sorted(_FILTERS))
    cond, words = _FILTERS[kind]
    name = f"sum_{kind}"
    inputs = tuple((_int_list(rng),) for _ in range(N_TESTS))
    return _Spec(name, "xs", f"returns the sum of {words} in the list of integers xs (0 if there are none)",
                 f"def {name}(xs):\n    return sum(x for x in xs if {cond})\n", inputs)


def _keep_greater(rng):
    t = rng.randint(-5, 10)
    inputs = tuple((_int_list(rng),) for _ in range(N_TESTS))
    return _Spec("keep_greater", "xs", f"returns a list of the elements of xs that are greater than {t}, in order",
                 f"def keep_greater(xs):\n    return [x for x in xs if x > {t}]\n", inputs)


def _clamp(rng):
    lo = rng.randint(-10, 5)
    hi = lo + rng.randint(1, 20)
    return _Spec("clamp", "x", f"returns x limited to the range [{lo}, {hi}]",
                 f"def clamp(x):\n    return max({lo}, min({hi}, x))\n", _ints(rng, lo - 10, hi + 10))


def _strings(rng):
    name = rng.choice(["reverse_string", "is_palindrome", "count_words"])
    if name == "reverse_string":
        inputs = tuple((_word(rng, string.ascii_lowercase),) for _ in range(N_TESTS))
        return _Spec(name, "s", "returns the string s reversed", "def reverse_string(s):\n    return s[::-1]\n", inputs)
    if name == "is_palindrome":
        words = [_word(rng, "ab", 0, 5) for _ in range(N_TESTS)]
        inputs = tuple((w + w[::-1] if i % 2 else w,) for i, w in enumerate(words))
        return _Spec(name, "s", "returns True if the string s reads the same backwards, else False",
                     "def is_palindrome(s):\n    return s == s[::-1]\n", inputs)
    inputs = tuple((" ".join(_word(rng, "abc ", 0, 4) for _ in range(rng.randint(0, 4))),) for _ in range(N_TESTS))
    return _Spec(name, "s", "returns the number of words in s, where words are separated by whitespace",
                 "def count_words(s):\n    return len(s.split())\n", inputs)


def _sequences(rng):
    name = rng.choice(["fib", "factorial", "digit_sum"])
    if name == "fib":
        src = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
        return _Spec(name, "n", "returns the n-th Fibonacci number, where fib(0) = 0 and fib(1) = 1", src,
                     _ints(rng, 0, 25))
    if name == "factorial":
        src = "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n"
        return _Spec(name, "n", "returns n! (the product 1 * 2 * ... * n; factorial(0) is 1)", src, _ints(rng, 0, 12))
    src = "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n"
    return _Spec(name, "n", "returns the sum of the decimal digits of the non-negative integer n", src,
                 _ints(rng, 0, 99999))


TEMPLATES: tuple[Callable[[random.Random], _Spec], ...] = (
    _linear, _binop, _count_char, _sum_filtered, _keep_greater, _clamp, _strings, _sequences,
)


def _call(spec: _Spec, args: tuple) -> str:
    return f"{spec.entry_point}({', '.join(repr(a) for a in args)})"


def _example(spec: _Spec) -> dspy.Example:
    namespace: dict = {}
    exec(spec.solution, namespace)  # our own template source, never model output
    reference = namespace[spec.entry_point]
    expected = [reference(*args) for args in spec.inputs]
    asserts = "\n".join(
        f"    assert candidate({', '.join(map(repr, args))}) == {want!r}" for args, want in zip(spec.inputs, expected)
    )
    prompt = (
        f"Write a Python function `{spec.entry_point}({spec.params})` that {spec.description}. "
        f"For example, {_call(spec, spec.inputs[0])} should return {expected[0]!r}."
    )
    return dspy.Example(
        prompt=prompt, tests=f"def check(candidate):\n{asserts}\n", entry_point=spec.entry_point,
        solution=spec.solution,
    ).with_inputs("prompt")


def make_codegen(n: int, *, seed: int = 0) -> list[dspy.Example]:
    """``n`` function-writing tasks (see the module docstring), drawn from :data:`TEMPLATES`."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(seed)
    return [_example(rng.choice(TEMPLATES)(rng)) for _ in range(n)]
