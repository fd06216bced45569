"""Grouped key/value heads copied (transformers' ``sdpa`` on the CPU) or broadcast in the kernel (``wfc.attention``).

Two measurements in one run, so their ratio is fair on a shared machine:
1. the attention call alone at the demo's shapes (SmolLM2-135M: 9 query heads, 3 key/value heads, head size 64): a
   decode step of the voters' batch, one of the aggregators' batch, and an update's packed row;
2. one sampled voter batch of the demo (11 problems x 12 rows, 12 new tokens) through ``HFEngine`` with each
   implementation, checking the tokens are the same.

    python benchmarks/bench_gqa_attention.py [--model smollm2-135m] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _copied(q, k, v, mask):
    """What transformers' ``sdpa`` does on the CPU with a mask: its own ``repeat_kv``, then the kernel."""
    from transformers.models.llama.modeling_llama import repeat_kv

    groups = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups),
                                                            attn_mask=mask)


def _broadcast(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _ms(fn, repeats: int = 20) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1000


def kernels() -> None:
    g = torch.Generator().manual_seed(0)
    for label, (B, Q, T) in {"voters' decode step": (132, 1, 81), "aggregators' decode step": (44, 1, 150),
                             "update's packed rows": (8, 400, 400)}.items():
        q, k, v = torch.randn(B, 9, Q, 64, generator=g), torch.randn(B, 3, T, 64, generator=g), torch.randn(
            B, 3, T, 64, generator=g)
        mask = torch.zeros(B, 1, Q, T)
        mask[..., :3] = torch.finfo(torch.float32).min  # left padding
        a, b = _ms(lambda: _copied(q, k, v, mask)), _ms(lambda: _broadcast(q, k, v, mask))
        same = torch.equal(_copied(q, k, v, mask), _broadcast(q, k, v, mask))
        print(f"{label:26s} B={B:3d} Q={Q:3d} K={T:3d}: copied {a:6.2f} ms, broadcast {b:6.2f} ms "
              f"({a / b:.2f}x), bit-identical {same}")


def generation(model: str, repeats: int) -> None:
    from compilers.presets import arithmetic
    from wfc.adapter import CompactChatAdapter
    from wfc.attention import GQA_SDPA
    from wfc.engines.base import GenerationRequest, SamplingParams
    from wfc.engines.hf import HFEngine

    engine = HFEngine(model)
    base = engine.policy.base_model
    adapter = CompactChatAdapter()
    messages = [tuple(adapter.format(arithmetic.SIGNATURE, demos=[], inputs={"question": ex.question}))
                for ex in arithmetic.demo_task().trainset[:11]]
    sampling = SamplingParams(temperature=0.7, max_tokens=12)
    requests = [GenerationRequest(messages=m, sampling=sampling, seed=100 * i + j)
                for i, m in enumerate(messages) for j in range(12)]
    times: dict[str, list[float]] = {"sdpa": [], GQA_SDPA: []}
    tokens = {}
    for _ in range(repeats):
        for impl in times:  # alternated, so a slower minute of the machine hits both alike
            base.set_attn_implementation(impl)
            t = time.perf_counter()
            out = engine.generate(requests)
            times[impl].append(time.perf_counter() - t)
            tokens[impl] = [g.completion_ids for g in out]
    a, b = statistics.median(times["sdpa"]), statistics.median(times[GQA_SDPA])
    print(f"{len(requests)} sampled rows x {sampling.max_tokens} tokens (median of {repeats}): sdpa {a:.2f} s, "
          f"{GQA_SDPA} {b:.2f} s ({a / b:.2f}x); same tokens: {tokens['sdpa'] == tokens[GQA_SDPA]}")
    engine.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    kernels()
    generation(args.model, args.repeats)


if __name__ == "__main__":
    main()
