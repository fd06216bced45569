"""benchmarks/suite.py on the tiny model: each (task, seed) writes a row with the base and compiled held-out
accuracy and intervals, sampled pass@k, per-role rewards, minutes and rollout tokens; the base figures are measured
once per task; a rerun skips finished rows but reruns skipped ones; --table renders the rows alone."""

from __future__ import annotations

import json

import pytest

from benchmarks import suite


def test_rows_resume_and_table(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WFC_DATA_DIR", raising=False)
    args = ["--model", "tiny", "--limit", "3", "--steps", "1", "--k", "2", "--passk-examples", "2",
            "--out", str(tmp_path)]
    suite.main([*args, "--tasks", "classify,multistep,gsm8k", "--seeds", "0,1"])
    row = json.loads((tmp_path / "multistep-seed1.json").read_text())
    assert (row["task"], row["seed"], row["sizes"]) == ("multistep", 1, {"train": 3, "val": 3, "test": 3})
    for key in ("base", "compiled"):
        low, high = row[key]["interval"]
        assert low <= row[key]["accuracy"] <= high and row[key]["n"] == 3
    assert row["sampled"]["k"] == row["sampled"]["n"] == 2 and len(row["sampled"]["passes"]) == 2
    assert row["sampled"]["temperature"] == row["config"]["temperature"]  # the compile's own
    assert 0.0 <= row["sampled"]["pass@1"] <= row["sampled"]["pass@k"] <= 1.0
    assert row["gain"] == pytest.approx(row["compiled"]["accuracy"] - row["base"]["accuracy"])
    assert set(row["roles"]) == {"draft", "check"} and row["rollout_tokens"] > 0
    assert set(row["constant"]["labels"]) == {"answer"} and 0.0 <= row["constant"]["accuracy"] <= 1.0
    assert row["config"]["steps"] == 1 and row["config"]["seed"] == 1 and row["minutes"]["compile"] > 0
    base = json.loads((tmp_path / "multistep-base.json").read_text())
    assert base["figures"]["base"] == row["base"] == json.loads((tmp_path / "multistep-seed0.json").read_text())[
        "base"]  # measured once, shared by the seeds
    assert "skipped" in json.loads((tmp_path / "gsm8k-seed0.json").read_text())
    capsys.readouterr()

    suite.main([*args, "--tasks", "classify,gsm8k", "--seeds", "0"])
    out = capsys.readouterr().out
    assert "classify seed 0: already in" in out and "gsm8k seed 0: already in" not in out

    suite.main(["--table", "--out", str(tmp_path)])
    table = capsys.readouterr().out
    assert table.startswith("| task | program | base | pass@2 |") and "| classify |" in table
    assert "| multistep | 1 |" in table and "- gsm8k seed 0: skipped" in table
    assert (tmp_path / "table.md").read_text().strip() == table.strip()


def test_set_overrides_every_tasks_config_and_is_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("WFC_DATA_DIR", raising=False)
    suite.main(["--model", "tiny", "--limit", "3", "--steps", "1", "--k", "2", "--passk-examples", "2",
                "--out", str(tmp_path), "--tasks", "classify", "--seeds", "0", "--set", "auto_remedies=true"])
    row = json.loads((tmp_path / "classify-seed0.json").read_text())
    assert row["set"] == {"auto_remedies": True} and row["config"]["auto_remedies"] is True
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "classify-seed0" / "metrics.jsonl").read_text()
             .splitlines()]
    assert "remedies" in kinds  # the probe ran and its choice was logged
