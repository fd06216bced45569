"""benchmarks/vs_dspy.py on the tiny model: every arm writes its row (accuracy with an interval, LM calls and tokens
from the engine's counters, or the optimizer's error), a rerun skips finished arms, BetterTogether picks the prompt
arm best on validation and ends in a CompiledProgram."""

from __future__ import annotations

import json

import dspy
import pytest

from benchmarks import vs_dspy
from compilers.presets.suite import TASKS, Person


def test_arms_write_rows_and_a_rerun_skips_them(tmp_path, capsys):
    out = tmp_path / "seed0.json"
    args = ["--model", "tiny", "--limit", "4", "--steps", "1", "--out", str(out)]
    vs_dspy.main([*args, "--arms", "uncompiled,labeled,finetune,mmgrpo,together"])
    rows = json.loads(out.read_text())
    assert list(rows) == ["uncompiled", "labeled", "finetune", "mmgrpo", "together"]
    for name in ("uncompiled", "labeled", "mmgrpo", "together"):
        row = rows[name]
        assert 0.0 <= row["accuracy"] <= 1.0 and row["interval"][0] <= row["accuracy"] <= row["interval"][1]
    assert rows["uncompiled"]["lm_calls"] == 0  # building it calls nothing; evaluation is not counted
    assert rows["mmgrpo"]["lm_calls"] > 0 and rows["mmgrpo"]["completion_tokens"] > 0
    assert rows["mmgrpo"]["adapters"] == ["shared"]
    assert rows["together"]["picked"] == "labeled" and rows["together"]["strategy"] in ("uncompiled", "p", "p -> w")
    assert rows["together"]["p_replayed"]  # the labeled arm's recorded program, not a second run
    # the random model passes nothing, so BootstrapFinetune has nothing to train on: said, not hidden (it trains in
    # tests/compilers/test_finetune.py)
    assert "no training data" in rows["finetune"]["error"]
    capsys.readouterr()
    vs_dspy.main([*args, "--arms", "uncompiled,finetune"])
    printed = capsys.readouterr().out
    assert "uncompiled: already in" in printed
    assert "finetune: its last try failed (" in printed  # an error row is tried again, and recorded again
    assert "no training data" in json.loads(out.read_text())["finetune"]["error"]


def test_bad_arms_are_refused_before_any_arm_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "seed0.json"
    with pytest.raises(SystemExit):
        vs_dspy.main(["--model", "tiny", "--out", str(out), "--arms", "uncompiled,miprov2"])
    assert "unknown arm(s) miprov2" in capsys.readouterr().err
    # an optimizer's optional package missing: said up front, not after the arms before it have run
    monkeypatch.setitem(vs_dspy.NEEDS, "mipro", ("wfc_no_such_package", "MIPROv2"))
    with pytest.raises(SystemExit):
        vs_dspy.main(["--model", "tiny", "--out", str(out), "--arms", "uncompiled,mipro"])
    assert "needs wfc_no_such_package" in capsys.readouterr().err
    assert not out.exists()  # nothing ran


def test_together_runs_a_named_prompt_arm_and_internalizes_its_demos(tmp_path):
    out = tmp_path / "seed0.json"
    vs_dspy.main(["--model", "tiny", "--limit", "4", "--steps", "1", "--out", str(out), "--arms", "together",
                  "--together-p", "labeled", "--together-demos", "internalize"])
    row = json.loads(out.read_text())["together"]
    assert "error" not in row, row
    assert row["picked"] == "labeled" and not row["p_replayed"] and row["student_demos"] == "internalize"
    assert row["strategy"] in ("uncompiled", "p", "p -> w")


def test_a_suite_task_runs_its_own_program_metric_and_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    vs_dspy.main(["--model", "tiny", "--task", "extract", "--limit", "4", "--steps", "1", "--seed", "3",
                  "--arms", "uncompiled,mmgrpo"])
    out = tmp_path / "runs" / "vs_dspy" / "extract-seed3.json"
    rows = json.loads(out.read_text())
    assert "error" not in rows["mmgrpo"], rows["mmgrpo"]
    assert (tmp_path / "runs" / "vs_dspy" / "extract-seed3-mmgrpo" / "metrics.jsonl").is_file()
    # the suite's settings (no recipe), not the demo's: the demo's recipe answers in 12 tokens
    assert vs_dspy.recipe("extract", 3, None) == {"seed": 3}
    assert vs_dspy.recipe("arithmetic", 0, None)["steps"] == 14 and vs_dspy.recipe("arithmetic", 0, 2)["steps"] == 2


def test_together_replays_the_prompt_arm_recorded_before_instead_of_running_it_again(tmp_path):
    out = tmp_path / "extract-seed0.json"
    args = ["--model", "tiny", "--task", "extract", "--limit", "4", "--steps", "1", "--out", str(out)]
    vs_dspy.main([*args, "--arms", "labeled"])
    recorded = json.loads((tmp_path / "extract-seed0-labeled-prompts.json").read_text())
    assert [len(r["demos"]) for r in recorded.values()] == [4]  # LabeledFewShot: the (limited) trainset
    vs_dspy.main([*args, "--arms", "together", "--together-demos", "drop"])
    row = json.loads(out.read_text())["together"]
    assert "error" not in row, row
    assert row["picked"] == "labeled" and row["p_replayed"] and row["lm_calls"] > 0  # the w step ran


def test_replay_revives_pydantic_demo_values_and_refuses_another_program(tmp_path):
    program = TASKS["extract"].program()
    [(role, pred)] = program.named_predictors()
    gold = dspy.Example(text="Ann Lee, 30, lives in Rome.", person=Person(name="Ann Lee", age=30, city="Rome"))
    pred.demos = [gold]
    vs_dspy.write_json(tmp_path / "state.json", vs_dspy.prompt_state(program))
    state = json.loads((tmp_path / "state.json").read_text())
    assert isinstance(next(iter(state.values()))["demos"][0]["person"], dict)  # recorded as JSON
    replayed = vs_dspy.Replay(state).compile(TASKS["extract"].program())
    [demo] = dict(replayed.named_predictors())[role].demos
    assert dict(demo.items()) == dict(gold.items())  # the model itself again, not its JSON
    with pytest.raises(ValueError, match="record it again"):
        vs_dspy.Replay(state).compile(TASKS["multistep"].program())


def test_two_processes_writing_one_out_keep_each_others_rows(tmp_path):
    out = tmp_path / "seed0.json"
    first = vs_dspy.Bench(0, out, None, model="tiny", limit=2)
    second = vs_dspy.Bench(0, out, None, model="tiny", limit=2)  # read the file before the first wrote to it
    first.run("uncompiled", first.arm("uncompiled"))
    second.run("labeled", second.arm("labeled"))
    assert list(json.loads(out.read_text())) == ["uncompiled", "labeled"]
