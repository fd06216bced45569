"""Profile: where one policy-update step's time goes, naive rows vs shared-prefix packing (torch.profiler).

Same workload as ``bench_packing.py`` (one group: P-token prompt, N completions of R tokens, LoRA r=8 on q/k/v/o,
forward + backward). After one warm-up step per method, profiles one step of each and prints the operators with the
most self CPU time, grouped into attention / matmul (linear layers, LM head) / softmax / other, so the gap between
the measured speed-up and rho = N(P+R)/(P+NR) can be attributed.

    python benchmarks/profile_packing.py --model smollm2-135m --prompt-len 512 --out profile_packing.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


# operator-name fragments -> bucket (first match wins)
BUCKETS = (("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "bmm", "baddbmm")),
           ("matmul", ("addmm", "mm", "linear", "matmul")),
           ("softmax", ("softmax", "log_softmax")),
           ("mask", ("where", "masked_fill", "eq", "le", "ge", "logical")))


def bucket(name: str) -> str:
    for label, keys in BUCKETS:
        if any(k in name for k in keys):
            return label
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--r", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile

    from compilers.packing import naive_logprobs, packed_logprobs, rho
    from wfc.models import load_model

    handle = load_model(args.model)
    model = get_peft_model(handle.model, LoraConfig(r=8, lora_alpha=16,
                                                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    gen = torch.Generator().manual_seed(args.prompt_len)
    vocab = handle.model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist()
    comps = [torch.randint(0, vocab, (args.r,), generator=gen).tolist() for _ in range(args.n)]

    def step(fn) -> None:
        model.zero_grad(set_to_none=True)
        (lps,) = fn(model, [(prompt, comps)])
        torch.stack([lp.sum() for lp in lps]).sum().backward()

    result = {"model": args.model, "P": args.prompt_len, "N": args.n, "R": args.r,
              "rho": round(rho(args.prompt_len, args.r, args.n), 2)}
    for name, fn in (("naive", naive_logprobs), ("packed", packed_logprobs)):
        step(fn)  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(fn)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / 1e6
        buckets: dict[str, float] = {}
        for e in events:
            buckets[bucket(e.key)] = buckets.get(bucket(e.key), 0.0) + e.self_cpu_time_total / 1e6
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
        result[name] = {"total_s": round(total, 3), "buckets_s": {k: round(v, 3) for k, v in buckets.items()},
                        "top": [(e.key, round(e.self_cpu_time_total / 1e6, 3), e.count) for e in top]}
        print(f"\n{name}: {total:.2f} s self CPU; by bucket: "
              + ", ".join(f"{k} {v:.2f}s ({v / total:.0%})" for k, v in sorted(buckets.items(), key=lambda x: -x[1])))
        for key, secs, count in result[name]["top"]:
            print(f"  {key:<48} {secs:>8.3f} s  x{count}")
    ratio = result["naive"]["total_s"] / result["packed"]["total_s"]
    print(f"\nspeed-up (self CPU) {ratio:.2f}x vs rho {result['rho']} ({ratio / result['rho']:.0%} of rho)")
    result["speedup"] = round(ratio, 2)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
