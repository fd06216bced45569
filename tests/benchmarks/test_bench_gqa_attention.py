"""benchmarks/bench_gqa_attention.py runs end to end on the tiny model: both implementations generate the same
tokens and the kernels agree bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gqa_attention_on_tiny(capsys):
    spec = importlib.util.spec_from_file_location("bench_gqa_attention", ROOT / "benchmarks" / "bench_gqa_attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--model", "tiny", "--repeats", "1"])
    out = capsys.readouterr().out
    assert out.count("bit-identical True") == 3, out
    assert "same tokens: True" in out, out
