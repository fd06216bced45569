"""examples/cot_demo.py (the ChainOfThought demo): bootstrapped demos, then compile, held-out accuracy, artifact,
on the tiny model with the example's own code and flags (shrunk budgets)."""

from __future__ import annotations

import json

import pytest


def test_the_cot_demo_with_demos_runs_end_to_end_on_the_tiny_model(load_example, tiny_handle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cot = load_example("cot_demo")
    cot.main(["--model", "tiny", "--steps", "1", "--demos", "1", "--reasoning-tokens", "4", "--max-tokens", "24",
              "--run-name", "t", "--out", str(tmp_path / "artifact"),
              "--set", "examples_per_step=1", "--set", "group_size=2", "--set", "eval_every=0"])
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["bootstrap"]["runs"] == 64 * 4  # the bootstrap ran: 64 training examples x 4 runs
    assert summary["demos_only"] is None or 0.0 <= summary["demos_only"] <= 1.0  # None: no run passed
    assert summary["format_errors_after"] == 0  # under the signature's grammar even a random model parses
    assert summary["gain"] == pytest.approx(summary["compiled"] - summary["baseline"])
    assert (tmp_path / "artifact" / "manifest.json").is_file()

    # a killed run continues from its checkpoint: no new bootstrap, the demos come back with the program's state
    (tmp_path / "runs" / "t" / "summary.json").unlink()
    cot.main(["--model", "tiny", "--steps", "1", "--demos", "1", "--reasoning-tokens", "4", "--max-tokens", "24",
              "--run-name", "t", "--out", str(tmp_path / "artifact2"), "--resume", "--max-batch", "16",
              "--set", "examples_per_step=1", "--set", "group_size=2", "--set", "eval_every=0"])
    again = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert again["bootstrap"] == summary["bootstrap"]  # the first run's record, restored: no second bootstrap
    assert again["baseline"] == summary["baseline"]
    assert (again["demos_only"] is None) == (summary["demos_only"] is None)


def test_a_malformed_set_flag_is_refused(load_example):
    with pytest.raises(SystemExit):
        load_example("cot_demo").main(["--set", "steps"])
