"""The transfer recipe: compile the demo's Voting program on generated problems, then measure it on SVAMP.

    WFC_DATA_DIR=../shared/data python examples/svamp_transfer.py --pool stories --calculator --steps 24 --n 300

SVAMP is evaluation only: training and keep-best validation use generated problems, the demo's followed by a harder
``--pool`` opened by an easy-first curriculum (``compilers.presets.svamp_transfer``); everything else is the demo's
recipe. After training the artifact is saved, loaded back and measured on the first ``--n`` SVAMP problems against
the same program uncompiled (``compilers.transfer``: paired difference, 95% CI), written to ``RUN_DIR/transfer.json``.

``--calculator``: the roles write the arithmetic and a calculator does it (the uncompiled program has it too).
``--program single``: one role instead of Voting, the single-role rival at an equal budget: ``--set
max_rollout_tokens=N`` with N the Voting run's rollout tokens and enough ``--steps`` that the budget stops it.
``--model`` picks the base model (a ``wfc.models`` name or a local model directory); ``--set KEY=VALUE`` overrides
one recipe field. Figures measured on the 2-core CPU: docs/results.md, "Transfer to SVAMP".
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import wfc
from compilers import MMGRPO, transfer
from compilers.presets import arithmetic, svamp_transfer
from compilers.recipes import get_recipe
from compilers.runs import rollout_tokens
from wfc.engines.hf import HFEngine
from wfc.flags import add_set_flag, add_stop_flags, apply_overrides, parse_set, stop_from_args
from wfc.tasks import get_task


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--curriculum-steps", type=int, default=10, help="the whole pool is open by this step")
    p.add_argument("--seed", type=int, default=0, help="training seed (the generated pools are fixed)")
    p.add_argument("--n", type=int, default=300, help="SVAMP problems measured (the first N)")
    p.add_argument("--out", default="artifacts/svamp-voting")
    p.add_argument("--run-dir", default="runs/svamp-transfer")
    p.add_argument("--pool", choices=sorted(svamp_transfer.TRAINING_POOLS), default="arithmetic",
                   help="harder training problems after the demo's: four-operation arithmetic or SVAMP-style stories")
    p.add_argument("--model", default="smollm2-135m", help="base model: a wfc.models name or a local model directory")
    p.add_argument("--recipe", default=arithmetic.RECIPE, help="the recipe (compilers.recipes) [the demo's]")
    p.add_argument("--program", choices=sorted(svamp_transfer.PROGRAMS), default="voting",
                   help="the demo's Voting, or one role (Single) as the single-role GRPO rival")
    p.add_argument("--calculator", action="store_true", help="the roles write the arithmetic, a calculator does it")
    add_set_flag(p, what="recipe field")
    add_stop_flags(p)
    args = p.parse_args(argv)
    try:
        overrides, stop = parse_set(args.set), stop_from_args(args, arithmetic.STOP)
    except ValueError as exc:
        p.error(str(exc))
    logging.getLogger("dspy").setLevel(logging.ERROR)

    trainset, valset = svamp_transfer.training_task(pool=args.pool)
    recipe = apply_overrides({**get_recipe(args.recipe), "steps": args.steps,
                              **svamp_transfer.curriculum(steps=args.curriculum_steps)}, overrides)
    t0 = time.time()
    engine = HFEngine(args.model)
    try:
        compiled = MMGRPO(arithmetic.metric(args.calculator), seed=args.seed, **recipe).compile(
            svamp_transfer.program(args.program, stop, calculator=args.calculator), trainset=trainset,
            valset=valset, engine=engine, backend="shared", run_dir=Path(args.run_dir))
        path = compiled.save(args.out)
    finally:
        engine.close()
    train_s = time.time() - t0
    task = get_task("svamp", n_test=args.n)
    loaded = wfc.load(path)  # the saved artifact, on a fresh engine: what a user would ship
    try:
        result = {"artifact": str(path), **transfer.measure(loaded, task.testset, task.metric),
                  "seconds": round(time.time() - t0 - train_s, 1)}
    finally:
        loaded.engine.close()
    result.update(program=args.program, calculator=args.calculator, rollout_tokens=rollout_tokens(args.run_dir),
                  train_seconds=round(train_s, 1), total_seconds=round(time.time() - t0, 1), steps=recipe["steps"],
                  best_step=compiled.manifest.best_step)
    (Path(args.run_dir) / "transfer.json").write_text(json.dumps(result, indent=1))
    print(f"trained {train_s / 60:.1f} min, best step {compiled.manifest.best_step}; SVAMP ({result['n']}): "
          f"{result['uncompiled']:.3f} -> {result['compiled']:.3f}, paired {result['difference']:+.3f} "
          f"[{result['interval'][0]:+.3f}, {result['interval'][1]:+.3f}]; total {result['total_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
