"""A code workflow compiled end to end: EvalOpt (writer -> reviewer -> fixer) on generated function-writing tasks.

Each rollout's code runs against the task's tests in the sandbox (``wfc.tasks.sandbox``). Trains with a named recipe
(``compilers/recipes.py``; default the demo's ``fast``: verified credit, so the reviewer is scored on whether its
verdict matches the tests, dynamic sampling, keep-best validation) with ``--max-tokens`` per call instead of the
recipe's (code needs more than a number), then prints pass@1 before and after on the held-out tasks with the paired
difference and its 95% interval. Measured on the 2-core CPU (README, "Example workflows"): 5 steps, 48 tasks,
0.542 -> 0.562, paired +0.021 [-0.116, +0.158], 47 min: inside noise at this budget. The script is the template for
a larger model (``--model /path/to/hf-model``).

    python examples/code_workflow.py --steps 5 --n-test 48
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from compilers import MMGRPO, evaluate
from compilers.recipes import get_recipe
from compilers.score import paired_difference
from programs import EvalOpt
from wfc.engines.hf import HFEngine
from wfc.tasks import get_task

logging.getLogger("dspy").setLevel(logging.ERROR)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--recipe", default="fast")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--examples-per-step", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--group-size", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-test", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    task = get_task("codegen", n_train=100, n_val=16, n_test=args.n_test)
    engine = HFEngine(args.model)
    program = EvalOpt(task.signature, rounds=1, name="code-evalopt")
    recipe = {**get_recipe(args.recipe), "steps": args.steps, "max_tokens": args.max_tokens}
    for key in ("examples_per_step", "group_size"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    before = evaluate(program, task.testset, engine, metric=task.metric, adapters={}, max_tokens=args.max_tokens,
                      progress="before")
    print(f"pass@1 before: {before['accuracy']:.3f} on {before['n']} tasks")
    compiled = MMGRPO(task.metric, seed=args.seed, **recipe).compile(
        program, trainset=task.trainset, valset=task.valset, engine=engine, run_dir="runs/code-evalopt")
    after = evaluate(compiled.program, task.testset, engine, metric=task.metric, adapters=compiled.roles,
                     max_tokens=args.max_tokens, progress="after")
    pair = paired_difference([float(g.reward) for g in before["graphs"]], [float(g.reward) for g in after["graphs"]])
    lo, hi = pair["interval"]
    print(f"pass@1 after:  {after['accuracy']:.3f} on {after['n']} tasks (best step {compiled.manifest.best_step}); "
          f"paired difference {pair['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({pair['only_after']} tasks passed "
          f"only after, {pair['only_before']} only before)")
    print(f"artifact: {compiled.save('artifacts/code-evalopt')}")
    summary = {"recipe": args.recipe, **recipe, "before": before["accuracy"], "after": after["accuracy"], **pair,
               "best_step": compiled.manifest.best_step, "seconds": round(time.time() - t0, 1)}
    Path("runs/code-evalopt/summary.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
