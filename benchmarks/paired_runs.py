"""Two runs' held-out results paired task by task: ``python benchmarks/paired_runs.py RUN_A RUN_B``.

Each run folder holds ``tasks.jsonl`` (``examples/code_workflow.py`` writes it: one line per held-out task, in the
task split's order, with its ``before`` and ``after`` score). Prints, as JSON, B's compiled program against A's
(``after`` - ``after``) and their uncompiled programs (``before`` - ``before``), each the mean difference with its
~95% interval and how many tasks only one of them solved; refuses runs of different task lists. Runs that record
each task's function (``function``; code_workflow.py writes it) also get ``after_b_minus_a_by_function``: the same
difference with its interval clustered by function (``compilers.score.paired_difference(clusters=...)``), the honest
one when a model passes or fails every task of a function together.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from compilers.score import paired_difference


def read_tasks(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "tasks.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} not found: pass a run folder of examples/code_workflow.py (it writes tasks.jsonl)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def paired_runs(run_a: Path, run_b: Path) -> dict:
    a, b = read_tasks(run_a), read_tasks(run_b)
    if [t["task"] for t in a] != [t["task"] for t in b]:
        raise SystemExit(f"{run_a} and {run_b} scored different held-out tasks ({len(a)} and {len(b)}): pair only "
                         "runs of the same split (--n-test)")
    after_a, after_b = [t["after"] for t in a], [t["after"] for t in b]
    result = {"a": str(run_a), "b": str(run_b), "n": len(a), "after_b_minus_a": paired_difference(after_a, after_b),
              "before_b_minus_a": paired_difference([t["before"] for t in a], [t["before"] for t in b])}
    functions = [t.get("function") for t in a]
    if None not in functions:
        if functions != [t.get("function") for t in b]:
            raise SystemExit(f"{run_a} and {run_b} name different functions for the same tasks: pair only runs of "
                             "the same split")
        # tasks asking for one function pass or fail together: the interval counts functions, not tasks, as draws
        result["after_b_minus_a_by_function"] = paired_difference(after_a, after_b, clusters=functions)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    args = ap.parse_args(argv)
    result = paired_runs(args.run_a, args.run_b)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
