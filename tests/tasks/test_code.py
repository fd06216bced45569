"""wfc.tasks.code: code extraction, program assembly, pass@k, and the sandboxed code metric."""

from __future__ import annotations

import functools

import dspy
import pytest

from wfc.tasks.code import CODE_LIMITS, build_program, code_metric, extract_code, pass_at_k, run_tests
from wfc.tasks.sandbox import run_python

ADD = dspy.Example(
    prompt="Write a Python function `add(a, b)` that returns the sum of a and b.",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    entry_point="add",
).with_inputs("prompt")

STUB = dspy.Example(
    prompt='from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    stub='from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    tests="def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n",
    entry_point="total",
).with_inputs("prompt")


# --- pass@k against a hand-worked table: 1 - C(n-c, k) / C(n, k) --------------------------------------------------

@pytest.mark.parametrize("n,c,k,expected", [
    (5, 0, 1, 0.0),  # nothing passes
    (5, 5, 1, 1.0),  # everything passes
    (5, 1, 1, 0.2),  # pass@1 = c/n
    (10, 3, 1, 0.3),
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 5, 1 - 21 / 252),  # C(7,5)=21, C(10,5)=252 -> 0.91666...
    (4, 3, 2, 1.0),  # n - c = 1 < k: every draw of 2 contains a pass
    (1, 1, 1, 1.0),  # a group of one
    (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 1 - 100/200
])
def test_pass_at_k_table(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_is_exact_and_monotone():
    values = [pass_at_k(1000, 10, k) for k in (1, 10, 100)]
    assert values[0] == pytest.approx(0.01)
    assert values == sorted(values) and values[-1] < 1.0


@pytest.mark.parametrize("n,c,k,error", [
    (5, 6, 1, ValueError), (5, -1, 1, ValueError), (5, 2, 0, ValueError), (5, 2, 6, ValueError), (5.0, 2, 1, TypeError),
])
def test_pass_at_k_rejects_bad_counts(n, c, k, error):
    with pytest.raises(error):
        pass_at_k(n, c, k)


# --- extraction and assembly ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,code", [
    ("def f():\n    return 1", "def f():\n    return 1"),
    ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1"),
    ("```\nx = 1\n```", "x = 1"),
    ("```py\nx = 1\n```", "x = 1"),
    ("```text\noutput\n```\n```python\nx = 2\n```", "x = 2"),  # the python block, not the first
    ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # unclosed fence (truncated output)
    ("", ""),
    (None, ""),
])
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_build_program_full_function_gets_stub_imports():
    program = build_program("def total(xs: List[int]) -> int:\n    return sum(xs)", tests=STUB.tests,
                            entry_point="total", stub=STUB.stub)
    assert program.startswith("from typing import List\n")
    assert program.rstrip().endswith("check(total)")


def test_build_program_body_continues_the_stub():
    program = build_program("    return sum(xs)\n", tests=STUB.tests, entry_point="total", stub=STUB.stub)
    assert program.startswith(STUB.stub + "    return sum(xs)\n")


# --- the metric (runs the sandbox: ~0.1 s each) --------------------------------------------------------------------

def test_code_metric_scores_right_and_wrong_code():
    assert code_metric(ADD, dspy.Prediction(code="```python\ndef add(a, b):\n    return a + b\n```")) == 1.0
    assert code_metric(ADD, dspy.Prediction(code="def add(a, b):\n    return a - b")) == 0.0
    assert code_metric(ADD, "def add(a, b):\n    return a + b") == 1.0
    assert code_metric(ADD, dspy.Prediction(code="")) == 0.0
    assert code_metric(ADD, dspy.Prediction(code="def add(a, b) return")) == 0.0


def test_code_metric_body_only_and_full_answers_to_a_stub():
    assert code_metric(STUB, dspy.Prediction(code="    return sum(xs)\n")) == 1.0
    assert code_metric(STUB, dspy.Prediction(code="def total(xs: List[int]) -> int:\n    return sum(xs)")) == 1.0


def test_code_metric_survives_hostile_answers():
    fast = functools.partial(code_metric, limits=CODE_LIMITS.model_copy(update={"timeout_s": 1.0, "cpu_s": 1}))
    assert fast(ADD, dspy.Prediction(code="def add(a, b):\n    while True:\n        pass")) == 0.0

@pytest.mark.parametrize("cheat", [
    "import sys\nsys.exit(0)",  # exit 0 before the tests run
    "import os\ndef add(a, b):\n    os._exit(0)",  # exit 0 from inside the first call
    "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return 0",  # mask the failure
])
def test_code_metric_early_exit_does_not_score(cheat):
    result = run_python(build_program(cheat, tests=ADD.tests, entry_point="add"), limits=CODE_LIMITS)
    assert result.status == "passed", "the sandbox alone sees exit status 0"
    assert code_metric(ADD, dspy.Prediction(code=cheat)) == 0.0


def test_run_tests_returns_feedback():
    passed, result = run_tests(ADD, "def add(a, b):\n    return a * b")
    assert not passed and result.status == "failed" and "AssertionError" in result.stderr
    passed, result = run_tests(ADD, "def add(a, b):\n    print('hi')\n    return a + b")
    assert passed and "hi\n" in result.stdout


def test_code_metric_errors_say_what_is_wrong():
    with pytest.raises(TypeError, match="code"):
        code_metric(ADD, dspy.Prediction(answer="42"))
    with pytest.raises(TypeError, match="tests"):
        code_metric(dspy.Example(prompt="p"), "x = 1")
