"""benchmarks/learning.py: the arms compare like with like (one recipe, one set of overrides, one set of stop strings
for every arm; a reused demo run made otherwise is refused), and an arm runs end to end on the tiny model."""

from __future__ import annotations

import json

import pytest

from benchmarks import learning


def _demo_run(runs, seed: int, **fields) -> None:
    run = runs / f"demo-seed{seed}"
    run.mkdir(parents=True)
    summary = {"seed": seed, "steps": 10, "recipe": "fast", "overrides": {}, "stop": [], "baseline": 0.1,
               "compiled": 0.4, "compiled_interval": [0.3, 0.5], "seconds": 600.0, **fields}
    (run / "summary.json").write_text(json.dumps(summary))
    step = {"kind": "step", "step": 10, "drawing": {"completion_tokens_total": 1234}}
    (run / "metrics.jsonl").write_text(json.dumps(step) + "\n")


def test_a_reused_demo_run_must_match_the_comparison(tmp_path):
    runs = tmp_path / "runs"
    _demo_run(runs, 0, overrides={"max_tokens": 20}, stop=["\n"])
    row = learning.from_demo(0, recipe="fast", overrides={"max_tokens": 20}, stop=("\n",), runs=runs)
    assert (row["accuracy"], row["tokens"], row["baseline"]) == (0.4, 1234, 0.1)
    with pytest.raises(SystemExit, match="stop"):
        learning.from_demo(0, recipe="fast", overrides={"max_tokens": 20}, stop=(), runs=runs)
    with pytest.raises(SystemExit, match="overrides"):
        learning.from_demo(0, recipe="fast", overrides={}, stop=("\n",), runs=runs)
    with pytest.raises(SystemExit, match="concise"):
        learning.from_demo(0, recipe="concise", overrides={"max_tokens": 20}, stop=("\n",), runs=runs)
    with pytest.raises(SystemExit, match="WFC_DEMO_SEED=1"):
        learning.from_demo(1, recipe="fast", overrides={}, stop=(), runs=runs)


def test_the_command_line_checks_the_reused_run_against_its_own_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("WFC_DEMO_RECIPE", "fast")  # the recipe the demo run was made with
    runs, out = tmp_path / "runs", tmp_path / "out"
    _demo_run(runs, 0, stop=["\n"])
    with pytest.raises(SystemExit, match="stop"):
        learning.main(["--seeds", "0", "--arms", "workflow", "--reuse-demo", "--demo-runs", str(runs),
                       "--out", str(out), "--stop", "."])
    learning.main(["--seeds", "0", "--arms", "workflow", "--reuse-demo", "--demo-runs", str(runs), "--out", str(out),
                   "--stop", "\\n"])
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["arm"] == "workflow" and row["accuracy"] == 0.4
    assert "workflow" in (out / "results.md").read_text()


@pytest.mark.parametrize("arm,roles", [("single", {"solver"}), ("prompt", {"voter", "aggregator"})])
def test_every_role_of_an_arm_stops_at_the_given_strings(arm, roles):
    program = learning.arm_program(arm, ("\n",))
    assert {name for name, _ in program.named_predictors()} == roles
    assert all(p.config.get("stop") == ("\n",) for _, p in program.named_predictors())
    assert all("stop" not in p.config for _, p in learning.arm_program(arm).named_predictors())


def test_the_single_arm_trains_and_measures_on_the_tiny_model(tiny_handle, tmp_path):
    # tiny_handle builds the tiny model's files once per session; the arm then loads it by name, as it would the
    # embedded model. The recipe is shrunk so the step takes seconds; evaluation is the arm's own (300 + 300 calls).
    row = learning.run_arm("single", 0, 1, 40, tmp_path, model="tiny", stop=("\n",),
                           overrides={"examples_per_step": 1, "group_size": 2, "max_tokens": 4, "eval_every": 0})
    assert row["arm"] == "single" and 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["baseline"] <= 1.0
    assert row["steps"] >= 1 and row["tokens"] > 0
    records = [json.loads(line) for line in (tmp_path / "single-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "step" for r in records)
