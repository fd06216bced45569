"""Reading a finished run directory back (what ``compile(..., run_dir=...)`` wrote): its ``metrics.jsonl`` records
(``compilers.runlog``) and what they add up to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records in order. ``FileNotFoundError`` when the run wrote none."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def rollout_tokens(run_dir: str | Path) -> int:
    """Completion tokens the run spent drawing rollouts: the running total of its last step record, or, for a run
    with no step (prompt optimization alone), the tokens its demo bootstrapping spent. The figure that
    ``max_rollout_tokens`` budgets, so two runs compare at an equal budget by it."""
    log = records(run_dir)
    steps = [r for r in log if r["kind"] == "step"]
    if steps:
        return steps[-1]["drawing"]["completion_tokens_total"]
    return sum(r.get("completion_tokens", 0) for r in log if r["kind"] == "demos")
