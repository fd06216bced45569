"""Benchmark: the HF engine's token sampler (inverse CDF, ``wfc.engines.hf.sample_tokens``) against transformers'
own (``softmax`` + ``torch.multinomial``), one decode step at the demo's shape (96 rows x the model's vocabulary),
then a whole sampled batch of the demo through the engine for scale.

Both samplers draw from the same distribution (softmax of the logits at T), each timed on top of the log-softmax the
engine's recorder computes anyway; runs alternate, and the figure is the median over ``--repeats`` of each. The
batch is 4 demo questions x 24 rows (8 rollouts x 3 voters), T=0.7, 12 tokens.

    python benchmarks/bench_sampling.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> None:
    from compilers.presets import arithmetic
    from wfc.engines.base import GenerationRequest, SamplingParams
    from wfc.engines.hf import HFEngine, sample_tokens

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    engine = HFEngine(args.model)
    vocab = engine.policy.base_model.config.vocab_size
    logits = torch.randn(args.rows, vocab) * 4
    # the recorder computes these log-probs either way: each sampler is timed on top of them
    logp = torch.log_softmax(logits / 0.7, -1)
    times: dict[str, list[float]] = {"multinomial": [], "inverse_cdf": []}
    for _ in range(args.repeats):
        t = time.perf_counter()
        torch.multinomial(torch.softmax(logits / 0.7, -1), num_samples=1)
        times["multinomial"].append(time.perf_counter() - t)
        t = time.perf_counter()
        sample_tokens(logp, torch.rand(args.rows))
        times["inverse_cdf"].append(time.perf_counter() - t)
    step = {k: statistics.median(v) * 1000 for k, v in times.items()}

    questions = [e.question for e in arithmetic.demo_task().trainset[:4]]
    sampling = SamplingParams(temperature=0.7, max_tokens=12)
    requests = [GenerationRequest(messages=({"role": "system", "content": arithmetic.SIGNATURE.instructions},
                                            {"role": "user", "content": q}), sampling=sampling)
                for q in questions for _ in range(args.rows // len(questions))]
    engine._generate_batch(requests[:8], sampling)  # warm-up
    batch = []
    for _ in range(3):
        t = time.perf_counter()
        engine._generate_batch(requests, sampling)
        batch.append(time.perf_counter() - t)
    result = {"rows": args.rows, "vocab": vocab, "step_ms": step,
              "speedup_per_step": step["multinomial"] / step["inverse_cdf"],
              "saved_per_batch_s": (step["multinomial"] - step["inverse_cdf"]) * 12 / 1000,
              "batch_s": statistics.median(batch)}
    print(f"one decode step's sampling, {args.rows} x {vocab}: multinomial {step['multinomial']:.1f} ms, "
          f"inverse CDF {step['inverse_cdf']:.1f} ms ({result['speedup_per_step']:.1f}x); "
          f"a {len(requests)}-row 12-token sampled batch now takes {result['batch_s']:.2f} s "
          f"(the old sampler would add ~{result['saved_per_batch_s']:.2f} s)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
