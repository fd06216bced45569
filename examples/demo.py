"""`make demo`: compile a Voting workflow on arithmetic word problems, on the embedded SmolLM2-135M (CPU).

The preset (``compilers.presets.arithmetic``): Voting(n=3, skip_unanimous=True) on one-step problems, compiled with
the ``wide-warmup`` recipe (``compilers.recipes``) for 14 steps on one shared LoRA adapter. Prints the role graph and
the held-out accuracy on 300 problems before and after (95% intervals), saves the artifact, loads it back and answers
one question; ``RUN_DIR/summary.json`` records the run. Every training call samples with its own seed and the engine's
batches do not follow thread timing (``wfc.engines.cohort``), so a seed's run repeats. Figures per seed:
docs/results.md, "The demo's figures, per seed".

Environment: WFC_DEMO_SEED (default 0: training seed), WFC_DEMO_STEPS (default 14), WFC_DEMO_OUT (artifact dir),
WFC_DEMO_RUN_DIR (default runs/demo-seed<SEED>: checkpoints, metrics.jsonl, summary.json),
WFC_DEMO_RECIPE (default wide-warmup), WFC_DEMO_BACKEND (default shared: one LoRA for both roles; isolated: one each),
WFC_DEMO_ROLLOUT_DTYPE (default float32: one colocated model; bfloat16: a bf16 rollout engine beside the policy),
WFC_DEMO_MODEL (default smollm2-135m: the embedded model; a wfc.models name or a local model directory).
Flags: ``--calculator`` (the roles write the arithmetic, ``programs/calculator.py`` does it), ``--set KEY=VALUE``
(overrides one recipe field), ``--stop STR`` / ``--no-stop`` (every role's stop strings), e.g. the variant that ends
every answer at its first line: ``WFC_DEMO_RECIPE=finish python examples/demo.py --stop '\\n'``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import wfc
from compilers import MMGRPO, evaluate
from compilers.presets import arithmetic
from compilers.recipes import get_recipe
from wfc.engines.hf import HFEngine
from wfc.flags import add_set_flag, add_stop_flags, apply_overrides, parse_set, stop_from_args
from wfc.rolegraph import RoleGraph
from wfc.tasks.math import math_metric

logging.getLogger("dspy").setLevel(logging.ERROR)
program = arithmetic.program  # `wfc inspect examples/demo.py:program` (README): the demo's Voting as a CLI spec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="compile the demo's Voting workflow (see the module docstring)")
    add_set_flag(ap, what="recipe field")
    add_stop_flags(ap)
    ap.add_argument("--calculator", action="store_true",
                    help="roles write the arithmetic and a calculator does it (programs/calculator.py)")
    args = ap.parse_args(argv)
    try:
        overrides, stop = parse_set(args.set), stop_from_args(args, arithmetic.STOP)
    except ValueError as exc:
        ap.error(str(exc))
    recipe_name = os.environ.get("WFC_DEMO_RECIPE", arithmetic.RECIPE)
    recipe = apply_overrides(get_recipe(recipe_name), overrides)
    seed = int(os.environ.get("WFC_DEMO_SEED", "0"))
    steps = int(os.environ.get("WFC_DEMO_STEPS", str(arithmetic.STEPS)))
    out = Path(os.environ.get("WFC_DEMO_OUT", "artifacts/math-voting"))
    run_dir = Path(os.environ.get("WFC_DEMO_RUN_DIR") or Path("runs") / f"demo-seed{seed}")
    backend = os.environ.get("WFC_DEMO_BACKEND", "shared")
    dtype = os.environ.get("WFC_DEMO_ROLLOUT_DTYPE", "float32")  # bfloat16: compile trains an fp32 policy apart
    task = arithmetic.demo_task()
    t0 = time.time()
    engine = HFEngine(os.environ.get("WFC_DEMO_MODEL", "smollm2-135m"), dtype=dtype)
    prog = arithmetic.program(stop, calculator=args.calculator)
    base = evaluate(prog, task.testset, engine, metric=math_metric, adapters={}, max_tokens=recipe["max_tokens"],
                    progress="baseline")
    print(RoleGraph.from_rollouts(base["graphs"]).table())
    lo, hi = base["interval"]
    print(f"baseline accuracy on {base['n']} held-out problems: {base['accuracy']:.3f} [{lo:.2f}, {hi:.2f}] "
          f"({time.time() - t0:.0f}s)")
    compiled = MMGRPO(arithmetic.metric(args.calculator), **{**recipe, "steps": steps, "seed": seed}).compile(
        prog, trainset=task.trainset, valset=task.valset, engine=engine, backend=backend, run_dir=run_dir)
    t_train = time.time()
    after = evaluate(compiled.program, task.testset, engine, metric=math_metric, adapters=compiled.roles,
                     max_tokens=recipe["max_tokens"], progress="held-out")
    lo, hi = after["interval"]
    gain = after["accuracy"] - base["accuracy"]
    print(f"compiled accuracy on {after['n']} held-out problems: {after['accuracy']:.3f} [{lo:.2f}, {hi:.2f}] "
          f"(baseline {base['accuracy']:.3f}, gain {gain:+.3f}; best step {compiled.manifest.best_step})")
    path = compiled.save(out)
    question = task.testset[0].question
    print(f"artifact: {path}\nQ: {question}\nA: {wfc.load(path, engine=engine)(question=question).answer}  "
          f"(expected {task.testset[0].answer})")
    total = time.time() - t0
    print(f"total time {total:.0f}s")
    summary = {"seed": seed, "steps": steps, "backend": backend, "rollout_dtype": dtype, "recipe": recipe_name,
               "overrides": overrides, "stop": list(stop), "calculator": args.calculator,
               "baseline": base["accuracy"], "baseline_interval": base["interval"],
               "compiled": after["accuracy"], "compiled_interval": after["interval"], "gain": gain,
               "best_step": compiled.manifest.best_step, "seconds": round(total, 1),
               "seconds_final_eval": round(time.time() - t_train, 1), "artifact": str(path)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
