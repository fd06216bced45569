"""`make demo`: compile a Voting workflow on arithmetic word problems, on the embedded SmolLM2-135M (CPU).

Recipe (``wide-warmup`` in compilers/recipes.py): mmGRPO on one shared LoRA adapter with verified per-role credit
(voters on their own answers, the aggregator only when a voter was right), DAPO dynamic sampling (flat examples
replaced, two draw rounds at most) and keep-best validation on 100 problems; 14 steps of 8 kept problems x 4
rollouts, 12 new tokens per call, T=0.7, learning rate 6e-4 reached over the first two steps (3e-4 at step 1);
Voting(n=3, skip_unanimous=True). Every training call samples with its own seed, so a seed's run repeats (README,
"Resume"). Prints the role graph, held-out accuracy on 300 problems before and after (with 95% intervals), saves
the artifact, loads it back and answers one question. The measured variant that ends every answer at its first
line (recipe ``finish``: 20 tokens, penalty 0.2 on cut calls) is ``WFC_DEMO_RECIPE=finish python examples/demo.py
--stop '\\n'``.
Figures and minutes measured on the 2-core CPU: docs/results.md, "The demo's figures, per seed".

Environment: WFC_DEMO_SEED (default 0: training seed), WFC_DEMO_STEPS (default 14), WFC_DEMO_OUT (artifact dir),
WFC_DEMO_RUN_DIR (default runs/demo-seed<SEED>: checkpoints, metrics.jsonl, summary.json),
WFC_DEMO_RECIPE (default wide-warmup), WFC_DEMO_BACKEND (default shared: one LoRA for both roles; isolated: one each),
WFC_DEMO_ROLLOUT_DTYPE (default float32: one colocated model; bfloat16: a bf16 rollout engine beside the policy),
WFC_DEMO_MODEL (default smollm2-135m: the embedded model; a wfc.models name or a local model directory).
Flags for measured variants: ``--calculator`` (the roles write the arithmetic, ``programs/calculator.py`` does it),
``--set KEY=VALUE`` (repeatable, a JSON value) overrides one recipe field,
``--stop STR`` (repeatable, escapes such as ``\\n`` decoded) replaces the stop strings and ``--no-stop`` drops them
(every call runs to its budget).
"""

from __future__ import annotations

import argparse
import codecs
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path

import dspy

import wfc
from compilers import MMGRPO, evaluate
from compilers.recipes import get_recipe
from programs import Single, Voting
from programs.calculator import Calculate, with_calculator
from wfc.engines.hf import HFEngine
from wfc.rolegraph import RoleGraph
from wfc.tasks import get_task
from wfc.tasks.math import math_metric

logging.getLogger("dspy").setLevel(logging.ERROR)

SIGNATURE = dspy.Signature("question -> answer", "Solve the math word problem. Answer with just the final number.")
# compilers/recipes.py: the measured recipe behind the README figures (WFC_DEMO_RECIPE picks another one)
RECIPE_NAME = os.environ.get("WFC_DEMO_RECIPE", "wide-warmup")
RECIPE = get_recipe(RECIPE_NAME)
# 14, not 10: at 10 steps the seeds' gains spread 17 points (all still climbing); at 14 they sit within ~5 of
# their mean (docs/results.md, "The demo's figures, per seed")
STEPS = 14
# every role's stop strings unless --stop / --no-stop say otherwise. None by default: `finish` with a newline stop
# gained no more than `fast` over four runs and took longer (docs/results.md, "The demo's figures, per seed")
STOP: tuple[str, ...] = ()


def decode_stop(items) -> tuple[str, ...]:
    """Command-line stop strings with their escapes decoded (``'\\n'`` -> a newline)."""
    return tuple(codecs.decode(s, "unicode_escape") for s in items)


def add_stop_flags(parser: argparse.ArgumentParser) -> None:
    """``--stop STR`` (repeatable, escapes decoded; replaces the default :data:`STOP`) and ``--no-stop``: the flags
    by which the demo and the scripts built on its program set every role's stop strings."""
    parser.add_argument("--stop", action="append", default=None, metavar="STR",
                        help="every role stops at STR (repeatable, escapes such as \\n decoded; replaces the "
                             "default stop strings)")
    parser.add_argument("--no-stop", action="store_true", help="no stop strings: every call runs to its token budget")


def stop_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """The stop strings :func:`add_stop_flags`' flags ask for (:data:`STOP` when neither is given); both at once is
    a usage error."""
    if args.no_stop and args.stop:
        parser.error("--stop and --no-stop contradict each other: pass one")
    return () if args.no_stop else STOP if args.stop is None else decode_stop(args.stop)


def predictor(stop: tuple[str, ...] = (), cls: type[dspy.Predict] = dspy.Predict):
    """The predictor class of every role: ``cls`` (``dspy.Predict``), stopping at ``stop`` when given (each
    predictor's DSPy config, which travels in the artifact)."""
    return functools.partial(cls, stop=tuple(stop)) if stop else cls


def program(stop: tuple[str, ...] = STOP, calculator: bool = False) -> Voting:
    """``stop``: every role's calls end at the first of these strings. ``calculator``: every role's answer is the
    value of the arithmetic it writes (``programs.calculator.Calculate``); compile it with :func:`metric`'s
    ``calculator=True`` so each call is scored as the program uses it."""
    # skip_unanimous: voters that agree end the run (programs/voting.py); the aggregator decides disagreements
    return Voting(SIGNATURE, n=3, name="math-voting", skip_unanimous=True, predictor=_role_predictor(stop, calculator))


def single_program(stop: tuple[str, ...] = STOP, calculator: bool = False) -> Single:
    """One role on the demo's signature (``programs.Single``): the single-role GRPO rival of :func:`program`, with
    the same stop strings and calculator choice."""
    return Single(SIGNATURE, predictor=_role_predictor(stop, calculator))


def _role_predictor(stop: tuple[str, ...], calculator: bool):
    return predictor(stop, Calculate if calculator else dspy.Predict)


def metric(calculator: bool = False):
    """The training metric of :func:`program`: ``math_metric``, reading each call's answer through the calculator
    when the program has one (``programs.calculator.with_calculator``)."""
    return with_calculator(math_metric) if calculator else math_metric


def demo_task():
    """Disjoint splits (no question in two of them) of one-step problems with operands up to 20."""
    return get_task("arithmetic", n_train=400, n_val=100, n_test=300, seed=1, steps=1, max_operand=20)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="compile the demo's Voting workflow (see the module docstring)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one recipe field")
    add_stop_flags(ap)
    ap.add_argument("--calculator", action="store_true",
                    help="roles write the arithmetic and a calculator does it (programs/calculator.py)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.gpu_matrix import parse_set

    overrides = parse_set(args.set)
    recipe = {**RECIPE, **overrides}
    stop = stop_from_args(ap, args)
    seed = int(os.environ.get("WFC_DEMO_SEED", "0"))
    steps = int(os.environ.get("WFC_DEMO_STEPS", str(STEPS)))
    out = Path(os.environ.get("WFC_DEMO_OUT", "artifacts/math-voting"))
    run_dir = Path(os.environ.get("WFC_DEMO_RUN_DIR") or Path("runs") / f"demo-seed{seed}")
    backend = os.environ.get("WFC_DEMO_BACKEND", "shared")
    task = demo_task()
    t0 = time.time()
    dtype = os.environ.get("WFC_DEMO_ROLLOUT_DTYPE", "float32")
    # bfloat16: rollouts and evaluations on a bf16 copy of the model; compile then trains an fp32 policy of its own
    # and hands it every update's adapter (wfc/engines/hf.py). Faster, but it gained less on the demo's seeds (README,
    # "bf16 rollouts").
    engine = HFEngine(os.environ.get("WFC_DEMO_MODEL", "smollm2-135m"), dtype=dtype)
    prog = program(stop, calculator=args.calculator)
    base = evaluate(prog, task.testset, engine, metric=math_metric, adapters={}, max_tokens=recipe["max_tokens"],
                    progress="baseline")
    print(RoleGraph.from_rollouts(base["graphs"]).table())
    lo, hi = base["interval"]
    print(f"baseline accuracy on {base['n']} held-out problems: {base['accuracy']:.3f} [{lo:.2f}, {hi:.2f}] "
          f"({time.time() - t0:.0f}s)")
    compiled = MMGRPO(metric(args.calculator), **{**recipe, "steps": steps, "seed": seed}).compile(
        prog, trainset=task.trainset, valset=task.valset, engine=engine, backend=backend,
        run_dir=run_dir)
    t_train = time.time()
    after = evaluate(compiled.program, task.testset, engine, metric=math_metric, adapters=compiled.roles,
                     max_tokens=recipe["max_tokens"], progress="held-out")
    lo, hi = after["interval"]
    gain = after["accuracy"] - base["accuracy"]
    print(f"compiled accuracy on {after['n']} held-out problems: {after['accuracy']:.3f} [{lo:.2f}, {hi:.2f}] "
          f"(baseline {base['accuracy']:.3f}, gain {gain:+.3f}; best step {compiled.manifest.best_step})")
    path = compiled.save(out)
    loaded = wfc.load(path, engine=engine)
    question = task.testset[0].question
    print(f"artifact: {path}\nQ: {question}\nA: {loaded(question=question).answer}  (expected {task.testset[0].answer})")
    total = time.time() - t0
    print(f"total time {total:.0f}s")
    summary = {"seed": seed, "steps": steps, "backend": backend, "rollout_dtype": dtype,
               "recipe": RECIPE_NAME, "overrides": overrides, "stop": list(stop),
               "calculator": args.calculator,
               "baseline": base["accuracy"], "baseline_interval": base["interval"],
               "compiled": after["accuracy"], "compiled_interval": after["interval"], "gain": gain,
               "best_step": compiled.manifest.best_step, "seconds": round(total, 1),
               "seconds_final_eval": round(time.time() - t_train, 1), "artifact": str(path)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
