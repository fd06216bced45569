"""Benchmark: the HF engine's prefill sharing on the demo's workload (greedy evaluation and one step's rollouts).

Same engine, same program (the demo's Voting, n=3), same problems, one LoRA adapter on every role as in a compile;
runs alternate between ``share_prefill=False`` (each distinct prompt prefilled whole, rows left-padded to the
longest in the batch: the engine before prefix sharing) and ``True`` (the prefix every row of a generate call shares
prefilled once per adapter, batches of two roles split when that prefills less, one-adapter batches without peft's
mixed-batch path). Greedy results must agree (checked); reports seconds and the ratio.

    python benchmarks/bench_prefill.py --problems 100 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--problems", type=int, default=100, help="held-out problems evaluated greedily")
    ap.add_argument("--rollout-examples", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import torch

    from compilers import evaluate
    from compilers.config import LoraSettings
    from compilers.presets import arithmetic
    from compilers.recipes import get_recipe
    from wfc.engines.base import SamplingParams
    from wfc.engines.hf import HFEngine
    from wfc.lower import run_rollouts
    from wfc.tasks.math import math_metric

    task = arithmetic.demo_task()
    max_tokens = get_recipe(arithmetic.RECIPE)["max_tokens"]
    engine = HFEngine(args.model)
    engine.policy.add_adapter("main", LoraSettings().peft_config())
    program = arithmetic.program()
    adapters = {"voter": "main", "aggregator": "main"}
    sampling = SamplingParams(temperature=0.7, max_tokens=max_tokens)
    times: dict[str, dict[str, list[float]]] = {"shared": {"eval": [], "rollouts": []},
                                                "unshared": {"eval": [], "rollouts": []}}
    answers: dict[str, list] = {}
    for _ in range(args.repeats):
        for label, share in (("unshared", False), ("shared", True)):
            engine.share_prefill = share
            t0 = time.perf_counter()
            result = evaluate(program, task.testset[:args.problems], engine, metric=math_metric, adapters=adapters,
                              max_tokens=max_tokens)
            times[label]["eval"].append(time.perf_counter() - t0)
            answers[label] = [g.outputs for g in result["graphs"]]
            torch.manual_seed(0)
            t0 = time.perf_counter()
            run_rollouts(program, task.trainset[:args.rollout_examples], engine, repeats=args.group_size,
                         adapters=adapters, sampling=sampling)
            times[label]["rollouts"].append(time.perf_counter() - t0)
    same = sum(a == b for a, b in zip(answers["shared"], answers["unshared"]))
    report = {"model": args.model, "problems": args.problems, "torch_threads": torch.get_num_threads(),
              "greedy_outputs_equal": f"{same}/{len(answers['shared'])}"}
    for part in ("eval", "rollouts"):
        a, b = min(times["unshared"][part]), min(times["shared"][part])
        report[part] = {"unshared_s": round(a, 1), "shared_s": round(b, 1), "speedup": round(a / b, 2)}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
