"""What a packed row costs to train, and how the update packs a step's aggregator rows (``compilers.update._packs``).

Two measurements in one run, so their ratios are fair on a shared machine:
1. **fit**: one forward + backward through LoRA (r=16, all linear layers) over the same number of tokens cut into
   rows of 256 ... 2,048 tokens; time ``~ c + k * T`` at a fixed token count gives the row length
   ``ATTENTION_TOKENS = c / k`` at which a row's attention costs as much as the rest (``compilers.packing``);
2. **aggregator step**: ``update_adapter`` on the aggregator rows of ``--examples`` demo problems (two distinct
   candidate lists each, real prompts, 12-token completions), packed four ways: every distinct prompt apart;
   merged on shared prefixes with a linear cost (before: the whole step's rows in one row, since all share the
   system turn); merged with the quadratic cost, micro-batches filled as the budget allows; and the same with
   ``MIN_FILL`` (now). Methods alternate within every repeat, their order flipped every other one.

    python benchmarks/bench_pack_cost.py [--model smollm2-135m] [--examples 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time

import torch


def _engine(model: str):
    """An HF engine whose policy carries the demo's LoRA (r=16, all linear layers) as ``shared``."""
    from compilers.config import LoraSettings
    from wfc.engines.hf import HFEngine

    engine = HFEngine(model)
    engine.policy.add_adapter("shared", LoraSettings().peft_config())
    return engine


def fit(policy, total: int, repeats: int) -> float:
    """Prints seconds per length; returns the fitted ``c / k`` (tokens)."""
    from compilers.packing import packed_logprobs

    rng = random.Random(0)
    vocab = policy.tokenizer.vocab_size
    lengths = [t for t in (256, 512, 1024, 2048) if t <= total]
    times: dict[int, list[float]] = {t: [] for t in lengths}
    with policy.training() as model:
        for _ in range(repeats + 1):  # the first round warms up
            for T in lengths:
                # one prompt of T - 48 tokens and four 12-token completions per row: a GRPO group's packed row
                groups = [([rng.randrange(5, vocab) for _ in range(T - 48)],
                           [[rng.randrange(5, vocab) for _ in range(12)] for _ in range(4)]) for _ in range(total // T)]
                t = time.perf_counter()
                lps = packed_logprobs(model, groups, token_budget=1 << 30)
                torch.stack([x.sum() for g in lps for x in g]).sum().backward()
                model.zero_grad(set_to_none=True)
                times[T].append(time.perf_counter() - t)
    best = {T: min(v[1:]) for T, v in times.items()}
    for T in lengths:
        print(f"rows of {T:5d} tokens x {total // T:2d}: {best[T]:6.2f} s (min of {repeats})")
    lo, hi = lengths[0], lengths[-1]
    k = (best[hi] - best[lo]) / (hi - lo)
    c = best[lo] - k * lo
    fitted = c / k if k > 0 else float("inf")
    print(f"fit: time ~ {c:.2f} s + {k * 1000:.3f} ms x row length -> attention_tokens ~ {fitted:,.0f}")
    return fitted


def aggregator_rows(engine, examples: int) -> list:
    """The rows the update gets for the aggregator calls of ``examples`` demo problems: the prompt ids the engine
    conditions on (``HFEngine.encode_prompt``), random 12-token completions and +-1 advantages."""
    from compilers.presets import arithmetic
    from compilers.update import Row
    from wfc.adapter import CompactChatAdapter

    rng = random.Random(1)
    vocab, adapter = engine.tokenizer.vocab_size, CompactChatAdapter()
    signature = arithmetic.program().aggregator.signature
    rows = []
    for i, ex in enumerate(arithmetic.demo_task().trainset[:examples]):
        for j in range(2):
            inputs = {"question": ex.question, "candidates": [f"{i + j} apples", f"{2 * i + j}", f"{j + 7}"]}
            prompt = tuple(engine.encode_prompt(adapter.format(signature, demos=[], inputs=inputs)))
            rows.append(Row("shared", "aggregator", prompt, [rng.randrange(5, vocab) for _ in range(12)],
                            rng.choice([-1.0, 1.0])))
    return rows


def aggregator_step(engine, examples: int, repeats: int) -> dict[str, float]:
    import compilers.update as update_mod
    from compilers.config import MMGRPOConfig, UpdateConfig
    from compilers.packing import plan_microbatches
    from compilers.recipes import get_recipe
    from compilers.update import AdapterOptimizers, update_adapter

    policy = engine.policy
    rows = aggregator_rows(engine, examples)
    recipe = get_recipe("wide-warmup")
    config = MMGRPOConfig(**{k: v for k, v in recipe.items() if k in MMGRPOConfig.model_fields})
    original, fill = update_mod._packs, update_mod.MIN_FILL
    methods = {"apart": (functools.partial(original, min_shared=10**9), fill),
               "merged, linear cost (before)": (functools.partial(original, attention_tokens=None), 0.0),
               "merged, quadratic cost": (original, 0.0),
               f"quadratic, fill >= {fill} (now)": (original, fill)}
    optimizers = AdapterOptimizers(policy, ["shared"], lr=1e-7)
    times: dict[str, list[float]] = {m: [] for m in methods}
    try:
        for r in range(repeats + 1):  # the first round warms up
            for name in (list(methods) if r % 2 == 0 else list(methods)[::-1]):
                update_mod._packs, update_mod.MIN_FILL = methods[name]
                with policy.training() as model:
                    t = time.perf_counter()
                    update_adapter(model, optimizers.optimizers["shared"], rows, config=config.section(UpdateConfig),
                                   temperature=config.temperature)
                    times[name].append(time.perf_counter() - t)
    finally:
        update_mod._packs, update_mod.MIN_FILL = original, fill
    out = {}
    for name, (pack, min_fill) in methods.items():
        lengths = [len(p) + sum(len(rows[i].prompt_ids) - len(p) + len(rows[i].completion_ids) for i in idx)
                   for p, idx in pack(rows)]
        plan = plan_microbatches(lengths, config.token_budget, min_fill=min_fill)
        padded = sum(len(mb) * max(lengths[i] for i in mb) for mb in plan)
        out[name] = statistics.median(times[name][1:])
        print(f"{name:32s}: {len(lengths):2d} rows, longest {max(lengths):5d}, {sum(lengths):6,d} tokens, "
              f"{len(plan)} micro-batches of {padded:6,d} padded: median {out[name]:6.2f} s, "
              f"min {min(times[name][1:]):6.2f} s")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--examples", type=int, default=20, help="demo problems whose aggregator rows make the step")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per forward + backward in the fit")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    engine = _engine(args.model)
    fit(engine.policy, args.tokens, args.repeats)
    aggregator_step(engine, args.examples, args.repeats)


if __name__ == "__main__":
    main()
