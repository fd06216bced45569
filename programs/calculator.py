"""A calculator tool for math roles: the role writes the arithmetic, the tool does it.

A small model picks the right operation more often than it gets the sum right: the demo's compiled voters answer
SVAMP's "Each pack costs 76 dollars with a discount of 25 ..." with ``76 - 25 = 49 dollars``. ``calculate`` reads the
arithmetic an answer opens with (its first line, left of the first ``=``; words, units and ``$`` dropped; ``x`` / ``×``
/ ``÷`` read as operators) and gives its value (``51``). Only ``+ - * /``, parentheses and numbers are evaluated,
through Python's ``ast`` (never ``eval``), with bounded sizes; anything else gives ``None`` and the answer stays as
written.

Two pieces use it, and a program that uses one needs the other while it trains:

- ``Calculate``: a ``dspy.Predict`` whose primary output is replaced by the value of the arithmetic it opens with (a
  new Prediction: DSPy's trace keeps the text the model wrote, which is what the rollout graph records and trains on).
  Pass it as a topology's predictor class: ``Voting(sig, n=3, predictor=Calculate)``; the voters' computed answers
  are what the vote compares and the aggregator sees, and the program's answer is a number.
- ``with_calculator(metric)``: the metric a compile of such a program scores with. Per-call credit (``verified``,
  ``own_output``) scores each call on its own recorded outputs, the model's text; reading that text through the
  calculator scores a call as the program would use it. On a final answer the program already computed, it changes
  nothing (a bare number has no arithmetic to do).
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from typing import Any, Callable

import dspy

from programs._fields import primary_output
from wfc.tasks.math import format_number

MAX_EXPRESSION_CHARS = 200  # longer text is not an answer's arithmetic; bounds the parse
MAX_MAGNITUDE = 1e15  # an operand or result beyond this is not a word problem's number

_TIMES = re.compile(r"(?<=[\d)\s])[x×X](?=[\s\d(])")
_NUMBER_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")
_KEEP = re.compile(r"[^0-9.+\-*/() ]")
_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node: ast.AST) -> float:
    """The value of an arithmetic-only AST; ``ValueError`` for anything else (names, calls, powers, huge numbers)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = float(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand) * (-1.0 if isinstance(node.op, ast.USub) else 1.0)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        value = _OPS[type(node.op)](left, right)
    else:
        raise ValueError(f"not arithmetic: {type(node).__name__}")
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError("out of range")
    return value


def calculate(text: object) -> str | None:
    """The value (formatted as a gold answer is: ``51``, ``0.5``) of the arithmetic ``text`` opens with, or ``None``
    when it opens with none: no binary operation between two numbers on its first line left of any ``=``, or
    something a calculator cannot read (a dangling operator, a word between two numbers). Never raises on strings.

    >>> calculate("76 - 25 = 49 dollars"), calculate("4 shirts * 5 minutes = 20"), calculate("11 x 13 = 163")
    ('51', '20', '143')
    >>> calculate("51"), calculate("6 + 8 + "), calculate("6 more birds than 2 birds")
    (None, None, None)
    """
    if not isinstance(text, str):
        return None
    line = text.strip().split("\n", 1)[0].split("=", 1)[0]
    if len(line) > MAX_EXPRESSION_CHARS:
        return None
    expr = _KEEP.sub(" ", _NUMBER_COMMA.sub("", _TIMES.sub("*", line.replace("÷", "/").replace("×", "*"))))
    expr = " ".join(expr.split())
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if not _has_binary_operation(tree):
        return None
    try:
        value = _value(tree)
    except ValueError:
        return None
    return format_number(round(value, 6))


def _has_binary_operation(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) for n in ast.walk(node))


def calculated(text: Any) -> Any:
    """``text`` with its opening arithmetic done (:func:`calculate`), else ``text`` unchanged."""
    value = calculate(text)
    return text if value is None else value


class Calculate(dspy.Predict):
    """``dspy.Predict`` whose primary output (the signature's first output field) is the value of the arithmetic the
    model wrote there, when it wrote some (:func:`calculate`); otherwise the model's text.

    Invariant: DSPy's trace (and so the rollout graph's call) holds the model's own prediction; the returned one is a
    copy with the computed field, so training sees what was generated and the program passes on what was computed."""

    def forward(self, **kwargs):
        prediction = super().forward(**kwargs)
        field = primary_output(self.signature)
        value = calculate(prediction.get(field) if hasattr(prediction, "get") else None)
        if value is None:
            return prediction
        return dspy.Prediction(**{**dict(prediction.items()), field: value})


def with_calculator(metric: Callable, field: str = "answer") -> Callable:
    """``metric`` reading ``prediction.<field>`` through :func:`calculated` first (see the module docstring)."""

    @functools.wraps(metric)
    def scored(example, prediction, trace=None):
        if isinstance(prediction, str):
            return metric(example, calculated(prediction), trace)
        try:
            values = dict(prediction.items())
        except AttributeError:  # not a Prediction: the metric's own error says what it needs
            return metric(example, prediction, trace)
        if field in values:
            values[field] = calculated(values[field])
        return metric(example, dspy.Prediction(**values), trace)

    scored.__name__ = f"{getattr(metric, '__name__', 'metric')}_with_calculator"
    return scored
