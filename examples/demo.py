"""`make demo`: compile a Voting workflow with mmGRPO on arithmetic word problems, on the embedded SmolLM2-135M.

Prints the role graph, baseline and compiled accuracy on a held-out split, saves the artifact, loads it back and
runs it on one question. Budget: about 15-20 minutes on a 2-core CPU. Set WFC_DEMO_STEPS to change the length.
"""

from __future__ import annotations

import logging
import os
import time

import dspy

import wfc
from compilers import MMGRPO, evaluate
from programs import Voting
from wfc.engines.hf import HFEngine
from wfc.rolegraph import RoleGraph
from wfc.tasks import get_task
from wfc.tasks.math import math_metric

logging.getLogger("dspy").setLevel(logging.ERROR)

MAX_TOKENS = 24  # room for "a + b = c"; longer rambles mostly end on a wrong number
SIGNATURE = dspy.Signature("question -> answer", "Solve the math word problem. Give the final answer as a number.")


def program() -> Voting:
    return Voting(SIGNATURE, n=3, name="math-voting")


def main() -> None:
    steps = int(os.environ.get("WFC_DEMO_STEPS", "10"))
    # Disjoint splits (no question appears in two of them) of one-step problems with operands up to 20.
    task = get_task("arithmetic", n_train=400, n_val=30, n_test=100, seed=1, steps=1, max_operand=20)
    train, val, test = task.trainset, task.valset, task.testset
    t0 = time.time()
    engine = HFEngine("smollm2-135m")
    prog = program()
    base = evaluate(prog, test, engine, metric=math_metric, adapters={}, max_tokens=MAX_TOKENS)
    print(RoleGraph.from_rollouts(base["graphs"]).table())
    print(f"baseline accuracy on {base['n']} held-out problems: {base['accuracy']:.3f}")
    compiled = MMGRPO(
        math_metric, steps=steps, examples_per_step=4, group_size=8, max_tokens=MAX_TOKENS, temperature=0.7,
        learning_rate=3e-4, eval_every=5, advantage="dr_grpo", loss_aggregation="token", credit="own_output",
    ).compile(prog, trainset=train, valset=val, engine=engine, backend="shared", run_dir="runs/demo",
              program_import_path="examples/demo.py:program")
    after = evaluate(compiled.program, test, engine, metric=math_metric, adapters=compiled.roles, max_tokens=MAX_TOKENS)
    print(f"compiled accuracy on {after['n']} held-out problems: {after['accuracy']:.3f} "
          f"(baseline {base['accuracy']:.3f}; best step {compiled.manifest.best_step})")
    path = compiled.save("artifacts/math-voting")
    loaded = wfc.load(path, engine=engine)
    question = test[0].question
    print(f"artifact: {path}\nQ: {question}\nA: {loaded(question=question).answer}  (expected {test[0].answer})")
    print(f"total time {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
