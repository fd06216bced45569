"""A code workflow compiled end to end: EvalOpt (writer -> reviewer -> fixer) on generated function-writing tasks.

Each rollout's code runs against the task's tests in the sandbox (``wfc.tasks.sandbox``). Trains with a named recipe
(``compilers/recipes.py``; default ``wide-warmup``, what ``make demo`` runs: verified credit, so the reviewer is
scored on whether its verdict matches the tests and the fixer on its own code, dynamic sampling, keep-best
validation) with ``--max-tokens`` per call instead of the recipe's (code needs more than a number), then prints
pass@1 before and after on the held-out tasks with the paired difference and its 95% interval, and the writer's
own pass rate (its code before the reviewer and fixer see it) and how often the reviewer accepted (each accept saves
a fixer call), which tell where a change came from. Measured with the defaults (70 min on the 2-core CPU), on 160
held-out tasks from 0.475: seed 0 0.756, paired +0.281 [+0.199, +0.363]; seed 1 0.681, +0.206 [+0.130, +0.282];
seed 2 0.725, +0.250 [+0.167, +0.333] (docs/tasks.md, "Example workflows"). One run needs up to ~17 GB of memory at its
update steps, so run seeds one after another on a 24 GB machine (``--set gradient_checkpointing=true``: one
step's peak 12.7 -> 9.0 GB, its update 37% slower). The script is the template for a larger model
(``--model /path/to/hf-model``).

    python examples/code_workflow.py            # = --recipe wide-warmup --steps 8 --n-val 32 --n-test 160
    python examples/code_workflow.py --resume   # a killed run continues from its checkpoint in --run-dir
    python examples/code_workflow.py --set credit=verified-strict   # override one recipe field
    python examples/code_workflow.py --choose-verdict   # the reviewer picks correct / incorrect (decoded as a choice):
                                                        # seed 0 0.569 -> 0.731, +0.163 [+0.105, +0.220], 37 min
    python examples/code_workflow.py --program single --set max_rollout_tokens=N --steps 80   # the writer alone
    python examples/code_workflow.py --check --backend isolated   # no reviewer: the prompt's example is run and a
                                                                  # failure goes to the fixer with what it returned
    python examples/code_workflow.py --check --frozen-fixer       # ... the fixer on the base model, never trained,
                                                                  # left out of training rollouts: the writer trains
                                                                  # on the whole budget
    python examples/code_workflow.py --program single --retrieved-demos 1   # each run's writer is shown the gold
                                                                  # solution of the nearest training task (wfc.retrieve)
    python examples/code_workflow.py --program retry --attempts 4   # while the prompt's example fails, the writer
                                                                  # answers again (programs.Retry; sampled at
                                                                  # --sample-retries in greedy runs)
    python examples/code_workflow.py --program retry --retrieved-demos 1 --vary-demos --sample-retries 0
                                                                  # ... each retry shown the nearest training task
                                                                  # with another solution instead, greedy

Held-out tasks whose gold solution is also a training task's (the functions without parameters, and repeated
parameters) are scored apart in ``summary.json`` (``unseen``: accuracy on the rest), since a retrieved demo of such
a task holds its answer.

Each run writes ``summary.json`` and ``tasks.jsonl`` (per held-out task, before and after) to its run folder;
``benchmarks/paired_runs.py A B`` pairs two runs task by task, and ``benchmarks/compose_check.py ARTIFACT`` measures
a trained writer inside ``EvalOpt(check=example_check)`` with the fixer on the base model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from compilers import MMGRPO, evaluate
from compilers.recipes import get_recipe
from compilers.score import call_metric, paired_difference
from programs import EvalOpt, Retry, Single
from programs.eval_opt import accepted
from wfc.engines.hf import HFEngine
from wfc.tasks import get_task
from wfc.tasks.visible import example_check

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_matrix import parse_set  # noqa: E402  (benchmarks/ is a folder of scripts, not a package on the path)
from learning import workflow_tokens  # noqa: E402

logging.getLogger("dspy").setLevel(logging.ERROR)


def _ok_calls(graph, role: str) -> list:
    """``graph``'s ok calls with outputs of EvalOpt's role ``role`` (matched on the role path's last name)."""
    return [c for c in graph.calls if c.role.split(".")[-1] == role and c.status == "ok" and c.outputs]


def _first_answer(graph) -> list:
    """The writer's code as a one-call list (EvalOpt's generator's, Retry's first solver call), or [] when that call
    failed."""
    first = [c for c in graph.calls if c.role.split(".")[-1] in ("generator", "solver")][:1]
    return [c for c in first if c.status == "ok" and c.outputs]


def _revisions_made(graph) -> int:
    """Calls that replaced the writer's code: EvalOpt's fixer calls, Retry's solver calls after the first."""
    last = [c.role.split(".")[-1] for c in graph.calls]
    return last.count("optimizer") + max(last.count("solver") - 1, 0)


def writer_pass_rate(graphs, metric) -> float:
    """Mean metric of the writer's own code (EvalOpt's generator's, Retry's first answer) over ``graphs``: what the
    program would score without its reviewer and fixer, or its retries. A rollout whose writer call failed scores 0."""
    scores = []
    for graph in graphs:
        writer = _first_answer(graph)
        scores.append(call_metric(metric, graph.example, writer[0].outputs, metric_failure_score=0.0)
                      if writer else 0.0)
    return sum(scores) / max(len(scores), 1)


def reviewer_agreement(graphs, metric) -> float | None:
    """Share of the rollouts whose first verdict EvalOpt acted on as the tests would: accepted when the writer's
    code passes, revised when it fails (an unreadable verdict is revised). None when no rollout has both a writer's
    and a reviewer's ok call. The reviewer decides well when this is above the writer's pass rate (what accepting
    everything would score) and above its fail rate (rejecting everything)."""
    agree = []
    for graph in graphs:
        writer, reviewer = _ok_calls(graph, "generator"), _ok_calls(graph, "evaluator")
        if writer and reviewer:
            passed = call_metric(metric, graph.example, writer[0].outputs, metric_failure_score=0.0) >= 1.0
            agree.append(accepted(reviewer[0].outputs.get("verdict", "")) == passed)
    return sum(agree) / len(agree) if agree else None


def reviewer_accept_rate(graphs) -> float:
    """Share of the reviewer's (EvalOpt's evaluator's) ok calls over ``graphs`` whose verdict EvalOpt accepted
    (``programs.eval_opt.accepted``): each one is a fixer call saved. 0 when it made none."""
    verdicts = [accepted(c.outputs.get("verdict", "")) for g in graphs for c in _ok_calls(g, "evaluator")]
    return sum(verdicts) / max(len(verdicts), 1)


def revisions(graphs, metric) -> dict:
    """What the fixer (EvalOpt's optimizer, Retry's later attempts) did over ``graphs``: ``revised`` (rollouts it
    was called in), ``revision_calls`` (its calls), ``fixed`` (of those rollouts, the writer's code failed the tests
    and the final code passes) and ``broken`` (the writer's passed, the final fails). The program scores the writer's
    pass rate plus (fixed - broken) / len(graphs)."""
    counts = {"revised": 0, "revision_calls": 0, "fixed": 0, "broken": 0}
    for graph in graphs:
        writer, made = _first_answer(graph), _revisions_made(graph)
        if not made:
            continue
        counts["revised"] += 1
        counts["revision_calls"] += made
        before = bool(writer) and call_metric(metric, graph.example, writer[0].outputs, metric_failure_score=0.0) >= 1
        after = bool(graph.outputs) and call_metric(metric, graph.example, graph.outputs, metric_failure_score=0.0) >= 1
        counts["fixed"] += after and not before
        counts["broken"] += before and not after
    return counts


def roles_report(graphs, metric, when: str) -> dict:
    """EvalOpt's roles over ``graphs``, keyed ``<name>_<when>``: the writer's own pass rate (``writer``), the
    reviewer's accept rate and its agreement with the tests (``reviewer_accept``, ``reviewer_agreement``; None
    when the program has no reviewer, as under ``--check``) and the fixer's counts (:func:`revisions`)."""
    has_reviewer = any(_ok_calls(g, "evaluator") for g in graphs)
    report = {"writer": writer_pass_rate(graphs, metric),
              "reviewer_accept": reviewer_accept_rate(graphs) if has_reviewer else None,
              "reviewer_agreement": reviewer_agreement(graphs, metric), **revisions(graphs, metric)}
    return {f"{name}_{when}": value for name, value in report.items()}


def _roles_line(report: dict, when: str) -> str:
    if not report:
        return ""
    accept, agreement = report[f"reviewer_accept_{when}"], report[f"reviewer_agreement_{when}"]
    agreed = "n/a" if agreement is None else f"{agreement:.0%}"
    reviewer = "" if accept is None else f"; reviewer accepted {accept:.0%}, agreed with the tests on {agreed}"
    return (f" (writer alone {report[f'writer_{when}']:.3f}{reviewer}; fixer called in {report[f'revised_{when}']} "
            f"({report[f'revision_calls_{when}']} calls), "
            f"fixed {report[f'fixed_{when}']}, broke {report[f'broken_{when}']})")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--recipe", default="wide-warmup")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--examples-per-step", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--group-size", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--eval-every", type=int, default=4, help="validate every N steps (0: never)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-val", type=int, default=32, help="validation tasks (keep-best picks the step by them)")
    ap.add_argument("--n-test", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0, help="training seed (the task splits are fixed)")
    ap.add_argument("--run-dir", default=None, help="default: runs/code-<program>")
    ap.add_argument("--out", default=None, help="default: artifacts/code-<program>")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one recipe field (a JSON value), e.g. --set credit=verified-strict")
    ap.add_argument("--program", choices=("evalopt", "single", "retry"), default="evalopt",
                    help="EvalOpt (writer -> reviewer -> fixer), the writer alone (Single) as the single-role "
                         "GRPO rival, or Retry (the writer answers again while the prompt's example fails, "
                         "programs.Retry(check=example_check)); for equal budgets add --set max_rollout_tokens=N "
                         "(N: the other run's rollout_tokens) and enough --steps for the budget to stop it")
    ap.add_argument("--attempts", type=int, default=4,
                    help="Retry: answers drawn after the first while the example fails")
    ap.add_argument("--sample-retries", type=float, default=0.8,
                    help="Retry: the temperature of those answers in greedy runs (evaluation, serving); 0: greedy "
                         "(with --vary-demos only)")
    ap.add_argument("--no-train-retries", action="store_true",
                    help="Retry: training rollouts answer once (Retry(train_retries=False)), so the compile trains "
                         "the writer as --program single does and only validation and evaluation retry")
    ap.add_argument("--vary-demos", action="store_true",
                    help="Retry with --retrieved-demos: each answer after the first is shown the nearest training "
                         "tasks whose solutions no earlier prompt showed (Retry(vary_demos=True))")
    ap.add_argument("--choose-verdict", action="store_true",
                    help="the reviewer chooses 'correct' or 'incorrect' (EvalOpt(choose_verdict=True)) instead of "
                         "writing a verdict")
    ap.add_argument("--check", action="store_true",
                    help="no reviewer: EvalOpt judges the writer's code by running the example the prompt shows "
                         "(EvalOpt(check=wfc.tasks.visible.example_check)) and tells the fixer what it returned")
    ap.add_argument("--frozen-fixer", action="store_true",
                    help="the fixer runs on the base model and is never trained (frozen_roles=['optimizer']); with "
                         "--check its calls are also left out of training rollouts (skip_frozen: they would train "
                         "nothing), so the writer trains on the whole budget")
    ap.add_argument("--fresh-fix", action="store_true",
                    help="the fixer is not shown the code it replaces, only the task and the feedback "
                         "(EvalOpt(show_previous=False)): a new attempt")
    ap.add_argument("--retrieved-demos", type=int, default=0, metavar="K",
                    help="show the writer, per run, the K training tasks nearest to its task with their gold "
                         "solutions (retrieved_demos=K, demo_labels={'code': 'solution'}); 0: off")
    ap.add_argument("--backend", default="shared", choices=("shared", "isolated", "auto"),
                    help="one adapter for every role (shared), one per role (isolated), or chosen by tracing (auto)")
    ap.add_argument("--resume", action="store_true",
                    help="continue a killed run from the checkpoint in --run-dir (same flags as that run)")
    args = ap.parse_args(argv)
    if args.retrieved_demos < 0:
        ap.error(f"--retrieved-demos must be >= 0, got {args.retrieved_demos}")
    if args.attempts < 0 or not args.sample_retries >= 0:
        ap.error(f"--attempts must be >= 0 and --sample-retries >= 0, got {args.attempts} and {args.sample_retries}")
    if args.no_train_retries and args.program != "retry":
        ap.error("--no-train-retries is a Retry option: pass it with --program retry")
    if args.vary_demos and (args.program != "retry" or not args.retrieved_demos):
        ap.error("--vary-demos shows Retry's later answers other retrieved demos: pass it with --program retry and "
                 "--retrieved-demos K")
    if args.program == "retry" and args.attempts and args.sample_retries == 0 and not args.vary_demos:
        ap.error("--sample-retries 0 (greedy retries) would repeat the first answer: pass --vary-demos too, or a "
                 "temperature")
    # different programs' runs never share a folder
    label = (args.program + (f"-{args.attempts}x{args.sample_retries:g}" if args.program == "retry" else "")
             + ("-vary" if args.vary_demos else "") + ("-first" if args.no_train_retries else "")
             + ("-check" if args.check else "") + ("-frozen" if args.frozen_fixer else "")
             + ("-fresh" if args.fresh_fix else "") + (f"-rag{args.retrieved_demos}" if args.retrieved_demos else ""))
    args.run_dir = args.run_dir or f"runs/code-{label}"
    args.out = args.out or f"artifacts/code-{label}"
    t0 = time.time()
    task = get_task("codegen", n_train=args.n_train, n_val=args.n_val, n_test=args.n_test)
    engine = HFEngine(args.model)
    if args.program in ("single", "retry"):
        if args.choose_verdict or args.check or args.frozen_fixer or args.fresh_fix:
            ap.error(f"--choose-verdict, --check, --frozen-fixer and --fresh-fix are EvalOpt options: "
                     f"{args.program.capitalize()} has no reviewer or fixer")
        program = (Single(task.signature, name="code-single") if args.program == "single" else
                   Retry(task.signature, check=example_check, attempts=args.attempts,
                         sample_retries=args.sample_retries or None, vary_demos=args.vary_demos,
                         train_retries=not args.no_train_retries, name="code-retry"))
    elif args.check and args.choose_verdict:
        ap.error("--check replaces the reviewer, so it has no verdict to choose: pass one of the two")
    else:
        program = EvalOpt(task.signature, rounds=1, choose_verdict=args.choose_verdict,
                          check=example_check if args.check else None, show_previous=not args.fresh_fix,
                          name="code-evalopt")
    recipe = {**get_recipe(args.recipe), "steps": args.steps, "max_tokens": args.max_tokens}
    for key in ("examples_per_step", "group_size", "eval_every"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    if args.frozen_fixer:
        # skipped only with --check (the measured case); compile checks on its first validation that it is exact
        recipe.update(frozen_roles=["optimizer"], skip_frozen=args.check)
    if args.retrieved_demos:
        recipe.update(retrieved_demos=args.retrieved_demos, demo_labels={"code": "solution"})
    overrides = parse_set(args.set)
    recipe.update(overrides)
    before = evaluate(program, task.testset, engine, metric=task.metric, adapters={}, max_tokens=args.max_tokens,
                      progress="before")
    roles = roles_report(before["graphs"], task.metric, "before") if args.program != "single" else {}
    print(f"pass@1 before: {before['accuracy']:.3f} on {before['n']} tasks{_roles_line(roles, 'before')}")
    compiled = MMGRPO(task.metric, seed=args.seed, **recipe).compile(
        program, trainset=task.trainset, valset=task.valset, engine=engine, backend=args.backend, run_dir=args.run_dir,
        resume=args.run_dir if args.resume else None)
    after = evaluate(compiled.program, task.testset, engine, metric=task.metric, adapters=compiled.roles,
                     max_tokens=args.max_tokens, progress="after")
    scores = {when: [float(g.reward) for g in run["graphs"]] for when, run in (("before", before), ("after", after))}
    pair = paired_difference(scores["before"], scores["after"])
    lo, hi = pair["interval"]
    by_function = paired_difference(scores["before"], scores["after"], clusters=[ex.entry_point for ex in task.testset])
    if args.program != "single":
        roles.update(roles_report(after["graphs"], task.metric, "after"))
    trained_on = {ex.solution for ex in task.trainset}
    unseen = [i for i, ex in enumerate(task.testset) if ex.solution not in trained_on]
    unseen_scores = {when: [scores[when][i] for i in unseen] for when in scores}
    print(f"pass@1 after:  {after['accuracy']:.3f} on {after['n']} tasks (best step {compiled.manifest.best_step})"
          f"{_roles_line(roles, 'after')}; paired difference {pair['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
          f"({pair['only_after']} tasks passed only after, {pair['only_before']} only before); by function "
          f"[{by_function['interval'][0]:+.3f}, {by_function['interval'][1]:+.3f}] ({by_function['clusters']} functions)")
    if unseen:
        print(f"on the {len(unseen)} tasks whose solution no training task has: "
              f"{_mean(unseen_scores['before']):.3f} -> {_mean(unseen_scores['after']):.3f}")
    print(f"artifact: {compiled.save(args.out)}")
    summary = {"program": args.program, "recipe": args.recipe, "overrides": overrides,
               "choose_verdict": args.choose_verdict, "check": args.check, "frozen_fixer": args.frozen_fixer,
               "fresh_fix": args.fresh_fix, "backend": args.backend, **recipe,
               **({"attempts": args.attempts, "sample_retries": args.sample_retries, "vary_demos": args.vary_demos,
                   "train_retries": not args.no_train_retries} if args.program == "retry" else {}),
               "seed": args.seed, "n_test": args.n_test,
               "n_val": args.n_val, "before": before["accuracy"], "after": after["accuracy"], **pair, **roles,
               "interval_by_function": by_function["interval"], "functions": by_function["clusters"],
               "unseen": {"n": len(unseen), "before": _mean(unseen_scores["before"]),
                          "after": _mean(unseen_scores["after"])},
               "best_step": compiled.manifest.best_step, "rollout_tokens": workflow_tokens(Path(args.run_dir)),
               "seconds": round(time.time() - t0, 1)}
    (Path(args.run_dir) / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    # per held-out task, in testset order: what pairs two runs' results (benchmarks/paired_runs.py)
    # (the function asked for: tasks of one function pass or fail together, so paired_runs.py clusters by it)
    (Path(args.run_dir) / "tasks.jsonl").write_text("".join(
        json.dumps({"task": i, "function": ex.entry_point, "seen_solution": ex.solution in trained_on,
                    "before": b, "after": a}) + "\n"
        for i, (ex, b, a) in enumerate(zip(task.testset, scores["before"], scores["after"]))))
    return summary


if __name__ == "__main__":
    main()
