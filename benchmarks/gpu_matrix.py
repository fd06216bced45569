"""The seed paper's matrix on a GPU in one command: Eval-Opt, Voting, Orch-Workers x shared / isolated / auto.

    python benchmarks/gpu_matrix.py --model /models/Qwen3-0.6B --task gsm8k --seeds 0,1,2 --out runs/gpu-matrix
    python benchmarks/gpu_matrix.py --model /models/Qwen3-0.6B --engine vllm ...   # rollouts on in-process vLLM

The model is a local directory (no hub access is assumed). The policy trains on ``--device`` (default ``auto``: CUDA
when present; bf16 autocast there), rollouts run on ``--engine``. Each cell is one ``MMGRPO`` compile
(``compilers/experiment.py``); ``OUT/results.md`` holds peak / final validation accuracy, the step of the peak and
cliff events per cell, ``OUT/curves.png`` the validation curves. GSM8K needs ``WFC_DATA_DIR`` (or ``--task
arithmetic`` for generated problems). The defaults are sized for a 0.6B-8B model on one GPU; ``--set key=value``
overrides any ``MMGRPOConfig`` field. Before the matrix, run ``benchmarks/gpu_check.py`` (a few minutes).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from compilers.experiment import run_matrix
from wfc.flags import add_set_flag, apply_overrides, parse_set


GPU_CONFIG = dict(steps=60, examples_per_step=16, group_size=8, max_tokens=384, eval_max_tokens=384, temperature=1.0,
                  learning_rate=1e-5, advantage="dr_grpo", loss_aggregation="token", credit="verified",
                  eval_every=10, lora={"r": 32, "alpha": 64, "target_modules": "all-linear"})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="local model directory (e.g. Qwen3-0.6B)")
    p.add_argument("--task", default="gsm8k")
    p.add_argument("--workflows", default="evalopt,voting,orchworkers")
    p.add_argument("--backends", default="shared,isolated,auto")
    p.add_argument("--seeds", default="0")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    p.add_argument("--device", default="auto")
    p.add_argument("--val-size", type=int, default=200)
    add_set_flag(p, what="MMGRPOConfig field")
    p.add_argument("--out", default="runs/gpu-matrix")
    args = p.parse_args(argv)
    try:
        config = apply_overrides({**GPU_CONFIG, "device": args.device}, parse_set(args.set))
    except ValueError as exc:
        p.error(str(exc))
    logging.getLogger("dspy").setLevel(logging.ERROR)
    results = run_matrix(workflows=args.workflows.split(","), backends=args.backends.split(","), tasks=[args.task],
                         seeds=[int(s) for s in args.seeds.split(",")], model=args.model, out_dir=args.out,
                         config=config, val_size=args.val_size, engine=args.engine)
    print((Path(args.out) / "results.md").read_text())
    failed = [r for r in results if "error" in r]
    if failed:
        raise SystemExit(f"{len(failed)} cell(s) failed: see {args.out}/results.jsonl")


if __name__ == "__main__":
    main()
