"""The GPU scripts run their whole path on the CPU with the tiny model (no test needs a GPU)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_trains_on_the_requested_device(tiny_handle, tmp_path):
    out = tmp_path / "check.json"
    report = _module("gpu_check").main(["--model", "tiny", "--device", "cpu", "--steps", "1", "--examples-per-step",
                                        "2", "--group-size", "2", "--max-tokens", "8", "--out", str(out)])
    assert report["ok"] and report["parameter_devices"] == ["cpu"] and report["lora_tensors_changed"] > 0
    assert report["base_tensors"] == report["base_tensors_unchanged"] > 0
    assert json.loads(out.read_text())["steps"][0]["completion_tokens"] > 0


def test_gpu_matrix_rejects_a_bad_override_before_loading_anything(capsys):
    # the --set parser itself: tests/wfc/test_flags.py
    with pytest.raises(SystemExit):
        _module("gpu_matrix").main(["--model", "/nowhere", "--set", "steps"])
    assert "--set expects FIELD=VALUE" in capsys.readouterr().err
