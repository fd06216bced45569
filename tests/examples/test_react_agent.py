"""examples/react_agent.py (the ReAct agent with calculator tools): baseline, compile, held-out accuracy, the share
of real tool calls, and resume, on the tiny model with the example's own code and flags (shrunk budgets)."""

from __future__ import annotations

import json

import pytest

FLAGS = ["--model", "tiny", "--steps", "1", "--max-tokens", "48", "--n-test", "4", "--run-name", "t",
         "--set", "examples_per_step=1", "--set", "group_size=2", "--set", "eval_every=0"]


def test_the_react_agent_example_runs_end_to_end_and_resumes_on_the_tiny_model(load_example, tiny_handle, tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    react = load_example("react_agent")
    react.main(FLAGS)
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["tool_calls"] >= 4  # at least one step per held-out question
    assert summary["real_tool_calls"] == summary["tool_calls"]  # the tools' grammar: even a random model names one
    assert summary["gain"] == pytest.approx(summary["compiled"] - summary["baseline"])
    steps = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1]

    # a killed run continues from its checkpoint: the finished step is not trained again, the baseline not evaluated
    (tmp_path / "runs" / "t" / "summary.json").unlink()
    recorded = {"accuracy": 0.5, "interval": [0.1, 0.9]}  # not what the tiny model scores: proof that it was read
    (tmp_path / "runs" / "t" / "baseline.json").write_text(json.dumps(recorded))
    react.main([*FLAGS, "--resume"])
    assert json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())["baseline"] == 0.5
    again = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again if r["kind"] == "step"] == [1]
    assert any(r["kind"] == "resume" for r in again)
    assert (tmp_path / "runs" / "t" / "summary.json").is_file()


def test_a_react_run_killed_before_its_first_checkpoint_resumes_from_the_start(load_example, tiny_handle, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    react = load_example("react_agent")
    react.main([*FLAGS, "--resume"])  # nothing recorded yet: the baseline is measured, the compile starts fresh
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["baseline"] == json.loads((tmp_path / "runs" / "t" / "baseline.json").read_text())["accuracy"]
