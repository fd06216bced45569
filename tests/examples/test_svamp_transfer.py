"""examples/svamp_transfer.py: whole runs, train -> save -> SVAMP measurement, on the tiny model. Its training data
(generated problems only, easy before hard, validation disjoint) is tested beside the library
(tests/compilers/test_preset_svamp_transfer.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture()
def script(load_example):
    return load_example("svamp_transfer")


@pytest.fixture
def svamp_dir() -> Path:
    """WFC_DATA_DIR holding svamp/ (CI points it at ../shared/data); skip cleanly without it, as tests/tasks do."""
    value = os.environ.get("WFC_DATA_DIR")
    if not value:
        pytest.skip("WFC_DATA_DIR is not set (point it at a folder holding svamp/)")
    if not (Path(value) / "svamp").is_dir():
        pytest.skip(f"WFC_DATA_DIR={value} holds no svamp/ folder (point it at a folder holding svamp/)")
    return Path(value)


@pytest.mark.parametrize("calculator", [False, True])
def test_end_to_end_on_the_tiny_model_trains_saves_and_measures(script, calculator, svamp_dir, tiny_handle,
                                                                 tmp_path):
    # tiny_handle: the tiny model's files are built once per session before the script loads them by name.
    # The recipe shrunk so one step is a few seconds on the tiny model; the path is the real one.
    n, out, run_dir = 5, tmp_path / "artifact", tmp_path / "run"
    flags = ["--calculator"] if calculator else []
    script.main(["--model", "tiny", "--steps", "1", "--n", str(n), "--out", str(out), "--run-dir", str(run_dir),
                 "--set", "examples_per_step=2", "--set", "group_size=2", "--set", "max_tokens=4", "--stop", "\\n",
                 *flags])

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["base_model"] == "tiny"
    assert (out / "adapters").is_dir()
    structure = json.loads((out / "program" / "structure.json").read_text())
    for role in ("voter", "aggregator"):  # --stop: every role's saved config stops at the newline
        config = structure["program"]["attrs"][role]["attrs"]["config"]["items"]
        assert config["stop"]["items"] == ["\n"]
        cls = structure["program"]["attrs"][role]["class"]
        assert cls == ("programs.calculator:Calculate" if calculator else "dspy.predict.predict:Predict"), cls
    steps = [r for r in manifest["history"] if r["kind"] == "step"]
    # The random model's groups are mostly flat, which dynamic sampling keeps out of training; what the step drew and
    # generated is the proof it ran.
    assert [r["step"] for r in steps] == [1]
    assert steps[0]["drawing"]["examples_drawn"] >= 2 and steps[0]["drawing"]["completion_tokens"] > 0
    assert [r["step"] for r in manifest["history"] if r["kind"] == "eval"] == [0, 1]  # before and after training

    result = json.loads((run_dir / "transfer.json").read_text())
    assert result["artifact"] == str(out) and result["n"] == n
    for key in ("uncompiled", "compiled"):
        assert 0.0 <= result[key] <= 1.0 and len(result[f"{key}_interval"]) == 2
    assert result["difference"] == pytest.approx(result["compiled"] - result["uncompiled"])
    assert result["only_compiled"] + result["only_uncompiled"] <= n
    assert result["calculator"] is calculator
    assert result["steps"] == 1 and result["best_step"] == manifest["best_step"] in (0, 1)
    assert 0 < result["train_seconds"] <= result["total_seconds"]


def test_single_role_rival_stops_at_the_token_budget(script, svamp_dir, tiny_handle, tmp_path):
    # --program single: the one-role rival, stopped by --set max_rollout_tokens (not by --steps), with the calculator
    n, out, run_dir = 3, tmp_path / "artifact", tmp_path / "run"
    script.main(["--model", "tiny", "--program", "single", "--calculator", "--steps", "50", "--n", str(n),
                 "--out", str(out), "--run-dir", str(run_dir), "--set", "examples_per_step=2", "--set", "group_size=2",
                 "--set", "max_tokens=4", "--set", "max_rollout_tokens=40", "--set", "eval_every=100"])

    structure = json.loads((out / "program" / "structure.json").read_text())
    assert set(structure["program"]["attrs"]) >= {"solver"}
    assert structure["program"]["attrs"]["solver"]["class"] == "programs.calculator:Calculate"
    manifest = json.loads((out / "manifest.json").read_text())
    steps = [r for r in manifest["history"] if r["kind"] == "step"]
    assert 1 <= len(steps) < 50  # the budget ended it
    result = json.loads((run_dir / "transfer.json").read_text())
    assert result["program"] == "single" and result["calculator"] is True
    spent = steps[-1]["drawing"]["completion_tokens_total"]
    assert result["rollout_tokens"] == spent >= 40
    assert sum(r["drawing"]["completion_tokens"] for r in steps[:-1]) < 40  # it stopped at the first step past it
