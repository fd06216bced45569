"""Benchmark: peak RSS of a short mmGRPO compile of a 4-role program, backend="isolated" vs "shared".

The program (``FourRoles``): planner -> ``n`` parallel solvers (one role with fan-out) -> checker -> finalizer, on
the arithmetic task. Each (backend, repeat) runs in a fresh subprocess, one at a time, alternating backends; a child
reports ``ru_maxrss`` (peak RSS of the whole process: libraries + base model + adapters + optimizer states +
activations) and its RSS right after loading the model (safetensors weights are memory-mapped and page in on first
use, so "added" includes them), so the table shows the total ratio (issue goal: isolated at most 1.15x shared) and
what training added on top. Each run also reports ``trained_rows``: peaks are only comparable between runs that
trained as many rows (the update's activations dominate the peak). The reward is a length metric with spread in
every group, so every step trains every role in both backends (with the task's exact-match metric the tiny model
scores 0 everywhere, no row is trained, and the peak then only says whether an update happened).

    python benchmarks/bench_memory.py --model tiny
    python benchmarks/bench_memory.py --model smollm2-135m --steps 2 --repeats 1 --out bench_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def four_roles(signature, *, n: int = 2):
    """A 4-role program: planner, solver (``n`` in parallel), checker, finalizer."""
    import dspy

    from programs._fields import derive, primary_output, task_signature
    from wfc.lower import parallel_map
    from wfc.program import Program

    class FourRoles(Program):
        def __init__(self):
            super().__init__(name="four_roles")
            sig = task_signature(signature)
            self.output = primary_output(sig)
            self.planner = dspy.Predict(derive(sig, instructions="Write a one-line plan to solve the task.",
                                               outputs={"plan": (str, "the plan")}))
            self.solver = dspy.Predict(derive(sig, instructions=f"{sig.instructions.strip()}\nFollow the plan.",
                                              extra_inputs={"plan": (str, "the plan")}))
            self.checker = dspy.Predict(derive(sig, outputs_as_inputs=True,
                                               instructions="Check the proposed answer. Reply 'correct' or "
                                                            "'incorrect' with the reason.",
                                               outputs={"verdict": (str, "the verdict")}))
            self.finalizer = dspy.Predict(derive(
                sig, instructions=f"{sig.instructions.strip()}\nGive the final answer.",
                extra_inputs={"candidates": (list[str], "proposed answers"), "verdict": (str, "a check")}))

        def forward(self, **inputs):
            plan = self.planner(**inputs).plan
            answers = parallel_map(lambda _: self.solver(**inputs, plan=plan), range(n))
            first = getattr(answers[0], self.output)
            verdict = self.checker(**inputs, **{self.output: first}).verdict
            return self.finalizer(**inputs, candidates=[str(getattr(a, self.output)) for a in answers],
                                  verdict=verdict)

    return FourRoles()


def child(args) -> dict:
    import torch

    from compilers import MMGRPO
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model
    from wfc.tasks import get_task

    torch.set_num_threads(args.threads)
    task = get_task("arithmetic")
    engine = HFEngine(load_model(args.model), batch_wait_s=0.05)
    loaded = _rss()
    t0 = time.time()
    def length_metric(example, prediction, trace=None):  # spread in every group: every step trains
        return (len(str(prediction.answer)) % 4) / 3.0

    run_dir = Path(args.run_dir) / f"{args.backend}-{os.getpid()}"
    compiled = MMGRPO(length_metric, steps=args.steps, examples_per_step=2, group_size=4, max_tokens=args.max_tokens,
                      eval_every=0, metric_failure_score=0.0).compile(
        four_roles(task.signature), trainset=task.trainset, engine=engine, backend=args.backend,
        run_dir=run_dir, progress=False)
    seconds = time.time() - t0
    engine.close()
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = sum(a["trained_rows"] for r in steps if r["kind"] == "step" for a in r["adapters"].values())
    return {"backend": args.backend, "model": args.model, "adapters": sorted(set(compiled.roles.values())),
            "trained_rows": trained,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
            "loaded_rss_mb": loaded / 2**20, "seconds": round(seconds, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--run-dir", default="/tmp/wfc-bench-memory")
    p.add_argument("--out", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="shared", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return
    results = []
    for r in range(args.repeats):
        for backend in (["shared", "isolated"] if r % 2 == 0 else ["isolated", "shared"]):
            cmd = [sys.executable, __file__, "--child", "--backend", backend, "--model", args.model,
                   "--steps", str(args.steps), "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
                   "--run-dir", args.run_dir]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"child failed ({backend}):\n{out.stderr[-3000:]}")
            results.append(json.loads(line[len("RESULT "):]))
            print(json.dumps(results[-1]), flush=True)
    peak = {b: statistics.median(x["peak_rss_mb"] for x in results if x["backend"] == b)
            for b in ("shared", "isolated")}
    added = {b: statistics.median(x["peak_rss_mb"] - x["loaded_rss_mb"] for x in results if x["backend"] == b)
             for b in ("shared", "isolated")}
    summary = {"model": args.model, "steps": args.steps, "peak_rss_mb": peak, "added_over_loaded_mb": added,
               "ratio_isolated_over_shared": peak["isolated"] / peak["shared"]}
    print(f"peak RSS  shared {peak['shared']:.0f} MB, isolated {peak['isolated']:.0f} MB: "
          f"{summary['ratio_isolated_over_shared']:.3f}x  (above the loaded model: shared {added['shared']:.0f} MB, "
          f"isolated {added['isolated']:.0f} MB)")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
