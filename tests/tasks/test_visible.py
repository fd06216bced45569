"""The examples a code prompt shows, run against an answer (wfc.tasks.visible): reading them off the prompt,
and every way running them can go, each a hand-written case with the one-line report expected."""

from __future__ import annotations

import pytest

from wfc.tasks.code import CODE_LIMITS
from wfc.tasks.codegen import make_codegen
from wfc.tasks.visible import example_check, prompt_examples, run_examples

CLAMP = ("Write a Python function `clamp(x)` that returns x limited to the range [-3, 12]. "
         "For example, clamp(20) should return 12.")
DOCSTRING = '''def twice(x):
    """Twice x.
    >>> twice(2)
    4
    >>> twice('a')
    'aa'
    """
'''


def test_the_generated_tasks_sentence_and_doctest_lines_are_read_off_the_prompt():
    assert prompt_examples(CLAMP) == [("clamp(20)", "12")]
    assert prompt_examples(DOCSTRING) == [("twice(2)", "4"), ("twice('a')", "'aa'")]  # closing quotes are not output
    assert prompt_examples("Write f. For example, f([1, 2.5]) should return 'a. b'.") == [("f([1, 2.5])", "'a. b'")]
    assert prompt_examples("Write a function that adds two numbers.") == []
    assert prompt_examples("For example, f(3 should return 7.") == []  # not an expression: left out


@pytest.mark.parametrize("code, report", [
    ("def clamp(x):\n    return max(-3, min(12, x))\n", ""),
    ("def clamp(x):\n    return x\n", "clamp(20) returned 20, but it should return 12."),
    ("def clamp(x):\n    return 1 / 0\n", "Running clamp(20) raised ZeroDivisionError: division by zero."),
    ("def clamp(x)\n    return x\n", "The code does not run: SyntaxError: expected ':'"),
    ("def clamp(y):\n    return y\nclamp = None\n", "Running clamp(20) raised TypeError: 'NoneType' object is not "
                                                   "callable."),
    ("def clip(x):\n    return 12\n", "Running clamp(20) raised NameError: name 'clamp' is not defined."),
])
def test_running_the_prompts_example_reports_the_first_thing_wrong_in_one_line(code, report):
    assert run_examples(code, prompt_examples(CLAMP)) == (report == "", report)


def test_the_first_failing_example_is_reported_and_values_compare_by_equality():
    assert run_examples("def twice(x):\n    return 4\n", prompt_examples(DOCSTRING)) == (
        False, "twice('a') returned 4, but it should return 'aa'.")
    assert run_examples("def f():\n    return 2.0\n", [("f()", "2")]) == (True, "")  # == , not repr
    assert run_examples("def f():\n    return [0] * 1000\n", [("f()", "[]")])[1].endswith(", but it should return [].")
    assert len(run_examples("def f():\n    return [0] * 1000\n", [("f()", "[]")])[1]) < 300  # the value is cut


def test_an_example_that_never_returns_is_reported_as_unfinished():
    limits = CODE_LIMITS.model_copy(update={"timeout_s": 1.0, "cpu_s": 1})
    ok, report = run_examples("def clamp(x):\n    while True:\n        pass\n", prompt_examples(CLAMP), limits=limits)
    assert not ok and report.startswith("Running clamp(20) did not finish (")


def test_example_check_reads_the_code_out_of_the_answer_and_passes_what_it_cannot_judge():
    fenced = "Here it is:\n```python\ndef clamp(x):\n    return 12\n```\n"
    assert example_check({"prompt": CLAMP}, {"code": fenced}) == (True, "")  # only the shown example is checked
    assert example_check({"prompt": CLAMP}, {"code": ""}) == (False, "There is no code.")
    assert example_check({"prompt": "Write f."}, {"code": "def f(): pass"}) == (True, "")


def test_every_generated_tasks_reference_passes_its_shown_example_and_a_constant_mostly_does_not():
    tasks = make_codegen(24, seed=3)
    assert all(len(prompt_examples(t.prompt)) == 1 for t in tasks)
    assert all(example_check({"prompt": t.prompt}, {"code": t.solution}) == (True, "") for t in tasks)
    wrong = [example_check({"prompt": t.prompt}, {"code": f"def {t.entry_point}(*args):\n    return -12345\n"})
             for t in tasks]
    assert all(not ok and "returned -12345, but it should return" in report for ok, report in wrong)
