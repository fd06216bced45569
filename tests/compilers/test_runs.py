"""compilers.runs: a finished run directory read back; the rollout tokens it spent are its last step's running total,
or its demo bootstrapping's when it trained no step."""

from __future__ import annotations

import json

import pytest

from compilers.runs import records, rollout_tokens


def _run(path, *lines):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + "\n")
    return path


def test_the_tokens_are_the_last_steps_running_total(tmp_path):
    run = _run(tmp_path / "run", {"kind": "plan"}, {"kind": "demos", "completion_tokens": 7},
               {"kind": "step", "step": 1, "drawing": {"completion_tokens_total": 100}}, {"kind": "eval", "step": 1},
               {"kind": "step", "step": 2, "drawing": {"completion_tokens_total": 230}})
    assert rollout_tokens(run) == 230  # the running total already holds the bootstrapping's
    assert [r["kind"] for r in records(run)] == ["plan", "demos", "step", "eval", "step"]  # blank lines skipped


def test_a_run_without_steps_spent_what_its_demos_did(tmp_path):
    run = _run(tmp_path / "run", {"kind": "demos", "completion_tokens": 7}, {"kind": "demos", "completion_tokens": 5},
               {"kind": "eval", "step": 0})
    assert rollout_tokens(run) == 12
    assert rollout_tokens(_run(tmp_path / "empty", {"kind": "plan"})) == 0
    with pytest.raises(FileNotFoundError):
        rollout_tokens(tmp_path / "missing")
