"""Sampled rollout batches on the HF engine in fp32 and in bf16 (the engine's own weights; LoRA handed over).

    python benchmarks/bench_rollout_dtype.py [--model smollm2-135m] [--problems 6] [--copies 24] [--repeats 2] [--out F]

One batch is the demo's voter workload: ``--problems`` arithmetic problems x ``--copies`` sampled calls (8 rollouts x 3
voters), 12 new tokens, T=0.7, first without an adapter and then with a LoRA adapter (the trainer's, handed over with
``load_adapters``). Each dtype runs in a fresh engine; a warm-up batch comes first. Reports seconds per batch
(best of ``--repeats``) and the ratio to fp32, measured in one run (the machine is shared: compare ratios).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from compilers.config import LoraSettings
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.engines.hf import HFEngine
from wfc.policy import Policy
from wfc.tasks import get_task

INSTRUCTIONS = "Solve the math word problem. Answer with just the final number."


def batch(questions: list[str], copies: int, adapter: str | None) -> list[GenerationRequest]:
    sampling = SamplingParams(temperature=0.7, max_tokens=12)
    return [GenerationRequest(messages=({"role": "system", "content": INSTRUCTIONS},
                                        {"role": "user", "content": f"{q}\nReply with only the answer."}),
                              adapter=adapter, sampling=sampling)
            for q in questions for _ in range(copies)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--problems", type=int, default=6)
    ap.add_argument("--copies", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    questions = [ex.question for ex in get_task("arithmetic", n_train=args.problems, n_val=1, n_test=1, seed=1,
                                                steps=1, max_operand=20).trainset]
    trainer = Policy(args.model, device="cpu")
    trainer.add_adapter("shared", LoraSettings().peft_config())
    revisions = trainer.export(["shared"])
    results: dict[str, dict[str, float]] = {}
    for dtype in ("float32", "bfloat16"):
        engine = HFEngine(args.model, dtype=dtype, device="cpu")
        try:
            engine.load_adapters(revisions)
            for adapter in (None, "shared"):
                engine.generate(batch(questions[:1], 8, adapter))  # warm-up
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    engine.generate(batch(questions, args.copies, adapter))
                    times.append(time.perf_counter() - t0)
                results.setdefault(dtype, {})["base" if adapter is None else "lora"] = round(min(times), 2)
        finally:
            engine.close()
    for kind in ("base", "lora"):
        results.setdefault("speedup", {})[kind] = round(results["float32"][kind] / results["bfloat16"][kind], 2)
    text = json.dumps({"rows": args.problems * args.copies, **results}, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
