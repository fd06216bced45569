"""The remedy table (issue 46): where the base program is weak, what each remedy for missing signal does alone and
all together, every arm stopped at the same rollout-token budget. Per arm, ``benchmarks/suite.py``'s run of one task
(default multistep) with ``MMGRPO(metric)``, the arm's settings, ``max_rollout_tokens=--tokens`` and
``steps=--max-steps``: the budget or the step cap ends a run, whichever comes first (an arm whose outputs get short
can reach the cap under budget; the table's rollout tokens and signal steps / steps columns show which did).

    python -m benchmarks.remedies --task multistep --seeds 0 --tokens 20000 --out runs/remedies/   # run, then table
    python -m benchmarks.remedies --table --out runs/remedies/                                      # the table alone
    python -m benchmarks.remedies --model tiny --limit 3 --tokens 200 --arms none,warm --out /tmp/r   # smoke

Each arm's rows live in ``OUT/<arm>/`` as the suite writes them (a rerun skips finished rows; a killed compile
resumes). The base program's figures do not depend on the arm: the first arm to measure them shares its
``<task>-base.json`` with the others before they run.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from benchmarks import suite
from compilers.runs import records
from compilers.suite_report import remedy_figures, remedy_table

# arm -> its settings on top of the default recipe. The probe and the warm start sample every training example once
# (their tokens count in the budget); the curriculum opens the pool easiest first by the probe's pass rates.
ARMS: dict[str, dict[str, Any]] = {
    "none": {},
    "dynamic": {"dynamic_sampling": True},
    "adaptive": {"adaptive_rollouts": True},
    "warm": {"warm_start_runs": 1},
    "curriculum": {"pass_rate_probe": 1, "curriculum_steps": 10},
    "together": {"dynamic_sampling": True, "adaptive_rollouts": True, "warm_start_runs": 1, "pass_rate_probe": 1,
                 "curriculum_steps": 10},
}


def settings(arm: str) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in ARMS[arm].items()) or "default"


def share_base(out: Path, task: str, arm: str) -> None:
    """Copy a base measurement another arm made into ``arm``'s folder (the suite rechecks its key before use)."""
    target = out / arm / f"{task}-base.json"
    measured = sorted(out.glob(f"*/{task}-base.json"))
    if measured and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(measured[0], target)


def run_arm(args: argparse.Namespace, arm: str) -> None:
    share_base(args.out, args.task, arm)
    sets = [f"max_rollout_tokens={args.tokens}", f"steps={args.max_steps}"]
    sets += [f"{k}={json.dumps(v)}" for k, v in ARMS[arm].items()]
    argv = ["--tasks", args.task, "--seeds", args.seeds, "--out", str(args.out / arm), "--model", args.model,
            *[x for s in sets for x in ("--set", s)]]
    if args.limit is not None:
        argv += ["--limit", str(args.limit), "--k", "2", "--passk-examples", "2"]
    suite.main(argv)


def table(out: Path, task: str, arms: list[str]) -> str:
    figures = {}
    for arm in arms:
        rows = [r for r in suite.read_rows(out / arm) if r["task"] == task and "compiled" in r]
        figs = [remedy_figures(r, records(out / arm / f"{task}-seed{r['seed']}")) for r in rows]
        figures[arm] = (settings(arm), figs)
    text = remedy_table(figures)
    (out / f"{task}-table.md").write_text(text + "\n")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="multistep", help="a suite task (compilers.presets.suite) [multistep]")
    ap.add_argument("--seeds", default="0", help="compile seeds, comma-separated [0]")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated from {','.join(ARMS)} [all]")
    ap.add_argument("--tokens", type=int, default=20000, help="every arm's rollout-token budget [20000]")
    ap.add_argument("--max-steps", type=int, default=60,
                    help="every arm's step cap [60]")
    ap.add_argument("--out", type=Path, default=Path("runs/remedies"), help="the arms' folder [runs/remedies]")
    ap.add_argument("--model", default="smollm2-135m", help="the base model (smoke runs: tiny)")
    ap.add_argument("--limit", type=int, default=None,
                    help="the first N examples of each split, and pass@2 on 2 of them (smoke runs)")
    ap.add_argument("--table", action="store_true", help="print the table from the rows in --out, run nothing")
    args = ap.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {unknown}: choose from {', '.join(ARMS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table:
        for arm in args.arms:
            run_arm(args, arm)
    print(table(args.out, args.task, args.arms))


if __name__ == "__main__":
    main()
