"""benchmarks/paired_runs.py: two runs' held-out results paired task by task (a hand-worked table)."""

from __future__ import annotations

import json

import pytest

from benchmarks import paired_runs


def _run(path, rows, functions=None):
    path.mkdir()
    (path / "tasks.jsonl").write_text("".join(
        json.dumps({"task": i, "before": b, "after": a, **({"function": functions[i]} if functions else {})}) + "\n"
        for i, (b, a) in enumerate(rows)))
    return path


def test_two_runs_are_paired_task_by_task(tmp_path):
    # after: A solves tasks 0, 1; B solves 1, 2, 3 -> B - A = (-1 + 0 + 1 + 1) / 4 = +0.25, one only A, two only B
    a = _run(tmp_path / "a", [(0, 1), (0, 1), (0, 0), (1, 0)])
    b = _run(tmp_path / "b", [(0, 0), (0, 1), (0, 1), (1, 1)])
    result = paired_runs.main([str(a), str(b)])
    after = result["after_b_minus_a"]
    assert after["difference"] == pytest.approx(0.25) and (after["only_after"], after["only_before"]) == (2, 1)
    # differences -1, 0, 1, 1: sample variance 11/12, half-width 1.96 * sqrt(11/48)
    assert after["interval"] == pytest.approx([0.25 - 1.96 * (11 / 48) ** 0.5, 0.25 + 1.96 * (11 / 48) ** 0.5])
    assert result["before_b_minus_a"]["difference"] == 0.0 and result["n"] == 4
    assert "after_b_minus_a_by_function" not in result  # runs that do not record each task's function


def test_runs_that_record_functions_are_also_paired_by_function(tmp_path):
    # the table of compilers/score.py's clustered test: after A [0, 0, 0, 0, 1, 1], B [1, 1, 0, 0, 1, 0], functions
    # f f g g h h -> +1/6, half-width 1.96 * sqrt(7/36) by function, 1.96 * sqrt(102/1080) by task
    functions = list("ffgghh")
    a = _run(tmp_path / "a", [(0, x) for x in (0, 0, 0, 0, 1, 1)], functions)
    b = _run(tmp_path / "b", [(0, x) for x in (1, 1, 0, 0, 1, 0)], functions)
    result = paired_runs.main([str(a), str(b)])
    by_function, by_task = result["after_b_minus_a_by_function"], result["after_b_minus_a"]
    assert by_function["difference"] == pytest.approx(1 / 6) and by_function["clusters"] == 3
    assert by_function["interval"][1] - 1 / 6 == pytest.approx(1.96 * (7 / 36) ** 0.5)
    assert by_task["interval"][1] - 1 / 6 == pytest.approx(1.96 * (102 / 1080) ** 0.5)
    c = _run(tmp_path / "c", [(0, 0)] * 6, list("ffgghx"))
    with pytest.raises(SystemExit, match="different functions"):
        paired_runs.main([str(a), str(c)])


def test_runs_of_different_task_lists_or_without_results_are_refused(tmp_path):
    a = _run(tmp_path / "a", [(0, 1), (0, 1)])
    b = _run(tmp_path / "b", [(0, 1)])
    with pytest.raises(SystemExit, match="different held-out tasks"):
        paired_runs.main([str(a), str(b)])
    with pytest.raises(SystemExit, match="tasks.jsonl"):
        paired_runs.main([str(a), str(tmp_path)])
