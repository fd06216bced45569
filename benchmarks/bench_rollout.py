"""Benchmark: rollout throughput of the isolated backend (4 roles, mixed-adapter batches) vs the shared backend.

Same program (the 4-role program of bench_memory), same examples, same sampling, same engine; the only difference
is the role -> adapter map: one adapter for all roles, or one per role (every generate call then routes rows through
different LoRA adapters with peft's ``adapter_names``). Runs alternate between the two maps; reports completion
tokens per second of whole rollouts and the ratio isolated / shared (issue goal: at least 0.85x).

    python -m benchmarks.bench_rollout --model tiny
    python -m benchmarks.bench_rollout --model smollm2-135m --examples 4 --repeats 2 --out bench_rollout.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path


def rollout_tok_s(program, examples, engine, *, group_size: int, adapters, sampling) -> float:
    """Completion tokens per second of one batch of whole rollouts (``group_size`` per example, all in flight)."""
    from wfc.lower import run_rollouts

    t0 = time.perf_counter()
    graphs = run_rollouts(program, examples, engine, repeats=group_size, adapters=adapters, sampling=sampling)
    dt = time.perf_counter() - t0
    return sum(len(c.completion_ids) for gs in graphs for g in gs for c in g.calls) / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import torch

    from benchmarks.bench_memory import four_roles
    from compilers.backends import resolve_backend
    from compilers.config import LoraSettings
    from wfc.engines.base import SamplingParams
    from wfc.engines.hf import HFEngine
    from wfc.lower import roles
    from wfc.tasks.arithmetic import make_arithmetic
    from wfc.tasks.signatures import SolveMath

    torch.manual_seed(0)
    program = four_roles(SolveMath)
    paths = list(roles(program))
    engine = HFEngine(args.model)
    plans = {b: resolve_backend(b, paths) for b in ("shared", "isolated")}
    lora = LoraSettings(r=8, alpha=16).peft_config()
    for adapter in {a for p in plans.values() for a in p.adapters}:
        engine.policy.add_adapter(adapter, lora)
    # Non-zero B so every adapter really changes the computation (fresh LoRA B is zero).
    with torch.no_grad():
        for name, p in engine.policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    examples = make_arithmetic(args.examples, seed=5)
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    results: dict[str, list[float]] = {"shared": [], "isolated": []}
    for _ in range(args.repeats):
        for backend, plan in plans.items():
            results[backend].append(rollout_tok_s(program, examples, engine, group_size=args.group_size,
                                                  adapters=plan.role_adapters, sampling=sampling))
    engine.close()
    shared, isolated = statistics.median(results["shared"]), statistics.median(results["isolated"])
    table = {"model": args.model, "roles": paths, "shared_tok_s": round(shared, 1),
             "isolated_tok_s": round(isolated, 1), "ratio_isolated_over_shared": round(isolated / shared, 3),
             "runs": results}
    print(f"{'backend':<10} {'completion tok/s (median)':>26}")
    print(f"{'shared':<10} {shared:>26.1f}\n{'isolated':<10} {isolated:>26.1f}")
    print(f"ratio isolated/shared: {isolated / shared:.3f}  (goal >= 0.85)")
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
