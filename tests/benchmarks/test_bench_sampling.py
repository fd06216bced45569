"""benchmarks/bench_sampling.py runs end to end on the tiny model and writes its figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_sampling_on_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_sampling", ROOT / "benchmarks" / "bench_sampling.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "sampling.json"
    bench.main(["--model", "tiny", "--rows", "8", "--repeats", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["rows"] == 8 and result["vocab"] > 0
    assert set(result["step_ms"]) == {"multinomial", "inverse_cdf"} and result["batch_s"] > 0
