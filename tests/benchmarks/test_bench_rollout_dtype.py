"""benchmarks/bench_rollout_dtype.py runs end to end on the tiny model (fp32 and bf16 engines) and writes figures."""

from __future__ import annotations

import json

from benchmarks import bench_rollout_dtype


def test_bench_rollout_dtype_on_tiny(tmp_path):
    out = tmp_path / "dtype.json"
    bench_rollout_dtype.main(["--model", "tiny", "--problems", "2", "--copies", "3", "--repeats", "1",
                              "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["rows"] == 6
    for dtype in ("float32", "bfloat16"):
        assert set(result[dtype]) == {"base", "lora"} and all(v > 0 for v in result[dtype].values())
    assert set(result["speedup"]) == {"base", "lora"}
