"""MMGRPO side by side with DSPy's own optimizers (issue 47) on the demo or a suite task (``--task``): same program,
same train/val/test splits, same engine and DSPy adapter, same greedy held-out evaluation (``compilers.evaluate``).

Arms: ``uncompiled``; ``labeled`` (LabeledFewShot); ``bfrs`` (BootstrapFewShotWithRandomSearch); ``mipro``
(MIPROv2, auto="light"); ``gepa`` (GEPA, auto="light"; its reflection LM is the same local model unless
``--reflection-model``); ``finetune`` (BootstrapFinetune, its LoRA trained on the local model through
``compilers.finetune``); ``mmgrpo`` (the demo's recipe on the demo, ``MMGRPO(metric)`` as the suite runs it on
the other tasks); ``together`` (dspy.BetterTogether: the prompt arm best on
the validation set, or ``--together-p``, then MMGRPO, which keeps, drops or internalizes its demos as
``--together-demos`` says; a prompt arm run before, in this ``--out``, is replayed from its recorded program, not
run again). DSPy's optimizers run on :class:`wfc.lm.LocalLM` handles of the one engine,
under wfc's compact adapter (the one the demo's artifact runs with), with DSPy's defaults otherwise.

    python benchmarks/vs_dspy.py --seed 0 --out runs/vs_dspy/seed0.json            # every arm
    python benchmarks/vs_dspy.py --seed 0 --arms uncompiled,labeled --out ...       # some
    python benchmarks/vs_dspy.py --task extract --seed 0 --arms uncompiled,mipro,mmgrpo,together   # a suite task

The ``mipro`` arm needs optuna (``pip install -e '.[bench]'``); a missing one is said before any arm runs.
Each arm's row is written as it finishes (atomically, merged with the rows on disk, so two processes may run other
arms into one ``--out``); arms already in ``--out`` are skipped, so a killed run goes on (an arm whose row holds an
error runs again).
A row: held-out accuracy with its 95% interval, validation accuracy (what ``together`` picks by), wall minutes, LM
calls and prompt/completion tokens (the engine's counters over the arm), or the error an optimizer raised.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import dspy
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from compilers import MMGRPO, evaluate
from compilers.finetune import finetunable
from compilers.config import MMGRPOConfig
from compilers.presets import arithmetic
from compilers.presets.suite import TASKS
from compilers.recipes import get_recipe
from compilers.student_demos import RULES as STUDENT_DEMOS
from wfc.adapter import CompactChatAdapter
from wfc.artifact import CompiledProgram
from wfc.engines.hf import HFEngine
from wfc.lm import LocalLM

ARMS = ("uncompiled", "labeled", "bfrs", "mipro", "gepa", "finetune", "mmgrpo", "together")
# arms whose optimizer imports an optional package only when it gets to it (MIPROv2: after its proposals, ~25 min in)
NEEDS = {"mipro": ("optuna", "MIPROv2")}
PROMPT_ARMS = ("labeled", "bfrs", "mipro", "gepa")
DEMO = "arithmetic"  # the suite task that is make demo's: it compiles with the demo's recipe
THREADS = 32  # DSPy's worker threads: the engine batches their concurrent calls


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=to_jsonable_python))  # pydantic demo values as JSON
    os.replace(tmp, path)


def arms_problem(names: list[str]) -> str | None:
    """What is wrong with ``--arms`` (an unknown arm, a missing optional package), said before any arm runs."""
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        return f"unknown arm(s) {', '.join(unknown)}: choose from {','.join(ARMS)}"
    for name in names:
        module, optimizer = NEEDS.get(name, (None, None))
        if module and importlib.util.find_spec(module) is None:
            return (f"arm {name!r} ({optimizer}) needs {module}, which is not installed: "
                    f"pip install -e '.[bench]', or leave {name} out of --arms")
    return None


def recipe(task: str, seed: int, steps: int | None) -> dict[str, Any]:
    """MMGRPO's settings for ``task``: the demo's recipe and steps for the demo; for every other suite task what the
    suite compiles with, ``MMGRPO(metric)`` and no recipe (``benchmarks/suite.py``). ``steps`` overrides."""
    base = {**get_recipe(arithmetic.RECIPE), "steps": arithmetic.STEPS} if task == DEMO else {}
    return {**base, "seed": seed, **({"steps": steps} if steps is not None else {})}


def gepa_metric(metric: Callable) -> Callable:
    """``metric`` in GEPA's five-argument form (score only, no textual feedback)."""
    def scored(gold, pred, trace=None, pred_name=None, pred_trace=None):
        return metric(gold, pred, trace)
    return scored


def prompt_optimizer(name: str, *, seed: int, lm: LocalLM, reflection: LocalLM, metric: Callable,
                     bfrs_candidates: int = 16) -> dspy.teleprompt.Teleprompter:
    if name == "labeled":
        return dspy.LabeledFewShot()
    if name == "bfrs":
        return dspy.BootstrapFewShotWithRandomSearch(metric, num_threads=THREADS,
                                                     num_candidate_programs=bfrs_candidates)
    if name == "mipro":
        return dspy.MIPROv2(metric, auto="light", prompt_model=reflection, task_model=lm, num_threads=THREADS,
                            seed=seed)
    if name == "gepa":
        return dspy.GEPA(gepa_metric(metric), auto="light", reflection_lm=reflection, num_threads=THREADS, seed=seed)
    raise ValueError(f"unknown prompt arm {name!r}: one of {PROMPT_ARMS}")


def compile_kwargs(optimizer, trainset, valset, seed: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"trainset": trainset}
    if not isinstance(optimizer, dspy.LabeledFewShot) and not isinstance(optimizer, dspy.BootstrapFinetune):
        kwargs["valset"] = valset
    if isinstance(optimizer, dspy.MIPROv2):
        kwargs.update(seed=seed, requires_permission_to_run=False)
    return kwargs


def prompt_state(program: dspy.Module) -> dict[str, Any]:
    """What a prompt optimizer changed in ``program``: per role, its instructions and its demos (as dicts)."""
    return {role: {"instructions": p.signature.instructions,
                   "demos": [dict(d.items()) for d in p.demos]}
            for role, p in program.named_predictors()}


class Replay(dspy.teleprompt.Teleprompter):
    """A prompt arm's result, recorded by an earlier run of that arm (:func:`prompt_state`), as an optimizer: its
    ``compile`` gives the student those instructions and demos. ``together`` uses it so that BetterTogether's p step
    is the very program the prompt arm's row measured, not a second run of the optimizer (tens of minutes here)."""

    def __init__(self, state: dict[str, Any]):
        super().__init__()
        self.state = state

    def compile(self, student: dspy.Module, *, trainset=None, valset=None) -> dspy.Module:
        program = student.deepcopy()
        by_role = dict(program.named_predictors())
        if set(by_role) != set(self.state):
            raise ValueError(f"the recorded prompt program has roles {sorted(self.state)}, the student "
                             f"{sorted(by_role)}: record it again from this program")
        for role, saved in self.state.items():
            pred = by_role[role]
            pred.signature = pred.signature.with_instructions(saved["instructions"])
            pred.demos = [dspy.Example(**{k: revive(v, pred.signature, k) for k, v in d.items()})
                          for d in saved["demos"]]
        return program


def revive(value: Any, signature, name: str) -> Any:
    """A recorded demo value as its field's type: a pydantic model's fields (recorded as JSON) back into the model, so
    the adapter renders the demo as it did when the prompt optimizer chose it."""
    info = signature.fields.get(name)
    kind = getattr(info, "annotation", None)
    if isinstance(value, dict) and isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind.model_validate(value)
    return value


def held_out(program: dspy.Module, examples, engine, metric: Callable, max_tokens: int) -> dict[str, Any]:
    """Greedy accuracy and interval of a CompiledProgram (its adapters) or a plain program (each predictor on its
    LocalLM's adapter: the base, or what BootstrapFinetune trained)."""
    if isinstance(program, CompiledProgram):
        inner, roles = program.program, program.roles
    else:
        inner, roles = program, {path: p.lm.adapter for path, p in program.named_predictors()
                                 if isinstance(p.lm, LocalLM)}
    out = evaluate(inner, examples, engine, metric=metric, adapters=roles, max_tokens=max_tokens)
    return {"accuracy": out["accuracy"], "interval": list(out["interval"])}


class Bench:
    def __init__(self, seed: int, out: Path, reflection_model: str | None, *, task: str = DEMO,
                 model: str = "smollm2-135m", limit: int | None = None, steps: int | None = None,
                 bfrs_candidates: int = 16, together_p: str | None = None, together_demos: str = "keep"):
        self.seed, self.out, self.bfrs_candidates = seed, out, bfrs_candidates
        self.picked, self.replayed = None, False  # together's prompt arm, and whether its recorded program was used
        self.together_p, self.together_demos = together_p, together_demos
        self.rows: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
        suite_task = TASKS[task]
        self.metric, self.make_program = suite_task.metric, suite_task.program
        splits = suite_task.splits().head(limit)
        self.trainset, self.valset, self.testset = splits.train, splits.val, splits.test
        self.recipe = recipe(task, seed, steps)
        self.max_tokens = MMGRPOConfig(**self.recipe).max_tokens
        self.engine = HFEngine(model)
        self.lm = LocalLM(self.engine, max_tokens=self.max_tokens)
        self.reflection = LocalLM(reflection_model or self.engine, max_tokens=256, temperature=1.0)

    def student(self, lm: LocalLM | None = None) -> dspy.Module:
        program = self.make_program()
        program.set_lm(lm or self.lm)
        return program

    def run(self, name: str, build: Callable[[], dspy.Module]) -> None:
        if (done := self.rows.get(name)) is not None:
            if "error" not in done:
                print(f"{name}: already in {self.out}, skipped")
                return
            # a failed try is recorded, and tried again (a missing package, a killed run)
            print(f"{name}: its last try failed ({done['error'][:80]}), running it again")
        before = dict(self.engine.stats)
        t0 = time.time()
        try:
            with dspy.context(adapter=CompactChatAdapter(), lm=self.lm, num_threads=THREADS):
                program = build()
            minutes = (time.time() - t0) / 60
            counts = {k: self.engine.stats[k] - before[k] for k in ("rows", "prompt_tokens", "completion_tokens")}
            row = {"minutes": round(minutes, 2), "lm_calls": counts["rows"], "prompt_tokens": counts["prompt_tokens"],
                   "completion_tokens": counts["completion_tokens"],
                   "load_15m": round(os.getloadavg()[2], 1),  # wall minutes mean little on a busy machine
                   "val": held_out(program, self.valset, self.engine, self.metric, self.max_tokens)["accuracy"],
                   **held_out(program, self.testset, self.engine, self.metric, self.max_tokens)}
            if name == "bfrs":
                row["num_candidate_programs"] = self.bfrs_candidates
            if name in PROMPT_ARMS:  # recorded for BetterTogether's p step (``together``)
                write_json(self.prompt_path(name), prompt_state(program))
            if isinstance(program, CompiledProgram):
                row["adapters"] = sorted(set(program.roles.values()) - {None})
            if name == "together":  # the prompt arm it ran first, and the candidate BetterTogether returned
                row.update(picked=self.picked, p_replayed=self.replayed, student_demos=self.together_demos)
                row["strategy"] = program.candidate_programs[0]["strategy"] or "uncompiled"
        except Exception as exc:  # an optimizer that cannot run here is a result too: say why
            row = {"error": f"{type(exc).__name__}: {str(exc)[:500]}", "minutes": round((time.time() - t0) / 60, 2)}
        # merged with what is on disk now: another process may have written other arms to the same --out meanwhile
        self.rows = {**(json.loads(self.out.read_text()) if self.out.exists() else {}), name: row}
        write_json(self.out, self.rows)
        print(f"{name}: {row}")

    def prompt_path(self, arm: str) -> Path:
        return self.out.with_name(f"{self.out.stem}-{arm}-prompts.json")

    def arm(self, name: str) -> Callable[[], dspy.Module]:
        train, val = self.trainset, self.valset
        if name == "uncompiled":
            return self.student
        if name in PROMPT_ARMS:
            opt = prompt_optimizer(name, seed=self.seed, lm=self.lm, reflection=self.reflection, metric=self.metric,
                                   bfrs_candidates=self.bfrs_candidates)
            return lambda: opt.compile(self.student(), **compile_kwargs(opt, train, val, self.seed))
        if name == "finetune":  # DSPy's rejection-sampling fine-tune, its LoRA trained on the local model
            opt = dspy.BootstrapFinetune(self.metric, num_threads=THREADS)
            return lambda: opt.compile(self.student(finetunable(self.lm, seed=self.seed)), trainset=train)
        if name == "mmgrpo":
            return lambda: MMGRPO(self.metric, **self.recipe).compile(
                self.student(), trainset=train, valset=val, run_dir=self.out.with_name(f"{self.out.stem}-mmgrpo"))
        if name == "together":
            return self.together
        raise ValueError(f"unknown arm {name!r}: one of {ARMS}")

    def together(self) -> dspy.Module:
        ran = {k: self.rows[k]["val"] for k in PROMPT_ARMS if "val" in self.rows.get(k, {})}
        if not ran and self.together_p is None:
            raise ValueError("run at least one prompt arm before 'together' (it picks the best on validation), or "
                             "name one with --together-p")
        best = self.together_p or max(ran, key=ran.get)
        recorded = self.prompt_path(best)
        self.picked, self.replayed = best, recorded.exists()
        p = Replay(json.loads(recorded.read_text())) if recorded.exists() else prompt_optimizer(
            best, seed=self.seed, lm=self.lm, reflection=self.reflection, metric=self.metric,
            bfrs_candidates=self.bfrs_candidates)
        w = MMGRPO(self.metric, **self.recipe, student_demos=self.together_demos)
        return dspy.BetterTogether(self.metric, p=p, w=w).compile(
            self.student(), trainset=self.trainset, valset=self.valset, strategy="p -> w",
            optimizer_compile_args={"p": {k: v for k, v in compile_kwargs(p, [], [], self.seed).items()
                                          if k not in ("trainset", "valset")},
                                    "w": {"run_dir": self.out.with_name(f"{self.out.stem}-together")}})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, in order; from {','.join(ARMS)}")
    ap.add_argument("--task", choices=sorted(TASKS), default=DEMO,
                    help="the suite task (compilers.presets.suite): its program, splits and metric; the demo "
                         f"({DEMO}) compiles with its recipe, the others as the suite does (MMGRPO(metric))")
    ap.add_argument("--out", type=Path, default=None,
                    help="default runs/vs_dspy/seed<SEED>.json (the demo), runs/vs_dspy/<TASK>-seed<SEED>.json")
    ap.add_argument("--reflection-model", default=None,
                    help="a model for MIPROv2's proposer and GEPA's reflection (default: the local model itself)")
    ap.add_argument("--model", default="smollm2-135m", help="the base model (tests: tiny)")
    ap.add_argument("--limit", type=int, default=None, help="use the first N examples of each split (smoke runs)")
    ap.add_argument("--steps", type=int, default=None, help="MMGRPO's steps (default: the task's recipe's)")
    ap.add_argument("--bfrs-candidates", type=int, default=16,
                    help="BootstrapFewShotWithRandomSearch's num_candidate_programs (DSPy's default 16: on the 2-core "
                         "CPU each bootstrapped candidate takes ~9 min, so the reported run used fewer, and says so)")
    ap.add_argument("--together-p", choices=PROMPT_ARMS, default=None,
                    help="the prompt arm BetterTogether runs first (default: the one best on validation in --out)")
    ap.add_argument("--together-demos", choices=sorted(STUDENT_DEMOS), default="keep",
                    help="what MMGRPO does with the prompt arm's demos (compilers.student_demos): keep them in the "
                         "prompts, drop them, or internalize them (fine-tune on them, then drop them)")
    args = ap.parse_args(argv)
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    if problem := arms_problem(names):
        ap.error(problem)
    logging.getLogger("dspy").setLevel(logging.WARNING)
    out = args.out or Path("runs/vs_dspy") / (f"seed{args.seed}.json" if args.task == DEMO
                                              else f"{args.task}-seed{args.seed}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.seed, out, args.reflection_model, task=args.task, model=args.model, limit=args.limit,
                  steps=args.steps, bfrs_candidates=args.bfrs_candidates, together_p=args.together_p,
                  together_demos=args.together_demos)
    for name in names:
        bench.run(name, bench.arm(name))


if __name__ == "__main__":
    main()
