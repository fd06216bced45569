"""examples/demo.py (what `make demo` runs): one whole run, baseline -> compile -> held-out -> save -> load, goes
through on the tiny model with the demo's own code, environment and flags. Its preset (task, programs, metric) is
tested beside the library (tests/compilers/test_preset_arithmetic.py)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture()
def demo(load_example):
    return load_example('demo')


def test_contradicting_or_malformed_flags_are_refused(demo):
    for bad in (["--stop", "\\n", "--no-stop"], ["--set", "steps"]):
        with pytest.raises(SystemExit):
            demo.main(bad)


def test_the_demo_runs_end_to_end_on_the_tiny_model(demo, tiny_handle, tmp_path, monkeypatch):
    # tiny_handle builds the tiny model's files once per session; the demo then loads it by name. The recipe is shrunk
    # through the demo's own --set so the step takes seconds; everything else (300 held-out problems twice, the 100
    # validation problems, save and load) is the demo's path.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WFC_DEMO_MODEL", "tiny")
    monkeypatch.setenv("WFC_DEMO_STEPS", "1")
    monkeypatch.setenv("WFC_DEMO_OUT", str(tmp_path / "artifact"))
    monkeypatch.setenv("WFC_DEMO_RUN_DIR", str(tmp_path / "side-run"))
    monkeypatch.setenv("WFC_DEMO_RECIPE", "finish")
    demo.main(["--set", "examples_per_step=1", "--set", "group_size=2", "--set", "max_tokens=4",
               "--set", "eval_every=0", "--stop", "\\n"])

    assert not (tmp_path / "runs").exists()  # everything of the run went to WFC_DEMO_RUN_DIR
    assert (tmp_path / "side-run" / "metrics.jsonl").is_file()
    summary = json.loads((tmp_path / "side-run" / "summary.json").read_text())
    assert summary["recipe"] == "finish" and summary["stop"] == ["\n"] and summary["steps"] == 1
    assert summary["overrides"] == {"examples_per_step": 1, "group_size": 2, "max_tokens": 4, "eval_every": 0}
    assert 0.0 <= summary["baseline"] <= 1.0 and 0.0 <= summary["compiled"] <= 1.0
    assert summary["gain"] == pytest.approx(summary["compiled"] - summary["baseline"])
    manifest = json.loads((tmp_path / "artifact" / "manifest.json").read_text())
    assert manifest["base_model"] == "tiny"
    structure = json.loads((tmp_path / "artifact" / "program" / "structure.json").read_text())
    for role in ("voter", "aggregator"):  # the stop strings travel in the artifact
        assert structure["program"]["attrs"][role]["attrs"]["config"]["items"]["stop"]["items"] == ["\n"]
