"""A code artifact's trained writer, alone and inside EvalOpt with the prompt's example as the check, the fixer on the
base model (or, with ``--retry N``, inside ``programs.Retry``: the writer answers again while the example fails):
``python benchmarks/compose_check.py ARTIFACT``.

What it measures: how much running the example a prompt shows, and handing a failure with what it returned to an
untrained fixer, adds at inference to a writer trained by any run (``examples/code_workflow.py``, either program).
The training run is the artifact's, so both programs cost the same rollout tokens; the composed one spends a fixer
call (and a sandbox run) on each task whose shown example fails. Evaluates both greedily on the held-out code tasks
(``--n-test``, the split ``code_workflow.py`` uses), paired task by task, and prints JSON: each program's pass@1 with
its interval, the paired difference, and how many tasks the fixer fixed and broke; ``--out`` writes it with the
per-task scores.

    python benchmarks/compose_check.py artifacts/code-single            # the writer trained alone (Single)
    python benchmarks/compose_check.py artifacts/code-evalopt --role generator
    python benchmarks/compose_check.py artifacts/code-single-rag1 --retry 4   # demos and retriever carried over
    python benchmarks/compose_check.py artifacts/code-single-rag1 --retry 4 --vary-demos --sample-retries 0
                                                          # each greedy retry shown another solution's task
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import wfc
from compilers import evaluate
from compilers.presets import codegen
from compilers.score import paired_difference
from programs import EvalOpt, Retry, Single
from wfc.artifact import read_manifest
from wfc.compose import carry_role, pick_role
from wfc.tasks.visible import example_check

logging.getLogger("dspy").setLevel(logging.ERROR)


def compose(artifact: Path, writer: str, *, n_test: int = 160, model: str | None = None, retry: int = 0,
            sample_retries: float | None = 0.8, vary_demos: bool = False) -> dict:
    """The artifact's role ``writer`` alone and composed (``wfc.compose.carry_role``), on ``n_test`` held-out code
    tasks."""
    task = codegen.code_task(n_test=n_test)
    loaded = wfc.load(artifact, model=model)
    try:
        if retry:  # the writer itself answers again, sampled, while the example fails: no fixer role
            programs = {"writer": Single(task.signature, name="code-single"),
                        "checked": Retry(task.signature, check=example_check, attempts=retry,
                                         sample_retries=sample_retries, vary_demos=vary_demos, name="code-retry")}
            path, fixer = "solver", "solver"
        else:
            programs = {"writer": EvalOpt(task.signature, rounds=0, name="code-evalopt"),
                        "checked": EvalOpt(task.signature, rounds=1, check=example_check, name="code-evalopt")}
            path, fixer = "generator", "optimizer"
        for program in programs.values():
            adapter = carry_role(loaded, writer, program, path)  # the same adapter for both programs
        adapters = {path: adapter} if retry else {path: adapter, fixer: None}  # the fixer: the base model
        results = {name: evaluate(program, task.testset, loaded.engine, metric=task.metric, adapters=adapters,
                                  max_tokens=codegen.MAX_TOKENS, progress=name)
                   for name, program in programs.items()}
    finally:
        loaded.engine.close()
    scores = {name: [float(g.reward) for g in r["graphs"]] for name, r in results.items()}
    pair = paired_difference(scores["writer"], scores["checked"])
    # every call after the writer's first replaces its answer (EvalOpt's fixer, Retry's later draws)
    fixer_calls = sum(len(g.calls) - 1 for g in results["checked"]["graphs"])
    # what the calls ran on, read back from the rollout graphs (the fixer: the base model, adapter None)
    ran_on = {role: sorted({str(c.adapter) for g in results["checked"]["graphs"] for c in g.calls if c.role == role})
              for role in sorted({path, fixer})}
    return {"artifact": str(artifact), "writer_adapter": adapter, "n": n_test, "retry": retry,
            **({"sample_retries": sample_retries, "vary_demos": vary_demos} if retry else {}),
            **{name: {"pass@1": r["accuracy"], "interval": r["interval"]} for name, r in results.items()},
            "checked_minus_writer": pair, "fixer_calls": fixer_calls, "ran_on": ran_on, "fixed": pair["only_after"],
            "broken": pair["only_before"], "tasks": scores}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--role", default=None, help="the writer's role in the artifact (default: its only role, else "
                                                  "'generator')")
    ap.add_argument("--n-test", type=int, default=160)
    ap.add_argument("--model", default=None, help="where the base weights come from (default: the artifact's)")
    ap.add_argument("--retry", type=int, default=0, metavar="N",
                    help="compose into programs.Retry instead: the writer answers again, up to N times, sampled at "
                         "--sample-retries, while the example fails (0: EvalOpt with the base fixer)")
    ap.add_argument("--sample-retries", type=float, default=0.8,
                    help="the retries' temperature; 0: greedy (with --vary-demos only)")
    ap.add_argument("--vary-demos", action="store_true",
                    help="each retry is shown the nearest retrieved demos whose solutions no earlier prompt showed "
                         "(Retry(vary_demos=True)); needs an artifact trained with retrieved demos")
    ap.add_argument("--out", type=Path, default=None, help="write the result, per-task scores included, as JSON")
    args = ap.parse_args(argv)
    if args.retry < 0:
        ap.error(f"--retry must be >= 0, got {args.retry}")
    if args.vary_demos and not args.retry:
        ap.error("--vary-demos varies Retry's demos: pass --retry N too")
    if args.sample_retries < 0 or (args.sample_retries == 0 and args.retry and not args.vary_demos):
        ap.error(f"--sample-retries is a temperature > 0, or 0 (greedy) with --vary-demos; got {args.sample_retries}")
    roles = read_manifest(args.artifact).roles
    try:
        writer = pick_role(roles, args.role)
    except ValueError as exc:
        raise SystemExit(f"{exc} (--role)") from None
    result = compose(args.artifact, writer, n_test=args.n_test, model=args.model, retry=args.retry,
                     sample_retries=args.sample_retries or None, vary_demos=args.vary_demos)
    print(json.dumps({k: v for k, v in result.items() if k != "tasks"}, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(args.out)  # whole or not at all
    return result


if __name__ == "__main__":
    main()
