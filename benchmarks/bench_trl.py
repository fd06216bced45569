"""Benchmark: one full GRPO step (sample, score, update) on a single-module task, wfc's mmGRPO vs TRL's GRPOTrainer.

The task is the calibration task of the field notes, generated here from a seeded RNG: "What is a + b?" /
"What is a - b?" with two-digit operands (a >= b for minus), answered by one role (``programs.Single``) with the
instruction "Answer with just the final number."; the reward is 1 when the last number in the completion equals the
answer, else 0. Issue goal: wfc at least 2x faster per step (ratio TRL / wfc >= 2).

How the two sides are made to do the same work:

- Same process, one side after the other (``--order``), same torch thread count (checked before and after each side),
  each side with its own freshly loaded fp32 copy of the same base model (``wfc.models.load_model``).
- Same prompts: TRL's conversational ``prompt`` column holds exactly the messages wfc's adapter sends for each example,
  and the script checks that both tokenize them to the same prompt ids. The train set is exactly ``--prompts``
  examples and each step uses ``--prompts`` of them, so every step of both sides sees the same prompts.
- Same sampling: ``--generations`` samples per prompt, T=1.0, top_p=1, top_k=0 (the full distribution), at most
  ``--max-tokens`` new tokens, stop at EOS (kept in the completion on both sides). Generated tokens per step are
  counted on both sides (wfc: the rollout graphs' completion ids; TRL: the ``completion_ids`` handed to the reward
  function) and reported, since early EOS makes the count differ from prompts x generations x max-tokens.
- Same update: LoRA from one ``LoraConfig`` object (r=16, alpha=32, dropout 0, all linear layers), AdamW at the same
  constant learning rate and no weight decay, grad-norm clip 1.0, Dr. GRPO (advantage = reward - group mean, no std
  scaling; TRL ``loss_type="dr_grpo", scale_rewards="none"``), beta=0 (no reference model), one optimizer step per
  generation batch (TRL: batch = prompts x generations, no gradient accumulation, ``num_iterations=1``; wfc:
  ``inner_epochs=1``), no gradient checkpointing, fp32 (TRL: ``use_cpu=True, bf16=False``).
- Timing: the first step of each side is a warm-up and is excluded; ``--steps`` steps are timed after it. wfc: from
  its ``metrics.jsonl`` (``seconds_rollout`` = generate + score, ``seconds_update`` = update + per-role stats; both
  rounded to 10 ms). TRL: a callback times each optimizer step (``on_step_begin`` -> ``on_step_end``; its logging comes
  after), and a wrapper times ``_generate_and_score_completions`` (generate + rewards + advantages); update = step -
  generation.

Differences that remain, on purpose (they are what is being compared) or because TRL allows no other way:

- wfc skips rows whose advantage is exactly 0 (all of a no-signal group) when beta=0: they add 0 to the gradient but
  still count in the loss normaliser. TRL runs forward+backward on every row. With the plain task reward most groups
  of an untrained model have no signal, so wfc's update would be nearly free and the ratio flattering. The default
  ``--reward dense`` therefore adds a tie-breaker of at most 0.01 (a hash of the completion text) to the reward on
  both sides, so every group with distinct completions has signal and both sides train the same rows; the table
  reports trained rows per step on each side. ``--reward task`` runs the plain reward (wfc's real-world behaviour).
- wfc packs each prompt with its completions into one row (exact shared-prefix log-probs) and prefills each distinct
  prompt once when generating; TRL runs prompts x generations padded rows through generate and through the loss.
- TRL 1.16 always patches the model with its fused LM head (``trl.kernels.chunked_logprob``: log-probs and entropy
  computed in vocabulary tiles, the backward recomputing each tile); without Triton (CPU) the tiles are folded with
  plain torch ops. There is no switch to turn it off. wfc applies the LM head at the predicting positions and takes a
  ``log_softmax``. TRL also computes entropies in its loss forward (``compute_entropy=True`` is hard-coded); wfc
  does not. On ``--model tiny`` (hidden 64, vocabulary 49,152) the LM head is nearly all of the update's work, so
  the tiny model's update ratio mostly measures this kernel: read the smollm2-135m figures for the real comparison.
- Loss normaliser: TRL's dr_grpo divides by rows x ``max_completion_length``; wfc ``loss_aggregation="constant"``
  divides by rows x the longest completion of the step. Same cost; the gradient scale can differ by that ratio.
- A completion that is empty after decoding scores -0.5 on wfc (format error) and 0 on TRL; timing is unaffected.
- TRL's step also holds its per-step bookkeeping (metric gathering, completion decoding), wfc's holds DSPy's
  program execution per rollout (adapter formatting and parsing, threads): each is part of that system's step.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_trl --model tiny --steps 1
    python -m benchmarks.bench_trl --model smollm2-135m --steps 3 --json bench_trl.json

Needs the ``bench`` extra (``pip install -e .[bench]``: trl 1.16.0, datasets).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import re
import statistics
import tempfile
import time
import warnings
import zlib
from pathlib import Path


INSTRUCTIONS = "Answer with just the final number."
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
_NUMBER = re.compile(r"-?\d+")


# ----- the task ---------------------------------------------------------------------------------------------------
def make_task(n: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (question, answer) pairs: two-digit ``a + b`` or ``a - b`` (a >= b), from a local seeded RNG."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        out.append((f"What is {a} {op} {b}?", str(a + b if op == "+" else a - b)))
    return out


def reward(text: str, answer: str, *, dense: bool) -> float:
    """1.0 when the last number in ``text`` equals ``answer``; ``dense`` adds a tie-breaker in [0, 0.01) that is a
    function of the text alone, so distinct completions of one group (almost) never tie (see module docstring)."""
    text = (text or "").strip()
    numbers = _NUMBER.findall(text)
    score = float(bool(numbers) and numbers[-1] == answer)
    if dense:
        score += (zlib.crc32(text.encode()) % 1000) * 1e-5
    return score


# ----- wfc --------------------------------------------------------------------------------------------------------
def _signature():
    import dspy

    return dspy.Signature("question -> answer", INSTRUCTIONS)


def prompt_messages(question: str) -> list[dict[str, str]]:
    """The chat messages wfc's adapter sends for ``question`` (TRL gets exactly these as its ``prompt``)."""
    from programs import Single
    from wfc.adapter import CompactChatAdapter

    return CompactChatAdapter().format(Single(_signature()).solver.signature, [], {"question": question})


def run_wfc(args, task, config: dict) -> dict:
    import dspy
    import torch

    from compilers.config import LoraSettings
    from compilers.mmgrpo import MMGRPO
    from programs import Single
    from wfc.engines.hf import HFEngine

    dense = args.reward == "dense"

    def metric(example, prediction, trace=None):
        return reward(prediction.answer, example.answer, dense=dense)

    trainset = [dspy.Example(question=q, answer=a).with_inputs("question") for q, a in task]
    engine = HFEngine(args.model)
    threads = torch.get_num_threads()
    optimizer = MMGRPO(
        metric, steps=1 + args.steps, examples_per_step=args.prompts, group_size=args.generations,
        temperature=1.0, max_tokens=args.max_tokens, learning_rate=config["learning_rate"], advantage="dr_grpo",
        beta=0.0, inner_epochs=1, loss_aggregation="constant", max_grad_norm=config["max_grad_norm"],
        lora=LoraSettings(**LORA), eval_every=0, seed=args.seed, metric_failure_score=0.0)
    with tempfile.TemporaryDirectory(prefix="bench-trl-wfc-") as run_dir:
        t0 = time.perf_counter()
        optimizer.compile(Single(_signature()), trainset=trainset, valset=None, engine=engine, run_dir=run_dir,
                          progress=False)
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    prompt_ids = {q: engine.encode_prompt(prompt_messages(q)) for q, _ in task}
    eos = engine.tokenizer.eos_token_id
    engine.close()
    steps = []
    for r in (r for r in records if r["kind"] == "step"):
        adapters = r["adapters"].values()
        steps.append({
            "step": r["step"],
            "seconds": r["seconds_rollout"] + r["seconds_update"],
            "generation_seconds": r["seconds_rollout"],
            "update_seconds": r["seconds_update"],
            "tokens": sum(role["tokens"] for role in r["roles"].values()),
            "rows": sum(a["rows"] for a in adapters),
            "trained_rows": sum(a["trained_rows"] for a in adapters),
            "reward_mean": r["reward_mean"],
            "no_signal_rate": r["no_signal_rate"],
        })
    return {"steps": steps, "compile_wall_seconds": wall, "threads": [threads, torch.get_num_threads()],
            "prompt_ids": prompt_ids, "eos_token_ids": [eos]}


# ----- TRL --------------------------------------------------------------------------------------------------------
def run_trl(args, task, config: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from compilers.config import LoraSettings
    from wfc.models import load_model

    dense = args.reward == "dense"
    answers = dict(task)
    tokens_seen: list[int] = []

    def correct_last_number(prompts, completions, completion_ids, answer, **kwargs):
        tokens_seen.append(sum(len(ids) for ids in completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(t, a, dense=dense) for t, a in zip(texts, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args_, state, control, **kwargs):
            self._t0 = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._t0)

    handle = load_model(args.model)
    dataset = Dataset.from_list([{"prompt": prompt_messages(q), "answer": a} for q, a in task])
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="bench-trl-trl-") as out_dir:
        grpo_args = GRPOConfig(
            output_dir=out_dir, max_steps=1 + args.steps, per_device_train_batch_size=args.prompts * args.generations,
            gradient_accumulation_steps=1, num_generations=args.generations, num_iterations=1,
            max_completion_length=args.max_tokens, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=config["learning_rate"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=config["max_grad_norm"], loss_type="dr_grpo", scale_rewards="none", beta=0.0, epsilon=0.2,
            use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=args.seed,
            logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=handle.model, processing_class=handle.tokenizer,
                              reward_funcs=correct_last_number, args=grpo_args, train_dataset=dataset,
                              peft_config=LoraSettings(**LORA).peft_config())
        trainer.remove_callback(PrinterCallback)  # per-step log dicts on stdout; they stay in state.log_history
        timer = StepTimer()
        trainer.add_callback(timer)
        gen_times: list[float] = []
        generate_and_score = trainer._generate_and_score_completions

        def timed_generate_and_score(*a, **kw):
            t0 = time.perf_counter()
            out = generate_and_score(*a, **kw)
            gen_times.append(time.perf_counter() - t0)
            return out

        trainer._generate_and_score_completions = timed_generate_and_score
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        logs = [h for h in trainer.state.log_history if "reward" in h]
        tok = trainer.processing_class
        prompt_ids = {q: list(tok.apply_chat_template(prompt_messages(q), add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)["input_ids"])
                      for q in answers}
        eos = list(trainer.eos_token_ids)
        dtype = str(next(trainer.model.parameters()).dtype)
    rows = args.prompts * args.generations
    steps = []
    for i, (sec, gen, tokens) in enumerate(zip(timer.times, gen_times, tokens_seen)):
        log = logs[i] if i < len(logs) else {}
        steps.append({
            "step": i + 1, "seconds": sec, "generation_seconds": gen, "update_seconds": sec - gen, "tokens": tokens,
            "rows": rows, "trained_rows": rows,  # TRL runs every row through forward+backward
            "reward_mean": log.get("reward"), "no_signal_rate": log.get("frac_reward_zero_std"),
        })
    del trainer, handle
    return {"steps": steps, "train_wall_seconds": wall, "threads": [threads, torch.get_num_threads()],
            "prompt_ids": prompt_ids, "eos_token_ids": eos, "param_dtype": dtype}


# ----- report -----------------------------------------------------------------------------------------------------
def summarize(side: dict) -> dict:
    timed = side["steps"][1:]  # step 1 is the warm-up
    if not timed:
        raise RuntimeError("no timed steps recorded")

    def mean(key):
        values = [s[key] for s in timed if s[key] is not None]
        return statistics.fmean(values) if values else None

    return {k: mean(k) for k in ("seconds", "generation_seconds", "update_seconds", "tokens", "rows",
                                 "trained_rows", "reward_mean", "no_signal_rate")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2-135m")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per side (after one warm-up step)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (the whole train set)")
    ap.add_argument("--generations", type=int, default=8, help="samples per prompt (group size / num_generations)")
    ap.add_argument("--max-tokens", type=int, default=12, help="max new tokens (max_completion_length)")
    ap.add_argument("--reward", choices=("dense", "task"), default="dense",
                    help="dense: task reward + a <0.01 tie-breaker so both sides train every row (default); "
                         "task: the plain reward (wfc then skips no-signal groups)")
    ap.add_argument("--order", choices=("wfc,trl", "trl,wfc"), default="wfc,trl")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here as JSON")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.prompts < 1 or args.generations < 2 or args.max_tokens < 1:
        ap.error("need --steps >= 1, --prompts >= 1, --generations >= 2, --max-tokens >= 1")
    logging.getLogger("dspy").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    task = make_task(args.prompts, seed=args.seed)
    config = {"learning_rate": 2e-4, "max_grad_norm": 1.0}
    print(f"model={args.model} prompts={args.prompts} x generations={args.generations} = "
          f"{args.prompts * args.generations} sequences/step, max new tokens {args.max_tokens}, T=1.0, "
          f"LoRA r={LORA['r']} alpha={LORA['alpha']} {LORA['target_modules']}, AdamW lr {config['learning_rate']} "
          f"(constant), Dr. GRPO, beta=0, 1 optimizer step/step, reward={args.reward}, torch threads={threads}; "
          f"1 warm-up + {args.steps} timed steps per side, order {args.order}", flush=True)
    runners = {"wfc": run_wfc, "trl": run_trl}
    results = {}
    for name in args.order.split(","):
        print(f"running {name} ...", flush=True)
        results[name] = runners[name](args, task, config)
        gc.collect()
    same_prompts = results["wfc"]["prompt_ids"] == results["trl"]["prompt_ids"]
    prompt_len = statistics.fmean(len(ids) for ids in results["wfc"]["prompt_ids"].values())
    summary = {name: summarize(results[name]) for name in ("wfc", "trl")}
    ratio = summary["trl"]["seconds"] / summary["wfc"]["seconds"]

    def fmt(v, spec):
        return format(v, spec) if v is not None else "-"

    print(f"\nprompt ids identical on both sides: {'yes' if same_prompts else 'NO'} ({prompt_len:.0f} tokens); "
          f"eos ids wfc {results['wfc']['eos_token_ids']} trl {results['trl']['eos_token_ids']}; "
          f"torch threads wfc {results['wfc']['threads']} trl {results['trl']['threads']} (before, after); "
          f"TRL parameters {results['trl']['param_dtype']}")
    print(f"{'side':<5} {'s/step':>8} {'gen s':>8} {'update s':>8} {'tokens/step':>11} {'rows/step':>9} "
          f"{'trained rows':>12} {'reward':>7} {'no-signal':>9}")
    for name in ("wfc", "trl"):
        s = summary[name]
        print(f"{name:<5} {s['seconds']:>8.2f} {s['generation_seconds']:>8.2f} {s['update_seconds']:>8.2f} "
              f"{s['tokens']:>11.1f} {s['rows']:>9.0f} {s['trained_rows']:>12.1f} {fmt(s['reward_mean'], '>7.3f')} "
              f"{fmt(s['no_signal_rate'], '>9.2f')}")
    def part(key):  # wfc's parts are rounded to 10 ms: below that a ratio means nothing
        w, t = summary["wfc"][key], summary["trl"][key]
        return f"{t / w:.2f}x" if w >= 0.01 else "n/a (wfc < 10 ms)"

    print(f"ratio TRL/wfc seconds per step: {ratio:.2f}x (goal >= 2)  "
          f"[generation {part('generation_seconds')}, update {part('update_seconds')}]")
    if summary["wfc"]["trained_rows"] < summary["trl"]["trained_rows"]:
        print("note: wfc trained fewer rows than TRL (it skips zero-advantage rows); the update work differs")
    if not same_prompts:
        print("WARNING: the two sides conditioned on different prompt ids")
    if args.json:
        out = {"args": vars(args), "config": {**config, "lora": LORA}, "torch_threads": threads,
               "prompt_ids_identical": same_prompts, "prompt_tokens": prompt_len, "summary": summary,
               "ratio_trl_over_wfc": ratio,
               "sides": {n: {k: v for k, v in r.items() if k != "prompt_ids"} for n, r in results.items()}}
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
