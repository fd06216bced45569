"""A code workflow compiled end to end: EvalOpt (writer -> reviewer -> fixer) on generated function-writing tasks.

The workflow and its variants (``--program``, ``--check``, ...): ``compilers.presets.codegen``. Prints pass@1 before
and after on the held-out tasks (paired difference, 95% interval) and what each role did (``compilers.role_report``);
writes ``summary.json`` and ``tasks.jsonl`` (per held-out task, for ``benchmarks/paired_runs.py A B``) to its run
folder. Figures, minutes and memory: docs/tasks.md, "Example workflows".

    python examples/code_workflow.py            # = --recipe wide-warmup --steps 8 --n-val 32 --n-test 160
    python examples/code_workflow.py --resume   # a killed run continues from its checkpoint in --run-dir
    python examples/code_workflow.py --program retry --retrieved-demos 1 --vary-demos --sample-retries 0
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from compilers import MMGRPO, evaluate
from compilers.presets import codegen
from compilers.recipes import get_recipe
from compilers.role_report import describe, roles_report
from compilers.runs import rollout_tokens
from wfc.engines.hf import HFEngine
from wfc.flags import add_set_flag, apply_overrides, parse_set

logging.getLogger("dspy").setLevel(logging.ERROR)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, codegen.CodeWorkflow, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    codegen.add_workflow_flags(ap)  # --program and its variants
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--recipe", default=codegen.RECIPE)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--examples-per-step", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--group-size", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--eval-every", type=int, default=4, help="validate every N steps (0: never)")
    ap.add_argument("--max-tokens", type=int, default=codegen.MAX_TOKENS)
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-val", type=int, default=32, help="validation tasks (keep-best picks the step by them)")
    ap.add_argument("--n-test", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0, help="training seed (the task splits are fixed)")
    ap.add_argument("--run-dir", default=None, help="default: runs/code-<workflow label>")
    ap.add_argument("--out", default=None, help="default: artifacts/code-<workflow label>")
    ap.add_argument("--backend", default="shared", choices=("shared", "isolated", "auto"))
    ap.add_argument("--resume", action="store_true", help="continue a killed run from the checkpoint in --run-dir")
    add_set_flag(ap, what="recipe field")
    args = ap.parse_args(argv)
    try:
        workflow, overrides = codegen.workflow_from_args(args), parse_set(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    args.run_dir = args.run_dir or f"runs/code-{workflow.label}"  # different workflows never share a folder
    args.out = args.out or f"artifacts/code-{workflow.label}"
    return args, workflow, overrides


def main(argv: list[str] | None = None) -> dict:
    args, workflow, overrides = parse_args(argv)
    t0 = time.time()
    task = codegen.code_task(n_train=args.n_train, n_val=args.n_val, n_test=args.n_test)
    engine = HFEngine(args.model)
    program = workflow.build(task.signature)
    sizes = {k: v for k in ("examples_per_step", "group_size", "eval_every") if (v := getattr(args, k)) is not None}
    recipe = apply_overrides({**get_recipe(args.recipe), "steps": args.steps, "max_tokens": args.max_tokens, **sizes,
                              **workflow.config()}, overrides)
    report = args.program != "single"  # the writer alone has no other role to report on
    before = evaluate(program, task.testset, engine, metric=task.metric, adapters={}, max_tokens=args.max_tokens,
                      progress="before")
    roles = roles_report(before["graphs"], task.metric, "before") if report else {}
    print(f"pass@1 before: {before['accuracy']:.3f} on {before['n']} tasks{describe(roles, 'before')}")
    compiled = MMGRPO(task.metric, seed=args.seed, **recipe).compile(
        program, trainset=task.trainset, valset=task.valset, engine=engine, backend=args.backend, run_dir=args.run_dir,
        resume=args.run_dir if args.resume else None)
    after = evaluate(compiled.program, task.testset, engine, metric=task.metric, adapters=compiled.roles,
                     max_tokens=args.max_tokens, progress="after")
    held_out = codegen.compare_held_out(task.testset, task.trainset, *[[float(g.reward) for g in run["graphs"]]
                                                                       for run in (before, after)])
    roles.update(roles_report(after["graphs"], task.metric, "after") if report else {})
    print(f"pass@1 after:  {after['accuracy']:.3f} on {after['n']} tasks (best step {compiled.manifest.best_step})"
          f"{describe(roles, 'after')}; {codegen.describe_held_out(held_out)}")
    print(f"artifact: {compiled.save(args.out)}")
    summary = {**workflow.options(), "recipe": args.recipe, "overrides": overrides, "backend": args.backend,
               **recipe, "seed": args.seed, "n_test": args.n_test, "n_val": args.n_val, "before": before["accuracy"],
               "after": after["accuracy"], **held_out["paired"], **roles,
               "interval_by_function": held_out["by_function"]["interval"],
               "functions": held_out["by_function"]["clusters"], "unseen": held_out["unseen"],
               "best_step": compiled.manifest.best_step, "rollout_tokens": rollout_tokens(args.run_dir),
               "seconds": round(time.time() - t0, 1)}
    (Path(args.run_dir) / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (Path(args.run_dir) / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in held_out["tasks"]))
    return summary


if __name__ == "__main__":
    main()
