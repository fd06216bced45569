"""Benchmark: what giving freed memory back after each engine batch (``wfc.memory``) costs and saves.

One process, the ChainOfThought demo's program with three demos in its prompt (prompts about 4x longer than without,
as in ``examples/cot_demo.py``), sampled on ``--examples`` training problems x ``--repeats`` runs per round; rounds
alternate the release on and off (off: ``wfc.engines.hf.release_freed_memory`` replaced by a no-op, the code before
the change), so both see the same machine load. Per round: seconds, resident memory after the round (what the
process holds between batches) and the peak so far.

    python benchmarks/bench_release.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import dspy

import wfc.engines.hf as hf
from programs.agents import math_cot
from wfc.engines.base import SamplingParams
from wfc.engines.hf import HFEngine
from wfc.lower import run_rollouts
from wfc.memory import release_freed_memory
from wfc.tasks import get_task

DEMOS = [("Zoe has 13 marbles. She buys 7 more. How many marbles does Zoe have now?", "1. 13 + 7 = 20", 20),
         ("Ivy has 13 cards. She buys 14 more. How many cards does Ivy have now?", "1. 13 + 14 = 27", 27),
         ("Zoe has 3 cookies. She sells 1 cookies. How many cookies does Zoe have now?", "1. 3 - 1 = 2", 2)]


def _rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=6, help="alternating on/off, so an even number")
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    task = get_task("arithmetic", n_train=400, n_val=100, n_test=300, seed=1, steps=1, max_operand=20)
    engine = HFEngine(args.model, max_batch=args.max_batch)
    program = math_cot(24)
    program.predict.demos = [dspy.Example(question=q, reasoning=r, answer=a).with_inputs("question")
                             for q, r, a in DEMOS]
    pool = list(task.trainset)[:args.examples]
    rows = []
    for r in range(args.rounds):
        release = r % 2 == 0
        hf.release_freed_memory = release_freed_memory if release else (lambda: False)
        t0 = time.time()
        run_rollouts(program, pool, engine, repeats=args.repeats, adapters={},
                     sampling=SamplingParams(temperature=0.7, max_tokens=64))
        rows.append({"round": r, "release": release, "seconds": round(time.time() - t0, 2),
                     "rss_after_gib": round(_rss_gib(), 2),
                     "peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)})
        print(json.dumps(rows[-1]), flush=True)
    hf.release_freed_memory = release_freed_memory
    measured = rows[2:]  # rounds 0-1 warm the caches up (tokenizer, grammars)
    summary = {k: {"seconds": statistics.median(x["seconds"] for x in measured if x["release"] == on),
                   "rss_after_gib": statistics.median(x["rss_after_gib"] for x in measured if x["release"] == on)}
               for k, on in (("release", True), ("no_release", False))}
    summary["time_ratio"] = summary["release"]["seconds"] / summary["no_release"]["seconds"]
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rounds": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
