"""benchmarks/remedies.py on the tiny model: every arm runs the suite's task at the one token budget with its own
settings recorded, the base program is measured once and shared, and the table reads the arms back."""

from __future__ import annotations

import json

import pytest

from benchmarks import remedies, suite


def test_arms_share_the_budget_and_the_base(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WFC_DATA_DIR", raising=False)
    measured = []
    real = suite.sampled_passes
    monkeypatch.setattr(suite, "sampled_passes", lambda *a, **k: measured.append(1) or real(*a, **k))
    remedies.main(["--model", "tiny", "--limit", "3", "--tokens", "300", "--max-steps", "4",
                   "--arms", "none,warm,curriculum", "--out", str(tmp_path)])
    assert len(measured) == 1  # the first arm measured the base; the others were handed its figures
    for arm in ("none", "warm", "curriculum"):
        row = json.loads((tmp_path / arm / "multistep-seed0.json").read_text())
        assert row["set"] == {"max_rollout_tokens": 300, "steps": 4, **remedies.ARMS[arm]}
        assert row["config"]["max_rollout_tokens"] == 300
    kinds = {arm: [json.loads(line)["kind"] for line in (tmp_path / arm / "multistep-seed0" / "metrics.jsonl")
                   .read_text().splitlines()] for arm in ("none", "warm", "curriculum")}
    assert "warm_start" in kinds["warm"] and "probe" in kinds["curriculum"] and "probe" not in kinds["none"]
    out = capsys.readouterr().out
    table = out[out.index("| arm |"):]
    assert "| warm | warm_start_runs=1 | 1 |" in table and "| none | default | 1 |" in table
    assert (tmp_path / "multistep-table.md").read_text().strip() == table.strip()

    remedies.main(["--table", "--arms", "none,dynamic", "--out", str(tmp_path)])
    assert "| dynamic | dynamic_sampling=true | - | not run |" in capsys.readouterr().out


def test_unknown_arm_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        remedies.main(["--arms", "none,magic", "--out", str(tmp_path), "--table"])
