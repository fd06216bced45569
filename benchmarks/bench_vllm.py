"""Benchmark: vLLM adapter-only hand-off vs a full-weight reload, and rollout throughput of the HF vs vLLM engines.

1. Hand-off. After a policy update the trainer must get new weights into the sampler. wfc hands over only the
   changed LoRA adapters (``VLLMEngine.load_adapters``: write the adapter in PEFT format, register a new
   ``LoRARequest``; vLLM loads it on the next request). The alternative many trainers use (TRL, for one) is a
   full-weight sync: merge the LoRA into the base and push every base weight into the running vLLM model
   (vLLM's in-place ``reload_weights``; the merge is timed too). Both are timed in the same run, on the same engine,
   from "the trainer changed the weights" to "vLLM holds the new weights" (the adapter path includes writing the
   adapter and vLLM's ``add_lora``); each is followed by an untimed request that uses the new weights. Reports
   median seconds over ``--repeats`` and the ratio full / adapter-only.
2. Rollouts. The same 4-role workflow (benchmarks/bench_memory.py), examples, sampling settings and isolated
   adapters (one per role) on the HF engine and on the vLLM engine; completion tokens per second of whole rollouts,
   median over ``--repeats``.

    python -m benchmarks.bench_vllm --model tiny
    python -m benchmarks.bench_vllm --model smollm2-135m --out bench_vllm.json

Needs the ``vllm`` extra.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_handoff(engine, *, repeats: int) -> dict:
    import torch
    from peft.tuners.lora import LoraLayer

    from compilers.config import LoraSettings
    from wfc.engines.base import GenerationRequest, SamplingParams

    from wfc.policy import Policy

    trainer = Policy(engine.handle)  # the trainer's side, on the engine's base
    trainer.add_adapter("policy", LoraSettings(r=16, alpha=32).peft_config())
    engine.load_adapters(trainer.export(["policy"]))
    probe = [GenerationRequest(messages=({"role": "user", "content": "What is 2 + 2?"},), adapter="policy",
                               sampling=SamplingParams(temperature=0.0, max_tokens=4))]
    base_probe = [r.model_copy(update={"adapter": None}) for r in probe]  # after a full sync the base *is* the policy
    engine.generate(probe)  # warm-up: first LoRA load, kernels

    def touch():  # stands in for an optimizer step: the adapter's weights change in place
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B.policy." in name:
                    p.add_(torch.randn_like(p) * 1e-3)

    def full_sync():
        # merged base weights, as a full-weight sync would send them (LoRA folded in), then pushed into vLLM
        with torch.no_grad():
            state = {}
            for name, module in trainer.model.named_modules():
                if isinstance(module, LoraLayer):
                    module.merge(adapter_names=["policy"])
            for name, value in trainer.base_model.state_dict().items():
                if "lora_" not in name:
                    state[name.replace(".base_layer", "")] = value.detach().clone()
            for module in trainer.model.modules():
                if isinstance(module, LoraLayer):
                    module.unmerge()
        # vLLM's in-place weight reload (it handles the LoRA-wrapped layers and stacked q/k/v, gate/up shards)
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        engine.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        return sum(v.numel() * v.element_size() for v in state.values())

    adapter, full, full_bytes = [], [], 0
    for _ in range(repeats):
        touch()
        adapter.append(_timed(lambda: engine.load_adapters(trainer.export(["policy"]))))  # export + write + load
        engine.generate(probe)  # served by the new revision (untimed)
        touch()
        t0 = time.perf_counter()
        full_bytes = full_sync()
        full.append(time.perf_counter() - t0)
        engine.generate(base_probe)
    a, f = statistics.median(adapter), statistics.median(full)
    return {"adapter_only_s": round(a, 4), "full_reload_s": round(f, 4), "speedup": round(f / a, 1),
            "adapter_bytes": engine.stats["handoffs"][-1]["bytes"], "full_bytes": full_bytes,
            "runs": {"adapter": adapter, "full": full}}


def bench_rollouts(engines: dict, *, examples: int, group_size: int, max_tokens: int, repeats: int) -> dict:
    import torch

    from benchmarks.bench_memory import four_roles
    from benchmarks.bench_rollout import rollout_tok_s
    from compilers.backends import resolve_backend
    from compilers.config import LoraSettings
    from wfc.lower import roles, run_rollouts
    from wfc.engines.base import SamplingParams
    from wfc.tasks.arithmetic import make_arithmetic
    from wfc.tasks.signatures import SolveMath

    program = four_roles(SolveMath)
    plan = resolve_backend("isolated", list(roles(program)))
    lora = LoraSettings(r=8, alpha=16).peft_config()
    from wfc.policy import Policy

    for name, engine in engines.items():
        torch.manual_seed(0)
        policy = engine.policy if hasattr(engine, "policy") else Policy(engine.handle)  # the trainer's side
        for adapter in plan.adapters:
            policy.add_adapter(adapter, lora)
        with torch.no_grad():  # identical non-zero adapters on both engines
            gen = torch.Generator().manual_seed(0)
            for pname, p in policy.model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        engine.load_adapters(policy.export(plan.adapters))
    items = make_arithmetic(examples, seed=5)
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    out: dict = {"runs": {n: [] for n in engines}}
    for name, engine in engines.items():  # warm-up
        run_rollouts(program, items[:1], engine, repeats=1, adapters=plan.role_adapters, sampling=sampling)
    for _ in range(repeats):
        for name, engine in engines.items():
            out["runs"][name].append(rollout_tok_s(program, items, engine, group_size=group_size,
                                                   adapters=plan.role_adapters, sampling=sampling))
    for name in engines:
        out[f"{name}_tok_s"] = round(statistics.median(out["runs"][name]), 1)
    out["ratio_vllm_over_hf"] = round(out["vllm_tok_s"] / out["hf_tok_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--dtype", default="float32", help="vLLM dtype (float32 matches the HF engine; bfloat16)")
    ap.add_argument("--parts", default="handoff,rollouts", help="comma-separated: handoff, rollouts")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    logging.getLogger("dspy").setLevel(logging.ERROR)

    from wfc.engines.hf import HFEngine
    from wfc.engines.vllm import VLLMEngine

    engine = VLLMEngine(args.model, dtype=args.dtype, max_loras=8)
    result: dict = {"model": args.model, "dtype": args.dtype,
                    "vllm_startup_s": round(engine.stats["startup_seconds"], 2)}
    if "handoff" in parts:
        result["handoff"] = bench_handoff(engine, repeats=args.repeats)
    engine.close()
    print(f"model {args.model}, vLLM dtype {args.dtype}, vLLM start-up {result['vllm_startup_s']} s")
    if "handoff" in parts:
        h = result["handoff"]
        print(f"{'hand-off':<28} {'seconds (median)':>16} {'bytes':>14}")
        print(f"{'adapter-only (wfc)':<28} {h['adapter_only_s']:>16.4f} {h['adapter_bytes']:>14,}")
        print(f"{'full-weight reload':<28} {h['full_reload_s']:>16.4f} {h['full_bytes']:>14,}")
        print(f"speed-up adapter-only vs full: {h['speedup']}x  (goal >= 20x)")
    if "rollouts" in parts:
        engines = {"hf": HFEngine(args.model), "vllm": VLLMEngine(args.model, dtype=args.dtype, max_loras=8)}
        result["rollouts"] = r = bench_rollouts(engines, examples=args.examples, group_size=args.group_size,
                                                max_tokens=args.max_tokens, repeats=args.repeats)
        for e in engines.values():
            e.close()
        print(f"{'rollouts (4 roles, isolated)':<28} {'completion tok/s (median)':>26}")
        print(f"{'HF engine':<28} {r['hf_tok_s']:>26.1f}\n{'vLLM engine':<28} {r['vllm_tok_s']:>26.1f}")
        print(f"ratio vLLM / HF: {r['ratio_vllm_over_hf']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
