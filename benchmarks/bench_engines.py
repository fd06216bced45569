"""Benchmark: rollout throughput of the three engines in one run: HF in-process, vLLM in-process, vLLM server.

The same 4-role workflow (benchmarks/bench_memory.py), examples, sampling settings and isolated adapters (one per
role, identical non-zero weights) on each engine in turn (one engine alive at a time, so each has the machine);
completion tokens per second of whole rollouts (all ``examples x group_size`` rollouts in flight), median over
``--repeats`` after one warm-up rollout. Start-up (model load; for vLLM also KV cache and warm-up; for the server
also the process start) is reported apart. The server engine starts ``--servers`` local ``vllm serve`` processes
itself (``VLLMServerEngine.launch``), sharing the thread count the in-process engines use (``OMP_NUM_THREADS``).

With ``--compile-steps N`` (default 2) each engine then runs N whole mmGRPO steps (Voting n=3, isolated adapters,
the trainer's policy beside the engine) and reports the median step time split into rollouts, update and hand-off.

    python -m benchmarks.bench_engines --model tiny
    python -m benchmarks.bench_engines --model smollm2-135m --out bench_engines.json

Needs the ``vllm`` extra for the two vLLM engines (``--engines hf`` runs without it).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path


def build(kind: str, model: str, *, dtype: str, servers: int):
    from wfc.engines import make_engine

    if kind == "hf":
        return make_engine("hf", model)
    if kind == "vllm":
        return make_engine("vllm", model, dtype=dtype, max_loras=8)
    import torch

    # the same CPU threads as the in-process engines get (torch's count, from OMP_NUM_THREADS)
    return make_engine("vllm-server", model, launch=servers, dtype=dtype, max_loras=8,
                       threads=max(1, torch.get_num_threads() // servers))


def bench_engine(kind: str, args) -> dict:
    import torch

    from benchmarks.bench_memory import four_roles
    from benchmarks.bench_rollout import rollout_tok_s
    from compilers.backends import resolve_backend
    from compilers.config import LoraSettings
    from wfc.engines.base import SamplingParams
    from wfc.lower import roles, run_rollouts
    from wfc.tasks.arithmetic import make_arithmetic
    from wfc.tasks.signatures import SolveMath

    program = four_roles(SolveMath)
    plan = resolve_backend("isolated", list(roles(program)))
    t0 = time.perf_counter()
    engine = build(kind, args.model, dtype=args.dtype, servers=args.servers)
    startup = time.perf_counter() - t0
    try:
        from wfc.policy import Policy

        policy = engine.policy if kind == "hf" else Policy(engine.handle)  # the trainer's side
        for adapter in plan.adapters:
            policy.add_adapter(adapter, LoraSettings(r=8, alpha=16).peft_config())
        with torch.no_grad():  # identical non-zero adapters on every engine
            gen = torch.Generator().manual_seed(0)
            for name, p in policy.model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        engine.load_adapters(policy.export(plan.adapters))
        items = make_arithmetic(args.examples, seed=5)
        sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
        run_rollouts(program, items[:1], engine, repeats=1, adapters=plan.role_adapters, sampling=sampling)
        runs = [rollout_tok_s(program, items, engine, group_size=args.group_size, adapters=plan.role_adapters,
                              sampling=sampling) for _ in range(args.repeats)]
        steps = compile_steps(kind, engine, args) if args.compile_steps else []
    finally:
        engine.close()
    out = {"tok_s": round(statistics.median(runs), 1), "runs": runs, "startup_s": round(startup, 1)}
    if steps:
        out["step"] = {k: round(statistics.median(s[k] for s in steps), 3) for k in steps[0]}
        out["steps"] = steps
    return out


def compile_steps(kind: str, engine, args) -> list[dict]:
    """Whole mmGRPO steps on this engine (Voting n=3, isolated adapters, fresh policy adapters): per step the seconds
    of rollouts, update and hand-off, the step total, and rollout completion tokens per second of the step."""
    from compilers import MMGRPO
    from programs import Voting
    from wfc.policy import Policy
    from wfc.tasks.arithmetic import make_arithmetic
    from wfc.tasks.signatures import SolveMath

    def dense(example, prediction, trace=None):  # signal in every group, whatever the model
        return 1.0 / (1.0 + len(str(prediction.answer)))

    # a fresh trainer (the rollout benchmark's adapters stay out of it); on HF a fresh colocated engine on it
    policy = Policy(args.model)
    if kind == "hf":
        from wfc.engines.hf import HFEngine

        engine = HFEngine(policy=policy)
    compiled = MMGRPO(dense, steps=args.compile_steps, examples_per_step=args.examples, group_size=args.group_size,
                      max_tokens=args.max_tokens, temperature=1.0, eval_every=0, keep="last").compile(
        Voting(SolveMath, n=3), trainset=make_arithmetic(16, seed=7), engine=engine, policy=policy,
        backend="isolated", run_dir=Path(args.run_dir) / kind, progress=False)
    if kind == "hf":
        engine.close()
    out = []
    for r in (r for r in compiled.manifest.history if r["kind"] == "step"):
        total = r["seconds_rollout"] + r["seconds_update"] + r["seconds_handoff"]
        out.append({"rollout_s": r["seconds_rollout"], "update_s": r["seconds_update"],
                    "handoff_s": r["seconds_handoff"], "step_s": round(total, 3),
                    "rollout_tok_s": round(r["drawing"]["completion_tokens"] / max(r["seconds_rollout"], 1e-9), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--engines", default="hf,vllm,vllm-server", help="comma-separated: hf, vllm, vllm-server")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--examples", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32", help="vLLM dtype of both vLLM engines (float32 or bfloat16)")
    ap.add_argument("--servers", type=int, default=1, help="vllm serve processes the server engine starts [1]")
    ap.add_argument("--compile-steps", type=int, default=2, help="whole mmGRPO steps per engine (0: skip) [2]")
    ap.add_argument("--run-dir", default="runs/bench_engines")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.getLogger("dspy").setLevel(logging.ERROR)
    result: dict = {"model": args.model, "dtype": args.dtype, "examples": args.examples,
                    "group_size": args.group_size, "max_tokens": args.max_tokens, "engines": {}}
    for kind in args.engines.split(","):
        result["engines"][kind] = r = bench_engine(kind, args)
        print(f"{kind}: {r['tok_s']} completion tok/s, start-up {r['startup_s']} s", flush=True)
    print(f"model {args.model}, 4 roles isolated, {args.examples} examples x {args.group_size} rollouts, "
          f"{args.max_tokens} tokens per call, vLLM dtype {args.dtype}")
    print(f"{'engine':<14} {'completion tok/s':>17} {'start-up s':>11} {'step s':>8} {'rollout s':>10} "
          f"{'update s':>9} {'hand-off s':>11} {'step rollout tok/s':>19}")
    for kind, r in result["engines"].items():
        st = r.get("step", {})
        cells = [f"{st[k]:.3f}" if k in st else "-" for k in ("step_s", "rollout_s", "update_s", "handoff_s")]
        print(f"{kind:<14} {r['tok_s']:>17.1f} {r['startup_s']:>11.1f} {cells[0]:>8} {cells[1]:>10} {cells[2]:>9} "
              f"{cells[3]:>11} {st.get('rollout_tok_s', '-'):>19}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
