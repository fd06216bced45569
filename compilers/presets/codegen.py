"""The code workflows' preset: generated function-writing tasks (``wfc.tasks.codegen``, each scored by running its
tests in the sandbox) and the programs compiled on them, chosen by a :class:`CodeWorkflow`:

- ``evalopt``: ``programs.EvalOpt`` (writer -> reviewer -> fixer, one round). Variants: the reviewer chooses
  ``correct`` / ``incorrect`` (``choose_verdict``); no reviewer, the prompt's example is run instead and a failure
  goes to the fixer with what it returned (``check``); the fixer on the base model, never trained (``frozen_fixer``;
  with ``check`` its calls also leave the training rollouts); the fixer shown only the task and the feedback, not
  the code it replaces (``fresh_fix``).
- ``single``: the writer alone (``programs.Single``), the single-role GRPO rival.
- ``retry``: ``programs.Retry(check=example_check)``: while the prompt's example fails, the writer answers again, up
  to ``attempts`` times, sampled at ``sample_retries`` in greedy runs; ``train_retries=False`` trains on the first
  answer only; ``vary_demos`` shows each retry other retrieved demos.

Any of them may show the writer, per run, the ``retrieved_demos`` training tasks nearest to its task with their gold
solutions. A held-out task whose gold solution is also a training task's is "seen" (a retrieved demo of it holds its
answer): :func:`compare_held_out` scores the unseen rest apart.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import dspy

from compilers.score import paired_difference
from programs import EvalOpt, Retry, Single
from wfc.tasks import get_task
from wfc.tasks.visible import example_check

PROGRAMS = ("evalopt", "single", "retry")
RECIPE = "wide-warmup"  # the compilers.recipes entry the code workflows compile with
MAX_TOKENS = 96  # per call: code needs more than the recipe's 12


def code_task(*, n_train: int = 100, n_val: int = 32, n_test: int = 160):
    """The generated code tasks in fixed, disjoint splits (validation: keep-best picks the step by them)."""
    return get_task("codegen", n_train=n_train, n_val=n_val, n_test=n_test)


@dataclass(frozen=True)
class CodeWorkflow:
    """Which code workflow to compile (see the module docstring). Options that the chosen program does not have, or
    that contradict each other, raise ``ValueError`` saying which flag to drop or add."""

    program: str = "evalopt"
    attempts: int = 4
    sample_retries: float = 0.8
    train_retries: bool = True
    vary_demos: bool = False
    choose_verdict: bool = False
    check: bool = False
    frozen_fixer: bool = False
    fresh_fix: bool = False
    retrieved_demos: int = 0

    def __post_init__(self):
        if self.program not in PROGRAMS:
            raise ValueError(f"program {self.program!r} is unknown: use one of {list(PROGRAMS)}")
        if self.retrieved_demos < 0:
            raise ValueError(f"--retrieved-demos must be >= 0, got {self.retrieved_demos}")
        if self.attempts < 0 or not self.sample_retries >= 0:
            raise ValueError(f"--attempts must be >= 0 and --sample-retries >= 0, got {self.attempts} and "
                             f"{self.sample_retries}")
        retry = self.program == "retry"
        if not self.train_retries and not retry:
            raise ValueError("--no-train-retries is a Retry option: pass it with --program retry")
        if self.vary_demos and (not retry or not self.retrieved_demos):
            raise ValueError("--vary-demos shows Retry's later answers other retrieved demos: pass it with --program "
                             "retry and --retrieved-demos K")
        if retry and self.attempts and self.sample_retries == 0 and not self.vary_demos:
            raise ValueError("--sample-retries 0 (greedy retries) would repeat the first answer: pass --vary-demos "
                             "too, or a temperature")
        if self.program != "evalopt" and (self.choose_verdict or self.check or self.frozen_fixer or self.fresh_fix):
            raise ValueError(f"--choose-verdict, --check, --frozen-fixer and --fresh-fix are EvalOpt options: "
                             f"{self.program.capitalize()} has no reviewer or fixer")
        if self.check and self.choose_verdict:
            raise ValueError("--check replaces the reviewer, so it has no verdict to choose: pass one of the two")

    @property
    def label(self) -> str:
        """A name that differs between any two workflows (their run folders and artifacts never collide), e.g.
        ``retry-4x0.8-rag1``."""
        retries = f"-{self.attempts}x{self.sample_retries:g}" if self.program == "retry" else ""
        return (self.program + retries + ("-vary" if self.vary_demos else "")
                + ("-first" if not self.train_retries else "") + ("-check" if self.check else "")
                + ("-frozen" if self.frozen_fixer else "") + ("-fresh" if self.fresh_fix else "")
                + (f"-rag{self.retrieved_demos}" if self.retrieved_demos else ""))

    def build(self, signature: dspy.Signature) -> dspy.Module:
        """The program, named ``code-<program>``."""
        if self.program == "single":
            return Single(signature, name="code-single")
        if self.program == "retry":
            return Retry(signature, check=example_check, attempts=self.attempts,
                         sample_retries=self.sample_retries or None, vary_demos=self.vary_demos,
                         train_retries=self.train_retries, name="code-retry")
        return EvalOpt(signature, rounds=1, choose_verdict=self.choose_verdict,
                       check=example_check if self.check else None, show_previous=not self.fresh_fix,
                       name="code-evalopt")

    def config(self) -> dict[str, Any]:
        """The compile config fields this workflow sets: the frozen fixer (left out of training rollouts only with
        ``check``, the measured case; compile checks on its first validation that skipping it is exact) and the
        retrieved demos (the writer shown gold ``solution``s as its ``code``)."""
        out: dict[str, Any] = {}
        if self.frozen_fixer:
            out.update(frozen_roles=["optimizer"], skip_frozen=self.check)
        if self.retrieved_demos:
            out.update(retrieved_demos=self.retrieved_demos, demo_labels={"code": "solution"})
        return out

    def options(self) -> dict[str, Any]:
        """The options that describe this workflow in a run's summary (Retry's own only for ``retry``)."""
        out = asdict(self)
        for key in ("attempts", "sample_retries", "train_retries", "vary_demos"):
            if self.program != "retry":
                del out[key]
        del out["retrieved_demos"]  # a config field: the summary has it from the recipe
        return out


def add_workflow_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that choose a :class:`CodeWorkflow` (``--program``, its variants); read them back with
    :func:`workflow_from_args`."""
    parser.add_argument("--program", choices=PROGRAMS, default="evalopt",
                        help="EvalOpt (writer -> reviewer -> fixer), the writer alone (Single) as the single-role GRPO "
                             "rival, or Retry (the writer answers again while the prompt's example fails); for equal "
                             "budgets add --set max_rollout_tokens=N and enough --steps for the budget to stop it")
    parser.add_argument("--attempts", type=int, default=4, help="Retry: answers drawn after the first while the "
                                                                "example fails [4]")
    parser.add_argument("--sample-retries", type=float, default=0.8,
                        help="Retry: the temperature of those answers in greedy runs (evaluation, serving); 0: greedy "
                             "(with --vary-demos only) [0.8]")
    parser.add_argument("--no-train-retries", action="store_true",
                        help="Retry: training rollouts answer once, so the compile trains the writer as --program "
                             "single does; only validation and evaluation retry")
    parser.add_argument("--vary-demos", action="store_true",
                        help="Retry with --retrieved-demos: each answer after the first is shown the nearest training "
                             "tasks whose solutions no earlier prompt showed")
    parser.add_argument("--choose-verdict", action="store_true",
                        help="the reviewer chooses 'correct' or 'incorrect' instead of writing a verdict")
    parser.add_argument("--check", action="store_true",
                        help="no reviewer: EvalOpt runs the example the prompt shows and tells the fixer what it "
                             "returned (EvalOpt(check=wfc.tasks.visible.example_check))")
    parser.add_argument("--frozen-fixer", action="store_true",
                        help="the fixer runs on the base model and is never trained; with --check its calls are also "
                             "left out of training rollouts, so the writer trains on the whole budget")
    parser.add_argument("--fresh-fix", action="store_true",
                        help="the fixer is shown only the task and the feedback, not the code it replaces")
    parser.add_argument("--retrieved-demos", type=int, default=0, metavar="K",
                        help="show the writer, per run, the K training tasks nearest to its task with their gold "
                             "solutions; 0: off [0]")


def workflow_from_args(args: argparse.Namespace) -> CodeWorkflow:
    """The workflow :func:`add_workflow_flags`' flags ask for; ``ValueError`` as :class:`CodeWorkflow` raises it."""
    return CodeWorkflow(args.program, attempts=args.attempts, sample_retries=args.sample_retries,
                        train_retries=not args.no_train_retries, vary_demos=args.vary_demos,
                        choose_verdict=args.choose_verdict, check=args.check, frozen_fixer=args.frozen_fixer,
                        fresh_fix=args.fresh_fix, retrieved_demos=args.retrieved_demos)


def compare_held_out(testset: Sequence[dspy.Example], trainset: Sequence[dspy.Example], before: Sequence[float],
                     after: Sequence[float]) -> dict[str, Any]:
    """Held-out scores before and after training, paired task by task (``paired``) and by function (``by_function``:
    tasks of one function pass or fail together), the unseen tasks' means (``unseen``: tasks whose gold solution no
    training task has; ``before`` / ``after`` None when there are none) and one row per task in test-set order
    (``tasks``: what ``benchmarks/paired_runs.py`` pairs two runs by)."""
    before, after = list(before), list(after)
    trained_on = {ex.solution for ex in trainset}
    unseen = [i for i, ex in enumerate(testset) if ex.solution not in trained_on]

    def mean(scores: list[float]) -> float | None:
        return sum(scores) / len(scores) if scores else None

    return {"paired": paired_difference(before, after),
            "by_function": paired_difference(before, after, clusters=[ex.entry_point for ex in testset]),
            "unseen": {"n": len(unseen), "before": mean([before[i] for i in unseen]),
                       "after": mean([after[i] for i in unseen])},
            "tasks": [{"task": i, "function": ex.entry_point, "seen_solution": ex.solution in trained_on,
                       "before": b, "after": a} for i, (ex, b, a) in enumerate(zip(testset, before, after))]}


def describe_held_out(comparison: dict[str, Any]) -> str:
    """:func:`compare_held_out`'s paired figures as the tail of a result line, and the unseen tasks' means on a line
    of their own when there are any."""
    pair, by_function, unseen = comparison["paired"], comparison["by_function"], comparison["unseen"]
    (lo, hi), (flo, fhi) = pair["interval"], by_function["interval"]
    text = (f"paired difference {pair['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({pair['only_after']} tasks passed "
            f"only after, {pair['only_before']} only before); by function [{flo:+.3f}, {fhi:+.3f}] "
            f"({by_function['clusters']} functions)")
    if unseen["n"]:
        text += (f"\non the {unseen['n']} tasks whose solution no training task has: {unseen['before']:.3f} -> "
                 f"{unseen['after']:.3f}")
    return text
