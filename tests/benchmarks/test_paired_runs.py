"""benchmarks/paired_runs.py: two runs' held-out results paired task by task (a hand-worked table)."""

from __future__ import annotations

import json

import pytest

from benchmarks import paired_runs


def _run(path, rows):
    path.mkdir()
    (path / "tasks.jsonl").write_text("".join(json.dumps({"task": i, "before": b, "after": a}) + "\n"
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


def test_runs_of_different_task_lists_or_without_results_are_refused(tmp_path):
    a = _run(tmp_path / "a", [(0, 1), (0, 1)])
    b = _run(tmp_path / "b", [(0, 1)])
    with pytest.raises(SystemExit, match="different held-out tasks"):
        paired_runs.main([str(a), str(b)])
    with pytest.raises(SystemExit, match="tasks.jsonl"):
        paired_runs.main([str(a), str(tmp_path)])
