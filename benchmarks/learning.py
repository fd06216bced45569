"""Does compiling earn its keep? The demo recipe against the simple alternatives, over seeds, at an equal budget.

Arms (each a fresh engine on the embedded model, the demo's task and held-out split):
- ``workflow``: Voting (n=3) compiled with the demo's recipe (``compilers.presets.arithmetic``: ``wide-warmup``
  unless ``WFC_DEMO_RECIPE`` names another) for the demo's ``STEPS`` unless ``--steps`` says otherwise: what ``make
  demo`` runs. With ``--reuse-demo`` the arm is read from ``runs/demo-seed<S>/summary.json`` + ``metrics.jsonl`` (a
  finished ``make demo`` / ``WFC_DEMO_SEED=S python examples/demo.py`` run) instead of run again.
- ``single``: single-role GRPO on ``Single`` with the workflow's recipe, stopped at the same number of rollout
  completion tokens as the workflow arm of the same seed (``max_rollout_tokens``).
- ``single_pw``: ``Single`` with the ``better-together`` recipe at the same budget (the strongest one-role rival).
- ``prompt``: Voting with demos only (``prompts-only``): prompt optimization alone.

Every trained arm runs the same recipe overrides (``--set KEY=VALUE``) and every role of every arm the same stop
strings (``--stop STR``), as ``examples/demo.py`` takes them; with ``--reuse-demo`` the demo run's recorded recipe,
overrides and stop strings must equal this invocation's (else the arms would not compare like with like).

Prints and writes ``OUT/results.jsonl`` (one line per run) and ``OUT/results.md`` (mean held-out accuracy per arm with
a 95% t-interval over seeds, and the workflow's lead over each rival, paired by seed).

    python benchmarks/learning.py --seeds 0,1,2 --arms workflow,single,prompt --reuse-demo --out runs/learning
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

from compilers import MMGRPO, evaluate
from compilers.presets import arithmetic
from compilers.recipes import get_recipe
from compilers.runs import rollout_tokens
from compilers.suite_report import seed_interval
from wfc.engines.hf import HFEngine
from wfc.flags import add_set_flag, add_stop_flags, apply_overrides, parse_set, stop_from_args
from wfc.tasks.math import math_metric

ROOT = Path(__file__).resolve().parents[1]

def demo_recipe() -> str:
    """The recipe ``make demo`` runs: ``WFC_DEMO_RECIPE`` when set, else the demo preset's."""
    return os.environ.get("WFC_DEMO_RECIPE", arithmetic.RECIPE)


def arm_program(arm: str, stop: tuple[str, ...] = ()):
    """The program an arm trains: ``Single`` with the demo's signature for the single-role arms, else the demo's
    Voting; every role stops at ``stop``."""
    return arithmetic.single_program(stop) if arm.startswith("single") else arithmetic.program(stop)


def run_arm(arm: str, seed: int, steps: int, budget: int | None, out: Path, *, overrides: dict | None = None,
            stop: tuple[str, ...] = (), model: str = "smollm2-135m", recipe_name: str | None = None) -> dict:
    """One arm trained and measured on seed ``seed``; ``workflow`` and ``single`` compile with ``recipe_name``
    (default: :func:`demo_recipe`), every arm with ``overrides`` applied."""
    task = arithmetic.demo_task()
    # the single-role rival runs the workflow's own recipe: the comparison is the program, not the recipe
    name = (recipe_name or demo_recipe()) if arm in ("workflow", "single") else {
        "single_pw": "better-together", "prompt": "prompts-only"}[arm]
    recipe = apply_overrides(get_recipe(name), overrides or {})
    program = arm_program(arm, stop)
    if budget is not None and arm.startswith("single"):
        recipe.update(max_rollout_tokens=budget, steps=10 * steps)  # the budget, not the step count, stops it
    else:
        recipe.update(steps=steps)
    engine = HFEngine(model)
    t0 = time.time()
    try:
        compiled = MMGRPO(math_metric, seed=seed, **recipe).compile(
            program, trainset=task.trainset, valset=task.valset, engine=engine, backend="shared",
            run_dir=out / f"{arm}-seed{seed}")
        res = evaluate(compiled.program, task.testset, engine, metric=math_metric, adapters=compiled.roles,
                       max_tokens=recipe["max_tokens"], progress=f"{arm} held-out")
        base = evaluate(program, task.testset, engine, metric=math_metric, adapters={},
                        max_tokens=recipe["max_tokens"], progress=f"{arm} baseline")
    finally:
        engine.close()
    return {"arm": arm, "seed": seed, "accuracy": res["accuracy"], "interval": res["interval"],
            "baseline": base["accuracy"], "tokens": rollout_tokens(out / f"{arm}-seed{seed}"),
            "steps": sum(1 for r in compiled.manifest.history if r["kind"] == "step"),
            "seconds": round(time.time() - t0, 1)}


def from_demo(seed: int, *, recipe: str, overrides: dict, stop: tuple[str, ...], runs: Path = ROOT / "runs") -> dict:
    """The workflow arm from a finished demo run of ``seed``; a run made with another recipe, other overrides or
    other stop strings than the rivals will get is refused (rerun the demo, or pass its ``--set`` / ``--stop``)."""
    run = runs / f"demo-seed{seed}"
    if not (run / "summary.json").is_file():
        raise SystemExit(f"{run / 'summary.json'} is missing: run WFC_DEMO_SEED={seed} python examples/demo.py first, "
                         f"or drop --reuse-demo")
    summary = json.loads((run / "summary.json").read_text())
    ran = (summary.get("recipe"), summary.get("overrides", {}), tuple(summary.get("stop", ())))
    if ran != (recipe, overrides, stop):
        raise SystemExit(f"{run} was run with recipe {ran[0]!r}, overrides {ran[1]}, stop {list(ran[2])}; this "
                         f"comparison has recipe {recipe!r}, overrides {overrides}, stop {list(stop)}: pass the "
                         f"demo's --set / --stop here, or rerun the demo with these")
    return {"arm": "workflow", "seed": seed, "accuracy": summary["compiled"], "interval": summary["compiled_interval"],
            "baseline": summary["baseline"], "tokens": rollout_tokens(run), "steps": summary["steps"],
            "seconds": summary["seconds"], "source": str(run)}


def report(rows: list[dict]) -> str:
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    lines = ["| arm | seeds | held-out accuracy (mean, 95% CI over seeds) | baseline | rollout tokens | minutes |",
             "|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        mean, lo, hi = seed_interval([r["accuracy"] for r in mine])
        lines.append(f"| {arm} | {','.join(str(r['seed']) for r in mine)} | {mean:.3f} [{lo:.3f}, {hi:.3f}] | "
                     f"{statistics.fmean(r['baseline'] for r in mine):.3f} | "
                     f"{statistics.fmean(r['tokens'] for r in mine):.0f} | "
                     f"{statistics.fmean(r['seconds'] for r in mine) / 60:.1f} |")
    wf = {r["seed"]: r["accuracy"] for r in rows if r["arm"] == "workflow"}
    for arm in arms:
        if arm == "workflow":
            continue
        paired = [wf[r["seed"]] - r["accuracy"] for r in rows if r["arm"] == arm and r["seed"] in wf]
        if paired:
            mean, lo, hi = seed_interval(paired)
            lines.append(f"\nworkflow - {arm}: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (paired by seed, n={len(paired)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--arms", default="workflow,single,prompt")
    p.add_argument("--steps", type=int, default=None, help="the workflow's steps (default: the demo's)")
    p.add_argument("--reuse-demo", action="store_true", help="read the workflow arm from runs/demo-seed<S>")
    p.add_argument("--demo-runs", default=str(ROOT / "runs"), help="where --reuse-demo finds demo-seed<S>/")
    p.add_argument("--model", default="smollm2-135m", help="base model of the arms that run here")
    p.add_argument("--out", default="runs/learning")
    add_set_flag(p, what="recipe field of every trained arm")
    add_stop_flags(p)  # every role of every arm
    args = p.parse_args(argv)
    try:
        overrides, stop = parse_set(args.set), stop_from_args(args, arithmetic.STOP)
    except ValueError as exc:
        p.error(str(exc))
    if args.steps is None:
        args.steps = arithmetic.STEPS
    recipe_name = demo_recipe()
    logging.getLogger("dspy").setLevel(logging.ERROR)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    results = out / "results.jsonl"
    for seed in [int(s) for s in args.seeds.split(",")]:
        budget = None
        for arm in args.arms.split(","):
            if arm == "workflow" and args.reuse_demo:
                row = from_demo(seed, recipe=recipe_name, overrides=overrides, stop=stop,
                                runs=Path(args.demo_runs))
            else:
                row = run_arm(arm, seed, args.steps, budget, out, overrides=overrides, stop=stop, model=args.model,
                              recipe_name=recipe_name)
            if arm == "workflow":
                budget = row["tokens"]
            rows.append(row)
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    table = report(rows)
    (out / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
