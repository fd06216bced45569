"""The demo's task with the program as DSPy users write it: ``dspy.ChainOfThought("question -> answer: int")``.

Every call is decoded under its signature's grammar (``wfc.constrain``): the ``[[ ## reasoning ## ]]`` and
``[[ ## answer ## ]]`` sections are forced, the reasoning gets a budget of ``--reasoning-tokens`` and the answer is an
integer, so every call parses and GRPO sees the answers' spread. Baseline, compile, held-out accuracy, artifact.

    python examples/cot_demo.py --seed 0            # 3 demos, then the weights: 43 min alone on 2 CPU cores
    python examples/cot_demo.py --seed 0 --demos 0  # the weights alone (seeds 1-2 collapse: docs/results.md)
    python examples/cot_demo.py --seed 0 --train-metric grounded   # reward only answers the reasoning shows
    python examples/cot_demo.py --seed 2 --resume --max-batch 64   # continue a killed run from its checkpoint

``--train-metric grounded`` (``compilers.grounded``) trains on the metric only where the reasoning shows the answer:
on this task a constant answer (``2``, 6% of the training problems) out-earns the untrained model's sampled
reasoning, and GRPO otherwise climbs towards it on some seeds (docs/results.md). Held-out accuracy is always the
task's plain metric.

``--demos K`` (default 3) is prompt optimization before the weights, MMGRPO's ``strategy="p -> w"``: K demonstrations
bootstrapped from the untrained program's own passing runs (64 training problems x 4 runs, greedy first) whose
reasoning ends at their answer (``compilers.prompts.reasoning_concludes``), set on the program; compile then trains
the weights with them in the prompt, and the artifact keeps them. The figures without and with the demos (no
training) are both in the summary.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import wfc
from compilers import MMGRPO, evaluate
from compilers.grounded import grounded
from compilers.prompts import demo_summary
from compilers.recipes import get_recipe
from programs.agents import math_cot
from wfc.engines.hf import HFEngine
from wfc.flags import add_set_flag, apply_overrides, parse_set
from wfc.tasks import get_task
from wfc.tasks.math import math_metric

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="smollm2-135m", help="the base model (tests: tiny)")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--reasoning-tokens", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64, help="every call's token limit (markers included)")
    ap.add_argument("--out", default="artifacts/cot-demo")
    ap.add_argument("--train-metric", choices=("plain", "grounded"), default="plain",
                    help="the reward: the task's metric, or it only where the reasoning shows the answer "
                         "(compilers.grounded); held-out accuracy always uses the task's metric")
    ap.add_argument("--demos", type=int, default=3,
                    help="first bootstrap this many demos from the program's own runs whose reasoning concludes at a "
                         "right answer (prompt optimization before the weights, 'p -> w'); 0: none [3, chosen on "
                         "validation over three seeds: docs/results.md]")
    ap.add_argument("--resume", action="store_true",
                    help="continue runs/<name> from its checkpoint (a killed run): its demos come from the checkpoint")
    ap.add_argument("--max-batch", type=int, default=256,
                    help="requests the engine runs together (lower it to cap memory: demos lengthen every prompt)")
    ap.add_argument("--run-name", default=None, help="runs/<name> (default cot-seed<SEED>)")
    add_set_flag(ap, what="recipe field")
    args = ap.parse_args(argv)
    try:
        overrides = parse_set(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    run_dir = Path("runs") / (args.run_name or f"cot-seed{args.seed}")
    task = get_task("arithmetic", n_train=400, n_val=100, n_test=300, seed=1, steps=1, max_operand=20)
    engine = HFEngine(args.model, max_batch=args.max_batch)
    prog = math_cot(args.reasoning_tokens)
    t0 = time.time()
    base = evaluate(prog, task.testset, engine, metric=math_metric, adapters={}, max_tokens=args.max_tokens,
                    progress="baseline")
    # p -> w: the demos ride in the program, so compile trains with them and the artifact keeps them
    demos = {"strategy": "p -> w", "demos_per_role": args.demos, "bootstrap_examples": 64, "bootstrap_repeats": 4}
    recipe = apply_overrides({**get_recipe("wide-warmup"), "max_tokens": args.max_tokens, "steps": args.steps,
                              "seed": args.seed, **(demos if args.demos else {})}, overrides)
    train_metric = grounded(math_metric) if args.train_metric == "grounded" else math_metric
    compiled = MMGRPO(train_metric, **recipe).compile(prog, trainset=task.trainset, valset=task.valset, engine=engine,
                                                     run_dir=run_dir, resume=run_dir if args.resume else None)
    boot = next((r for r in compiled.manifest.history if r["kind"] == "demos"), {})
    prompted = None
    if demo_summary(compiled.program):  # the demos alone: the compiled program's prompt on the untrained model
        prompted = evaluate(compiled.program, task.testset, engine, metric=math_metric, adapters={},
                            max_tokens=args.max_tokens, progress="demos only")
    after = evaluate(compiled.program, task.testset, engine, metric=math_metric, adapters=compiled.roles,
                     max_tokens=args.max_tokens, progress="held-out")
    errors = sum(c.status == "format_error" for g in after["graphs"] for c in g.calls)
    summary = {"seed": args.seed, "overrides": overrides, "train_metric": args.train_metric,
               "baseline": base["accuracy"], "baseline_interval": base["interval"],
               "bootstrap": boot, "demos_only": None if prompted is None else prompted["accuracy"],
               "demos_only_interval": None if prompted is None else prompted["interval"],
               "compiled": after["accuracy"], "compiled_interval": after["interval"],
               "gain": after["accuracy"] - base["accuracy"], "format_errors_after": errors,
               "minutes": round((time.time() - t0) / 60, 1)}
    print(json.dumps(summary))
    path = compiled.save(args.out)
    loaded = wfc.load(path, engine=engine)
    print(f"artifact {path}: {task.testset[0].question} -> {loaded(question=task.testset[0].question).answer}")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
