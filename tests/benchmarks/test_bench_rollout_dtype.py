"""benchmarks/bench_rollout_dtype.py runs end to end on the tiny model (fp32 and bf16 engines) and writes figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_rollout_dtype_on_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_rollout_dtype", ROOT / "benchmarks" / "bench_rollout_dtype.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "dtype.json"
    bench.main(["--model", "tiny", "--problems", "2", "--copies", "3", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["rows"] == 6
    for dtype in ("float32", "bfloat16"):
        assert set(result[dtype]) == {"base", "lora"} and all(v > 0 for v in result[dtype].values())
    assert set(result["speedup"]) == {"base", "lora"}
