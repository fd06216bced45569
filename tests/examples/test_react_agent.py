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

    # a killed run continues from its checkpoint: the finished step is not trained again
    (tmp_path / "runs" / "t" / "summary.json").unlink()
    react.main([*FLAGS, "--resume"])
    again = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again if r["kind"] == "step"] == [1]
    assert any(r["kind"] == "resume" for r in again)
    assert (tmp_path / "runs" / "t" / "summary.json").is_file()
