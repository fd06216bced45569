"""A short GPU check: does a compile train on the accelerator, and how fast?

Loads the model on ``--device`` (default ``auto``: CUDA when present), compiles Voting (n=3) on generated arithmetic
for ``--steps`` steps with one shared adapter, and reports per step: rollout and update seconds, completion tokens/s
of the rollouts, peak GPU memory; then asserts that the adapter changed, the base weights did not, and that every
parameter and the training math ran on the requested device. Writes the figures as JSON to ``--out``.

    python benchmarks/gpu_check.py --model /models/Qwen3-0.6B --engine hf --steps 3 --out runs/gpu_check.json
    python benchmarks/gpu_check.py --model tiny --device cpu --steps 1          # the same path on a CPU (tests do)

With ``--engine vllm`` rollouts run on in-process vLLM (the ``vllm`` package for your CUDA build) and the policy
trains beside it on the same GPU; adapters are handed over each step (``load_adapters``).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path


def length_reward(example, prediction, trace=None) -> float:
    return 1.0 / (1.0 + len(str(prediction.answer)))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="a built-in name or a local model directory")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--examples-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import torch

    from compilers import MMGRPO
    from programs import Voting
    from wfc.engines import make_engine
    from wfc.policy import Policy
    from wfc.tasks import get_task

    task = get_task("arithmetic", n_train=64, n_val=8, n_test=8, seed=1, steps=1, max_operand=20)
    t0 = time.time()
    policy = Policy(args.model, device=args.device, dtype=args.dtype)
    if args.engine == "hf":
        from wfc.engines.hf import HFEngine

        engine = HFEngine(policy=policy)
    else:
        engine = make_engine("vllm", policy.handle)
    load_s = time.time() - t0
    # base tensors by identity: peft wraps the base layers but keeps their Parameter objects
    base_before = {id(t): t.detach().clone() for t in policy.model.parameters()}
    cuda = policy.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(policy.device)
    # a random model never solves arithmetic: on it, reward answer length so groups have signal
    metric = length_reward if args.model == "tiny" else task.metric
    try:
        compiled = MMGRPO(metric, steps=args.steps, examples_per_step=args.examples_per_step,
                          group_size=args.group_size, max_tokens=args.max_tokens, temperature=0.7, eval_every=0,
                          keep="last", credit="verified").compile(
            Voting(task.signature, n=3), trainset=task.trainset, valset=task.valset, engine=engine, policy=policy,
            backend="shared", run_dir=Path(args.out or "runs/gpu_check.json").with_suffix("") / "run",
            progress=False)
    finally:
        engine.close()
    steps = [r for r in compiled.manifest.history if r["kind"] == "step"]
    changed = unchanged_base = base_total = 0
    for n, t in policy.model.named_parameters():
        if "lora_B" in n:  # zero at creation: non-zero means an update reached it
            changed += bool(t.detach().abs().sum() > 0)
        elif id(t) in base_before:
            base_total += 1
            unchanged_base += torch.equal(t.detach(), base_before[id(t)])
    devices = sorted({str(t.device) for t in policy.model.parameters()})
    report = {
        "model": args.model, "device": str(policy.device), "parameter_devices": devices, "dtype": args.dtype,
        "engine": args.engine, "load_seconds": round(load_s, 2),
        "gpu": torch.cuda.get_device_name(policy.device) if cuda else None,
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated(policy.device) / 2**30, 2) if cuda else None,
        "steps": [{"step": r["step"], "seconds_rollout": r["seconds_rollout"], "seconds_update": r["seconds_update"],
                   "completion_tokens": r["drawing"]["completion_tokens"],
                   "rollout_tok_s": round(r["drawing"]["completion_tokens"] / max(r["seconds_rollout"], 1e-9), 1),
                   "reward_mean": r["reward_mean"]} for r in steps],
        "lora_tensors_changed": changed, "base_tensors_unchanged": unchanged_base,
        "base_tensors": base_total,
    }
    ok = changed > 0 and 0 < base_total == unchanged_base and devices == [str(policy.device)]
    report["ok"] = ok
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    if not ok:
        raise SystemExit("gpu_check FAILED: the adapter did not train, the base moved, or a tensor is off-device")
    return report


if __name__ == "__main__":
    main()
