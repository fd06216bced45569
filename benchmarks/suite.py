"""The suite (issue 46): does ``MMGRPO(metric)`` with the default recipe help programs and tasks it was never tuned
for? Per (task, seed) of ``compilers.presets.suite``: compile the task's program with ``MMGRPO(metric, seed=S)`` and
no per-task flags, then measure on the held-out test split: the base program's and the compiled program's greedy
accuracy with 95% intervals, the base program's sampled pass@1 and pass@k (``compilers.passk``, at the compile's
temperature and token limit), per-role mean call rewards over training (``compilers.suite_report``), compile
minutes and rollout tokens.

    python benchmarks/suite.py --seeds 0,1,2 --tasks all --out runs/suite/     # run, then print the table
    python benchmarks/suite.py --table --out runs/suite/                         # the table from the rows alone
    python benchmarks/suite.py --tasks multistep --set auto_remedies=true --out runs/suite-auto/   # a remedy
    python benchmarks/suite.py --tasks classify,extract --model tiny --limit 8 --steps 1 --out /tmp/s   # smoke

Rows: ``OUT/<task>-seed<S>.json``, each written atomically when its run finishes; a rerun skips rows already
there (but reruns skipped and failed ones), and a compile killed midway resumes from its checkpoint in
``OUT/<task>-seed<S>/``. The base program's figures do not depend on the compile seed: they are measured once per
task (``OUT/<task>-base.json``) and copied into each seed's row, as long as the budgets they were measured at are
the compile's. ``--table`` also writes ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any

from compilers import MMGRPO, evaluate
from compilers.baselines import constant_answer
from compilers.checkpoint import data_fingerprint, find as find_checkpoint
from compilers.passk import mean_pass_at_k, sampled_passes
from compilers.presets.suite import TASKS, DataMissing, Splits, SuiteTask, task_names
from compilers.recipes import get_recipe
from compilers.runs import records, rollout_tokens
from compilers.suite_report import markdown_table, role_pass_rates
from wfc.flags import add_set_flag, apply_overrides, parse_set
from wfc.engines.hf import HFEngine


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_rows(out: Path) -> list[dict[str, Any]]:
    """Every row under ``out``, in the suite's task order, then by seed."""
    rows = [json.loads(p.read_text()) for p in out.glob("*-seed*.json")]
    order = {name: i for i, name in enumerate(TASKS)}
    return sorted(rows, key=lambda r: (order.get(r["task"], len(order)), r["task"], r["seed"]))


def finished(path: Path) -> bool:
    return path.exists() and not {"skipped", "error"} & set(json.loads(path.read_text()))


def program_fingerprint(program) -> str:
    """sha256 of the program's role paths and their signatures (instructions, fields, types)."""
    roles = {path: str(p.signature) for path, p in program.named_predictors()}
    return hashlib.sha256(json.dumps(roles, sort_keys=True).encode()).hexdigest()


def held_out(program, examples, engine, metric, adapters, max_tokens: int) -> dict[str, Any]:
    result = evaluate(program, examples, engine, metric=metric, adapters=adapters, max_tokens=max_tokens)
    return {k: result[k] for k in ("accuracy", "n", "format_error_rate", "crash_rate")} | {
        "interval": list(result["interval"])}


class Suite:
    """The runs of one invocation: its model, recipe, limits and pass@k settings, and the rows folder."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, args.out
        self.overrides = apply_overrides(get_recipe(args.recipe) if args.recipe else {}, parse_set(args.set))
        if args.steps is not None:
            self.overrides["steps"] = args.steps

    def run(self, name: str, seed: int) -> None:
        path = self.out / f"{name}-seed{seed}.json"
        if finished(path):
            print(f"{name} seed {seed}: already in {path}, skipped")
            return
        task = TASKS[name]
        try:
            row = self.measure(task, seed, task.splits().head(self.args.limit))
        except DataMissing as exc:
            row = {"task": name, "seed": seed, "skipped": str(exc)}
        except Exception as exc:  # a failed row is a result too: recorded, and rerun next time
            traceback.print_exc()
            row = {"task": name, "seed": seed, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        write_json(path, row)
        print(f"{name} seed {seed}: " + json.dumps({k: row.get(k) for k in ("gain", "skipped", "error")}))

    def measure(self, task: SuiteTask, seed: int, splits: Splits) -> dict[str, Any]:
        engine = HFEngine(self.args.model)
        try:
            run_dir = self.out / f"{task.name}-seed{seed}"
            resume = run_dir if find_checkpoint(run_dir) is not None else None  # minutes: the resumed part only
            t0 = time.time()
            compiled = MMGRPO(task.metric, **{**self.overrides, "seed": seed}).compile(
                task.program(), trainset=splits.train, valset=splits.val, engine=engine, run_dir=run_dir,
                resume=resume)
            minutes = (time.time() - t0) / 60
            base = self.base(task, splits, engine, compiled.manifest)
            after = held_out(compiled.program, splits.test, engine, task.metric, compiled.roles,
                             compiled.manifest.sampling["max_tokens"])
            log = records(run_dir)
            return {"task": task.name, "seed": seed, "model": self.args.model, "recipe": self.args.recipe,
                    "set": parse_set(self.args.set),
                    "shape": task.shape, "data": task.data, "sizes": splits.sizes(), **base, "compiled": after,
                    "gain": after["accuracy"] - base["base"]["accuracy"], "roles": role_pass_rates(log),
                    "constant": constant_answer(splits.train, splits.test, task.metric),
                    "starved_steps": sum(bool(r.get("starvation", {}).get("starved")) for r in log
                                         if r["kind"] == "step"),
                    "best_step": compiled.manifest.best_step, "resumed": resume is not None,
                    "rollout_tokens": rollout_tokens(run_dir),
                    "minutes": {"compile": round(minutes, 2), "total": round((time.time() - t0) / 60, 2)},
                    "config": compiled.manifest.config}
        finally:
            engine.close()

    def base(self, task: SuiteTask, splits: Splits, engine, manifest) -> dict[str, Any]:
        """The base program's greedy accuracy and sampled pass@k at the compile's budgets (``manifest``: the
        compiled artifact's), read from ``<task>-base.json`` when measured with the same ones, else measured
        (sampling seed 0) and written there."""
        a, config = self.args, manifest.config
        key = {"model": a.model, "program": program_fingerprint(task.program()), "data": data_fingerprint(splits.test),
               "decoding": manifest.decoding, "eval_max_tokens": manifest.sampling["max_tokens"],
               "temperature": config["temperature"], "max_tokens": config["max_tokens"], "k": a.k, "n": a.samples,
               "examples": min(a.passk_examples, len(splits.test))}
        path = self.out / f"{task.name}-base.json"
        if path.exists() and json.loads(path.read_text())["key"] == key:
            return json.loads(path.read_text())["figures"]
        greedy = held_out(task.program(), splits.test, engine, task.metric, {}, key["eval_max_tokens"])
        passes = sampled_passes(task.program(), splits.test[:key["examples"]], engine, metric=task.metric,
                                n=a.samples, temperature=key["temperature"], max_tokens=key["max_tokens"], seed=0)
        sampled = {k: key[k] for k in ("k", "n", "examples", "temperature", "max_tokens")} | {
            "pass@1": mean_pass_at_k(passes, a.samples, 1), "pass@k": mean_pass_at_k(passes, a.samples, a.k),
            "passes": passes}
        figures = {"base": greedy, "sampled": sampled}
        write_json(path, {"key": key, "figures": figures})
        return figures


def table(out: Path) -> str:
    text = markdown_table(read_rows(out), tasks=list(TASKS))
    (out / "table.md").write_text(text + "\n")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="compile seeds, comma-separated [0,1,2]")
    ap.add_argument("--tasks", default="all", help=f"'all' or comma-separated from {','.join(TASKS)} [all]")
    ap.add_argument("--out", type=Path, default=Path("runs/suite"), help="the rows' folder [runs/suite]")
    ap.add_argument("--recipe", default=None, help="a compilers.recipes name for every task (default: none, the "
                                                   "default recipe)")
    add_set_flag(ap, what="config field for every task (e.g. --set auto_remedies=true --out runs/suite-auto)")
    ap.add_argument("--model", default="smollm2-135m", help="the base model (smoke runs: tiny)")
    ap.add_argument("--limit", type=int, default=None, help="the first N examples of each split (smoke runs)")
    ap.add_argument("--steps", type=int, default=None, help="override the compile's steps (smoke runs only)")
    ap.add_argument("--k", type=int, default=16, help="pass@k's k [16]")
    ap.add_argument("--samples", type=int, default=None, help="sampled runs per example for pass@k [k]")
    ap.add_argument("--passk-examples", type=int, default=50, help="test examples pass@k samples [50]")
    ap.add_argument("--table", action="store_true", help="print the table from the rows in --out, run nothing")
    args = ap.parse_args(argv)
    args.samples = args.samples or args.k
    if not 1 <= args.k <= args.samples:
        ap.error(f"need 1 <= --k <= --samples, got k={args.k}, samples={args.samples}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table:
        logging.getLogger("dspy").setLevel(logging.WARNING)
        suite = Suite(args)
        for name in task_names(args.tasks):
            for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
                suite.run(name, seed)
    print(table(args.out))


if __name__ == "__main__":
    main()
