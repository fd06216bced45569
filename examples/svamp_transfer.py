"""The transfer recipe: compile the demo's Voting program on generated problems, then measure it on SVAMP.

The recipe that gains on SVAMP (goal 3 of issue 11; 12-17 minutes on the 2-core CPU, SVAMP measurement included):

    WFC_DATA_DIR=../shared/data python examples/svamp_transfer.py --pool stories --calculator --steps 24 --n 300

SVAMP is evaluation only: training and keep-best validation use generated problems (``wfc.tasks.arithmetic``,
``wfc.tasks.wordproblems``), never SVAMP. The training pool is the demo's problems (one +/- step, operands up to 20)
followed by harder ones: ``--pool arithmetic`` (one step of + - x /, operands up to 100) or ``--pool stories``
(600 generated SVAMP-style stories: changes, comparisons, groups, prices, distractors, two steps), and the
curriculum (``curriculum_key="difficulty"``) opens the easy half first and the whole pool by step
``--curriculum-steps``; validation is 100 of the harder problems. Everything else is the demo's
recipe ``fast`` (``compilers/recipes.py``). After training the artifact is saved and ``benchmarks/transfer.py``
measures it on the first ``--n`` SVAMP problems against the same program uncompiled (paired difference, 95% CI).
The generated pools are fixed (their own seed); ``--seed`` varies training (sampling, adapter initialisation).

``--calculator``: the roles write the arithmetic and a calculator does it (``programs/calculator.py``; training scores
each call through it); the uncompiled program it is measured against has the calculator too.

``--program single``: one role (``programs.Single``) instead of Voting, the single-role GRPO rival at an equal
budget: ``--set max_rollout_tokens=N`` with N the Voting run's rollout tokens (its ``metrics.jsonl``) and ``--steps``
large enough that the budget, not the step count, stops it.

``--model`` picks the base model (default ``smollm2-135m``; any name ``wfc.models`` knows, e.g. ``tiny`` or a local
model directory); the measurement loads the same base from the artifact. ``--set key=value`` (repeatable, a JSON
value) overrides one field of the recipe, e.g. ``--set group_size=2`` for a quick run.

Figures and minutes measured on the 2-core CPU (smollm2-135m): docs/results.md, "Transfer to SVAMP".
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _arithmetic_pool(seed: int):
    """One step of + - x /, operands up to 100, all at difficulty 1."""
    from wfc.tasks import get_task

    hard = get_task("arithmetic", n_train=400, n_val=100, n_test=1, seed=seed, steps=1, max_operand=100, ops="+-*/")
    return hard.trainset, hard.valset, [1] * len(hard.trainset)


def _stories_pool(seed: int):
    """SVAMP-like wording (wfc.tasks.wordproblems); its own difficulty 0-2 shifted past the demo's problems."""
    from wfc.tasks import get_task

    hard = get_task("wordproblems", n_train=600, n_val=100, n_test=1, seed=seed)
    return hard.trainset, hard.valset, [1 + ex.difficulty for ex in hard.trainset]


# pool name -> the harder half of the training pool: (trainset, valset, difficulty of each training example)
TRAINING_POOLS = {"arithmetic": _arithmetic_pool, "stories": _stories_pool}


def training_task(seed: int = 2, pool: str = "arithmetic"):
    """(trainset, valset): the demo's easy problems (difficulty 0), then the harder ``pool`` (``arithmetic``:
    four-operation problems, difficulty 1; ``stories``: generated SVAMP-style stories, difficulty 1-3). Validation
    is 100 of the harder problems."""
    import demo

    if pool not in TRAINING_POOLS:
        raise ValueError(f"training pool {pool!r} is unknown: use one of {sorted(TRAINING_POOLS)}")
    easy = demo.demo_task().trainset
    hard_train, hard_val, levels = TRAINING_POOLS[pool](seed)
    seen = {ex.question for ex in easy}
    train = [ex.copy(difficulty=0) for ex in easy]
    ordered = sorted(zip(levels, range(len(hard_train))))  # easiest first, generation order within a level
    train += [hard_train[i].copy(difficulty=d) for d, i in ordered if hard_train[i].question not in seen]
    val = [ex for ex in hard_val if ex.question not in seen]
    return [ex.with_inputs("question") for ex in train], val


def transfer_program(kind: str, stop: tuple[str, ...], calculator: bool):
    """The program trained: ``voting`` (the demo's Voting, n=3) or ``single`` (one role on the demo's signature:
    the single-role rival; compare at equal rollout tokens with ``--set max_rollout_tokens=N``). Both with or
    without the calculator."""
    import demo

    builders = {"voting": demo.program, "single": demo.single_program}
    if kind not in builders:
        raise ValueError(f"program {kind!r} is unknown: use one of {sorted(builders)}")
    return builders[kind](stop, calculator=calculator)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--curriculum-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=300, help="SVAMP problems measured (the first N)")
    p.add_argument("--out", default="artifacts/svamp-voting")
    p.add_argument("--run-dir", default="runs/svamp-transfer")
    p.add_argument("--pool", choices=sorted(TRAINING_POOLS), default="arithmetic",
                   help="harder training problems after the demo's: four-operation arithmetic or SVAMP-style stories")
    p.add_argument("--model", default="smollm2-135m", help="base model: a wfc.models name or a local model directory")
    p.add_argument("--program", choices=("voting", "single"), default="voting",
                   help="the demo's Voting, or one role (Single) as the single-role GRPO rival; for equal budgets "
                        "pass --set max_rollout_tokens=N (the Voting run's rollout tokens) and enough --steps")
    p.add_argument("--calculator", action="store_true",
                   help="the roles write the arithmetic and a calculator does it (programs/calculator.py); the "
                        "uncompiled program it is measured against has the calculator too")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one recipe field (JSON value), e.g. group_size=2; repeatable")
    import demo

    demo.add_stop_flags(p)
    args = p.parse_args(argv)
    stop = demo.stop_from_args(p, args)
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import transfer
    from compilers import MMGRPO
    from gpu_matrix import parse_set
    from learning import workflow_tokens
    from wfc.engines.hf import HFEngine

    trainset, valset = training_task(pool=args.pool)
    recipe = {**demo.RECIPE, "steps": args.steps, "curriculum_key": "difficulty",
              "curriculum_steps": args.curriculum_steps, "curriculum_start": 0.5, **parse_set(args.set)}
    t0 = time.time()
    engine = HFEngine(args.model)
    try:
        compiled = MMGRPO(demo.metric(args.calculator), seed=args.seed, **recipe).compile(
            transfer_program(args.program, stop, args.calculator), trainset=trainset, valset=valset, engine=engine,
            backend="shared", run_dir=Path(args.run_dir))
        path = compiled.save(args.out)
    finally:
        engine.close()
    train_s = time.time() - t0
    out = Path(args.run_dir) / "transfer.json"
    transfer.main([str(path), "--n", str(args.n), "--out", str(out)])
    result = json.loads(out.read_text())
    result.update(program=args.program, calculator=args.calculator,
                  rollout_tokens=workflow_tokens(Path(args.run_dir)), train_seconds=round(train_s, 1),
                  total_seconds=round(time.time() - t0, 1), steps=recipe["steps"],
                  best_step=compiled.manifest.best_step)
    out.write_text(json.dumps(result, indent=1))
    print(f"trained {train_s / 60:.1f} min, best step {compiled.manifest.best_step}; SVAMP ({result['n']}): "
          f"{result['uncompiled']:.3f} -> {result['compiled']:.3f}, paired {result['difference']:+.3f} "
          f"[{result['interval'][0]:+.3f}, {result['interval'][1]:+.3f}]; total {result['total_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
