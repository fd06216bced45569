"""The run log: one file per run, an earlier run's records kept beside it."""

import json

from compilers.runlog import RunLog


def _kinds(path):
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


def test_a_fresh_run_moves_the_earlier_log_aside_and_a_continued_one_appends(tmp_path):
    first = RunLog(tmp_path)
    first.append({"kind": "plan"})
    first.append({"kind": "step", "step": 1})
    again = RunLog(tmp_path, fresh=True)
    again.append({"kind": "plan"})
    assert _kinds(tmp_path / "metrics.jsonl") == ["plan"]
    assert _kinds(tmp_path / "metrics.previous.jsonl") == ["plan", "step"]
    RunLog(tmp_path).append({"kind": "resume"})  # not fresh: the same run goes on
    assert _kinds(tmp_path / "metrics.jsonl") == ["plan", "resume"]


def test_a_rank_that_does_not_write_touches_no_file(tmp_path):
    log = RunLog(tmp_path / "run", write=False, fresh=True)
    log.append({"kind": "plan"})
    assert log.records == [{"kind": "plan"}] and not (tmp_path / "run").exists()
