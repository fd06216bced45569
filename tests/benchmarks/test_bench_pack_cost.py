"""benchmarks/bench_pack_cost.py runs end to end on the tiny model: a fit line, and the aggregator step packed four
ways over the same rows (the quadratic cost never merges more than the linear one)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pack_cost_on_tiny(capsys):
    spec = importlib.util.spec_from_file_location("bench_pack_cost", ROOT / "benchmarks" / "bench_pack_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--model", "tiny", "--examples", "4", "--repeats", "1", "--tokens", "512"])
    out = capsys.readouterr().out
    assert "fit: time ~" in out, out
    rows = {m.group(1).strip(): (int(m.group(2)), int(m.group(3).replace(",", "")))
            for m in re.finditer(r"^(.+?)\s*: *(\d+) rows, longest +\d+, +([\d,]+) tokens", out, re.M)}
    assert len(rows) == 4, out
    assert rows["apart"][0] == 8  # 4 problems x 2 distinct candidate lists
    assert rows["merged, linear cost (before)"][0] <= rows["merged, quadratic cost"][0] <= rows["apart"][0]
    assert rows["apart"][1] > rows["merged, linear cost (before)"][1]  # the shared system turn counted once
