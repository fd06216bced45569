"""Benchmark: one GRPO policy-update step (forward + backward through LoRA), naive rows vs shared-prefix packing.

One group of N completions of R tokens after a P-token prompt, LoRA r=8 on q/k/v/o. Both methods apply the LM head
only at predicting positions, so the measured speedup isolates the packing (theory: rho = N(P+R)/(P+NR)).
Each P runs in a fresh subprocess; inside it naive and packed steps alternate (order flipped every repeat) so CPU
contention from other processes hits both alike. Time: median and min over repeats. Memory: the peak RSS (sampled
every 2 ms) above the RSS just before the step, after gc + malloc_trim; max over repeats.

    python benchmarks/bench_packing.py --model tiny --prompt-lens 128,512,1024 --out bench_packing.json
    python benchmarks/bench_packing.py --model smollm2-135m --prompt-lens 512 --warmup 0 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples this process's RSS in a thread; ``peak`` is the largest value seen while running."""

    def __init__(self, every_s: float = 0.002):
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()

    def __enter__(self):
        self.peak = _rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(self.every_s)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _trim() -> None:
    """Collect garbage and hand freed heap back to the OS, so the next RSS baseline is honest (glibc only)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def worker(args) -> dict:
    """Both methods for one P in this process: steps alternate naive/packed so CPU contention hits both alike."""
    import torch
    from peft import LoraConfig, get_peft_model

    from compilers.packing import naive_logprobs, packed_logprobs
    from wfc.models import load_model

    torch.manual_seed(0)
    handle = load_model(args.model)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(handle.model, config)
    vocab = handle.model.config.vocab_size
    gen = torch.Generator().manual_seed(args.prompt_len)
    prompt = torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist()
    comps = [torch.randint(0, vocab, (args.r,), generator=gen).tolist() for _ in range(args.n)]
    adv = torch.randn(args.n, generator=gen)  # one advantage per completion, as in GRPO
    fns = {"naive": naive_logprobs, "packed": packed_logprobs}

    last: dict[str, torch.Tensor] = {}  # per-token log-probs of each method's last step, to check exactness

    def step(method: str) -> float:
        model.zero_grad(set_to_none=True)
        (lps,) = fns[method](model, [(prompt, comps)])
        loss = -sum((lp * a).sum() for lp, a in zip(lps, adv)) / (args.n * args.r)
        loss.backward()
        last[method] = torch.cat(lps).detach()
        return loss.item()

    for _ in range(args.warmup):
        for method in fns:
            step(method)
    res = {m: {"times_s": [], "peak_mb": 0.0, "loss": None} for m in fns}
    for rep in range(args.repeats):
        for method in (["packed", "naive"] if rep % 2 == 0 else ["naive", "packed"]):
            _trim()
            base = _rss()
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                res[method]["loss"] = step(method)
                res[method]["times_s"].append(time.perf_counter() - t0)
            res[method]["peak_mb"] = max(res[method]["peak_mb"], (mem.peak - base) / 2**20)
    for r in res.values():
        r["time_s"], r["time_min_s"] = statistics.median(r["times_s"]), min(r["times_s"])
    res["logprob_max_abs_diff"] = (last["naive"] - last["packed"]).abs().max().item()
    return res


def run_one(args, P: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--prompt-len", str(P), "--model", args.model,
           "--n", str(args.n), "--r", str(args.r), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"P={P} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny | smollm2-135m | a local model dir")
    p.add_argument("--prompt-lens", default="128,512,1024", help="comma-separated prompt lengths P")
    p.add_argument("--n", type=int, default=8, help="completions per group (N)")
    p.add_argument("--r", type=int, default=64, help="tokens per completion (R)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prompt-len", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return

    from compilers.packing import rho

    rows = []
    header = (f"{'P':>5} {'tok naive':>9} {'tok pack':>8} {'rho':>5} {'naive s':>8} {'packed s':>8} {'speedup':>7} "
              f"{'(min)':>6} {'naive MB':>8} {'pack MB':>8} {'mem x':>6} {'max|dlp|':>8}")
    print(f"model={args.model} N={args.n} R={args.r} LoRA r=8 q/k/v/o, {args.warmup} warm-up, "
          f"median (and min) of {args.repeats} fwd+bwd steps\n{header}", flush=True)
    for P in [int(x) for x in args.prompt_lens.split(",")]:
        both = run_one(args, P)
        naive, packed = both["naive"], both["packed"]
        row = {
            "P": P, "N": args.n, "R": args.r,
            "tokens_naive": args.n * (P + args.r), "tokens_packed": P + args.n * args.r,
            "rho": rho(P, args.r, args.n), "naive": naive, "packed": packed,
            "speedup": naive["time_s"] / packed["time_s"],
            "speedup_min": naive["time_min_s"] / packed["time_min_s"],
            "mem_ratio": naive["peak_mb"] / max(packed["peak_mb"], 1e-9),
            "loss_abs_diff": abs(naive["loss"] - packed["loss"]),
            "logprob_max_abs_diff": both["logprob_max_abs_diff"],
        }
        rows.append(row)
        print(f"{P:>5} {row['tokens_naive']:>9} {row['tokens_packed']:>8} {row['rho']:>5.2f} {naive['time_s']:>8.3f} "
              f"{packed['time_s']:>8.3f} {row['speedup']:>6.2f}x {row['speedup_min']:>5.2f}x {naive['peak_mb']:>8.1f} "
              f"{packed['peak_mb']:>8.1f} {row['mem_ratio']:>5.2f}x {row['logprob_max_abs_diff']:>8.1e}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "rows": rows}, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
