"""A code workflow compiled end to end: EvalOpt (writer -> reviewer -> fixer) on generated function-writing tasks.

Each rollout's code runs against the task's tests in the sandbox (``wfc.tasks.sandbox``). Prints pass rates before
and after a small mmGRPO budget on the embedded model. SmolLM2-135M rarely writes passing code, so expect small
numbers; the script is the template for a larger model (``--model /path/to/hf-model``).

    python examples/code_workflow.py --steps 4
"""

from __future__ import annotations

import argparse
import logging

from compilers import MMGRPO, evaluate
from programs import EvalOpt
from wfc.engines.hf import HFEngine
from wfc.tasks import get_task

logging.getLogger("dspy").setLevel(logging.ERROR)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    task = get_task("codegen", n_train=100, n_val=16, n_test=32)
    engine = HFEngine(args.model)
    program = EvalOpt(task.signature, rounds=1, name="code-evalopt")
    before = evaluate(program, task.testset, engine, metric=task.metric, adapters={}, max_tokens=args.max_tokens)
    print(f"pass@1 before: {before['accuracy']:.3f} on {before['n']} tasks")
    compiled = MMGRPO(task.metric, steps=args.steps, examples_per_step=2, group_size=6, max_tokens=args.max_tokens,
                      temperature=0.8, eval_every=0, credit="own_output").compile(
        program, trainset=task.trainset, valset=task.valset, engine=engine, run_dir="runs/code-evalopt")
    after = evaluate(compiled.program, task.testset, engine, metric=task.metric, adapters=compiled.roles,
                     max_tokens=args.max_tokens)
    print(f"pass@1 after:  {after['accuracy']:.3f} on {after['n']} tasks (best step {compiled.manifest.best_step})")
    print(f"artifact: {compiled.save('artifacts/code-evalopt')}")


if __name__ == "__main__":
    main()
