"""Run the four topologies on a few arithmetic word problems with the embedded model (`make tour`).

Prints each program's answers, accuracy and role graph (greedy decoding, base model, no training).
"""

from __future__ import annotations

import logging
import sys

from compilers import evaluate
from programs import EvalOpt, OrchWorkers, Single, Voting
from wfc.engines.hf import HFEngine
from wfc.rolegraph import RoleGraph
from wfc.tasks.arithmetic import make_arithmetic
from wfc.tasks.math import math_metric
from wfc.tasks.signatures import SolveMath

logging.getLogger("dspy").setLevel(logging.ERROR)


def main(model: str = "smollm2-135m", n: int = 8) -> None:
    problems = make_arithmetic(n, seed=11)
    engine = HFEngine(model)
    for program in (Single(SolveMath), EvalOpt(SolveMath, rounds=1), Voting(SolveMath, n=3),
                    OrchWorkers(SolveMath, max_subtasks=2)):
        result = evaluate(program, problems, engine, metric=math_metric, adapters={}, max_tokens=32)
        print(f"\n=== {program.name}: accuracy {result['accuracy']:.2f} on {result['n']} problems")
        for example, graph in zip(problems, result["graphs"]):
            answer = (graph.outputs or {}).get("answer", f"<{graph.status}>")
            print(f"  {example.question}\n    -> {' '.join(str(answer).split())[:80]!r} (expected {example.answer})")
        print(RoleGraph.from_rollouts(result["graphs"]).table())
    engine.close()


if __name__ == "__main__":
    main(*(sys.argv[1:2] or []))
