"""Scoring math answers: :func:`extract_number` (free text -> final number) and :func:`math_metric`.

Extraction order (the first rule that yields a number wins):

1. A DSPy output block ``[[ ## answer ## ]]``: the rules below, applied to the block's text only.
2. The last ``\\boxed{...}`` (``\\frac{a}{b}`` inside is understood).
3. The last GSM8K marker ``#### 42``: the first number after it.
4. The last answer phrase (``Answer:``, ``answer is``, ``Final answer =``, ``**Answer:**``): on the rest of that
   line (or the next non-empty line), the number after the last ``=`` if there is one, else the first number.
5. The last number anywhere. Small models restate the question (``17 + 25 = 42``); the result comes last.

A number may carry a sign (``-5``, ``−5``; a ``-`` right after a digit or letter is subtraction, not a sign),
thousands separators (``1,234``, LaTeX ``1{,}234``), a currency sign (``$5.50``, ``-$5``), a unit (``12 apples``,
``5kg``), a percent sign (``50%`` reads as 50: GSM8K states percentages as numbers of percent), be a fraction
(``3/4``, ``1 1/2``, ``\\frac{3}{4}``) or use exponent notation (``1.5e3``). Number words (``five``) are not read.
"""

from __future__ import annotations

import math as _math
import re

REL_TOL = 1e-6
ABS_TOL = 1e-9  # so that 0 matches 0.0000000001 too; relative tolerance alone can never match against 0

_SIGN = r"(?:(?<![\w)\].])(?P<sign>[-−+]))?"
_CURRENCY = r"(?:[$€£¥]\s?)?"
_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+(?![\w]))?"
_NUMBER = re.compile(
    _SIGN + _CURRENCY + r"(?<![\w./])"
    r"(?:(?P<whole>\d+)[ \t]+(?P<mnum>\d+)/(?P<mden>\d+)(?![\d/])"  # mixed number: 1 1/2
    r"|(?P<num>\d+)/(?P<den>\d+)(?![\d/])"  # fraction: 3/4
    r"|(?P<dec>" + _DECIMAL + r"))"
)
_DSPY_ANSWER = re.compile(r"\[\[\s*##\s*answer\s*##\s*\]\](?P<body>.*?)(?=\[\[\s*##|\Z)", re.S | re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"####")
_ANSWER_PHRASE = re.compile(r"\banswer\b[\s*_]*(?:is\b|was\b|:|=)[\s*_:]*", re.I)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")


def _normalize(text: str) -> str:
    text = text.replace("{,}", ",").replace("\\$", "$").replace("\\%", "%").replace("\\!", "")
    return _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", text)


def _value(m: re.Match) -> float | None:
    if m.group("dec") is not None:
        value = float(m.group("dec").replace(",", ""))
    elif m.group("num") is not None:
        den = int(m.group("den"))
        if den == 0:
            return None
        value = int(m.group("num")) / den
    else:
        den = int(m.group("mden"))
        if den == 0:
            return None
        value = int(m.group("whole")) + int(m.group("mnum")) / den
    return -value if m.group("sign") in ("-", "−") else value


def numbers(text: str) -> list[float]:
    """Every number in ``text``, in order, read as described in the module docstring."""
    found = (_value(m) for m in _NUMBER.finditer(_normalize(text)))
    return [v for v in found if v is not None and _math.isfinite(v)]


def _boxed_contents(text: str) -> list[str]:
    """The brace-balanced argument of every ``\\boxed{...}``, in order."""
    contents = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        contents.append(text[m.end() : i - 1] if depth == 0 else text[m.end() :])
    return contents


def _after_marker(rest: str) -> float | None:
    """The number an answer phrase points at, read in the first sentence of its line (or the next non-empty one)."""
    lines = rest.split("\n")
    line = re.split(r"\.\s", next((ln for ln in lines if ln.strip()), ""), maxsplit=1)[0]
    if "=" in line:
        after_eq = numbers(line.rsplit("=", 1)[1])
        if after_eq:
            return after_eq[0]
    found = numbers(line)
    return found[0] if found else None


def _extract_plain(text: str) -> float | None:
    for content in reversed(_boxed_contents(text)):
        found = numbers(content)
        if found:
            return found[-1]
    for m in reversed(list(_GSM8K.finditer(text))):
        found = numbers(text[m.end() :])
        if found:
            return found[0]
    for m in reversed(list(_ANSWER_PHRASE.finditer(text))):
        value = _after_marker(text[m.end() :])
        if value is not None:
            return value
    found = numbers(text)
    return found[-1] if found else None


def extract_number(text: object) -> float | None:
    """The final numeric answer in ``text``, or ``None`` when there is none. Never raises on strings.

    Numbers (int, float) pass through; ``None`` gives ``None``; anything else is read as ``str(text)``.
    """
    if text is None:
        return None
    if isinstance(text, bool):
        return float(text)
    if isinstance(text, (int, float)):
        return float(text) if _math.isfinite(text) else None
    text = str(text)
    for m in reversed(list(_DSPY_ANSWER.finditer(text))):
        value = _extract_plain(m.group("body"))
        if value is not None:
            return value
    return _extract_plain(text)


def format_number(value: float) -> str:
    """The canonical string for a gold answer: ``18``, ``-5``, ``0.75`` (no ``.0``, no separators)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def numbers_match(a: float | None, b: float | None) -> bool:
    """Equal within 1e-6 relative (and 1e-9 absolute, for answers near 0). ``None`` never matches."""
    if a is None or b is None:
        return False
    return _math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _predicted_text(prediction: object) -> object:
    if isinstance(prediction, (str, int, float)) or prediction is None:
        return prediction
    try:
        return prediction.answer
    except (AttributeError, KeyError):
        raise TypeError(
            f"math_metric needs a prediction with an `answer` field (a dspy.Prediction) or a str; got "
            f"{type(prediction).__name__} without one. Check that the program's signature outputs `answer`."
        ) from None


def math_metric(example: object, prediction: object, trace: object = None) -> float:
    """1.0 when the number in ``prediction.answer`` equals ``example.answer`` (see :func:`numbers_match`), else 0.0.

    DSPy metric signature; ``trace`` is accepted and ignored. ``prediction`` may be a ``dspy.Prediction``, any
    object with an ``answer`` attribute, or a plain str. An unreadable prediction scores 0.0; an example whose
    ``answer`` holds no number is a data error and raises ``ValueError``.
    """
    try:
        gold_text = example.answer
    except (AttributeError, KeyError):
        raise TypeError("math_metric needs an example with an `answer` field (a dspy.Example)") from None
    gold = extract_number(gold_text)
    if gold is None:
        raise ValueError(f"the example's answer {gold_text!r} holds no number; fix the data set")
    return 1.0 if numbers_match(extract_number(_predicted_text(prediction)), gold) else 0.0
