"""``make demo``'s preset: a Voting workflow (three voters, an aggregator for disagreements) on generated one-step
arithmetic word problems, compiled with the ``wide-warmup`` recipe for 14 steps.

Every builder is deterministic: the task's splits are generated from a fixed seed and are disjoint (no question in
two of them), and the programs carry no state beyond their predictors' config, so the demo, ``benchmarks/learning.py``
and the throughput benchmarks that call these see the same problems and the same prompts. ``stop`` (every role's calls
end at the first of these strings) and ``calculator`` (every role's answer is the value of the arithmetic it writes,
``programs.calculator``) travel in the predictors' config, so an artifact rebuilds them.
"""

from __future__ import annotations

import functools

import dspy

from programs import Single, Voting
from programs.calculator import Calculate, with_calculator
from wfc.tasks import get_task
from wfc.tasks.math import math_metric

SIGNATURE = dspy.Signature("question -> answer", "Solve the math word problem. Answer with just the final number.")
RECIPE = "wide-warmup"  # the compilers.recipes entry the demo compiles with
STEPS = 14  # the demo's training steps
STOP: tuple[str, ...] = ()  # every role's stop strings unless a run says otherwise: none


def demo_task():
    """Disjoint splits of one-step problems with operands up to 20: 400 train, 100 validation, 300 held out."""
    return get_task("arithmetic", n_train=400, n_val=100, n_test=300, seed=1, steps=1, max_operand=20)


def predictor(stop: tuple[str, ...] = (), cls: type[dspy.Predict] = dspy.Predict):
    """The predictor class of every role: ``cls``, stopping at ``stop`` when given (each predictor's DSPy config,
    which travels in the artifact)."""
    return functools.partial(cls, stop=tuple(stop)) if stop else cls


def _role_predictor(stop: tuple[str, ...], calculator: bool):
    return predictor(stop, Calculate if calculator else dspy.Predict)


def program(stop: tuple[str, ...] = STOP, *, calculator: bool = False) -> Voting:
    """The demo's workflow: ``Voting(n=3, skip_unanimous=True)`` on :data:`SIGNATURE` (voters that agree end the run;
    the aggregator decides disagreements). Compile a ``calculator=True`` program with :func:`metric`'s
    ``calculator=True`` so each call is scored as the program uses it."""
    return Voting(SIGNATURE, n=3, name="math-voting", skip_unanimous=True, predictor=_role_predictor(stop, calculator))


def single_program(stop: tuple[str, ...] = STOP, *, calculator: bool = False) -> Single:
    """One role on :data:`SIGNATURE` (``programs.Single``): the single-role GRPO rival of :func:`program`, with the
    same stop strings and calculator choice."""
    return Single(SIGNATURE, predictor=_role_predictor(stop, calculator))


def metric(calculator: bool = False):
    """The training metric of :func:`program`: ``math_metric``, reading each call's answer through the calculator
    when the program has one (``programs.calculator.with_calculator``). Held-out accuracy is ``math_metric`` on the
    program's final answer either way."""
    return with_calculator(math_metric) if calculator else math_metric
