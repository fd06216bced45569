"""Retry: one solver answers; while a check rejects the answer and attempts remain, the solver answers again.

The check is a function, not a role: ``check(inputs, proposal) -> (accepted, feedback)``, the form ``EvalOpt(check=...)``
takes (e.g. ``wfc.tasks.visible.example_check``, which runs the examples a code prompt shows). The program has one
role, ``solver`` (the same path as ``Single``'s, so an adapter trained on either runs in the other), called 1 to
``1 + attempts`` times per run; it returns the first answer the check accepts, else the last one that parsed.

``sample_retries=T``: in a greedy run (evaluation, ``wfc.load``, serving) the retries sample at temperature ``T``, so
a retry can differ from the greedy answer that failed (``programs._sampling``: in training rollouts every call keeps
the run's temperature). The first answer always follows the run's own settings. Without ``sample_retries`` a greedy
run's retries repeat the first answer, so they are refused: pass it, or use ``attempts=0``.

What it buys, measured on the generated code tasks (SmolLM2-135M, ``wfc.tasks.visible.example_check``, 4 attempts
at T=0.8; docs/results.md, stop 44): on the untrained writer, 0.569 -> 0.681 (18 of the 56 tasks it retried
fixed); on writers trained by GRPO, +0.000 to +0.019 (0 to 3 fixes), including one compiled inside Retry: training
sharpens the writer onto its remaining wrong answers, so a fresh draw mostly repeats them. At 8 attempts at T=1.2,
three trained writers gained +0.056 / +0.000 / +0.013 (one fixed all 7 ``larger`` tasks, one none).

A retry whose output cannot be parsed (or that crashes) counts as a failed attempt and stays in the rollout graph
with its status; a first answer that cannot be parsed fails the run, as in ``Single``.

Invariant: the check is called at most once per parsed answer, in order, never after it accepts, and never on the
last attempt's answer (nothing is left to do if it fails); calls of the solver after the first see the same prompt
as the first (a fresh draw, not a revision), so mmGRPO's ``pool_fanout`` may pool them with the first call's group.
"""

from __future__ import annotations

from typing import Callable

import dspy

from programs._fields import task_signature
from programs._sampling import check_temperature, greedy_run_config
from wfc.program import Program


class Retry(Program):
    """Answer, check, answer again while the check rejects (up to ``attempts`` more times)."""

    def __init__(self, signature, *, check: Callable, attempts: int = 4, sample_retries: float | None = 0.8,
                 predictor: type[dspy.Predict] = dspy.Predict, name: str | None = None):
        super().__init__(name=name)
        if not callable(check):
            raise TypeError(f"Retry's check is a function (inputs, proposal) -> (accepted, feedback), got {check!r}")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise ValueError(f"Retry needs attempts >= 0 (answers drawn after the first), got {attempts!r}")
        self.sample_retries = check_temperature(sample_retries, "sample_retries")
        if attempts and self.sample_retries is None:
            raise ValueError("Retry without sample_retries would repeat a greedy answer on every attempt: pass "
                             "sample_retries=T (e.g. 0.8) or attempts=0")
        sig = task_signature(signature)
        self.check = check
        self.attempts = attempts
        self.outputs = list(sig.output_fields)
        self.solver = predictor(sig)

    def forward(self, **inputs):
        current = self.solver(**inputs)
        config = greedy_run_config(self.solver, self.sample_retries)
        rejected = False  # whether `current` has been checked and rejected already
        for _ in range(self.attempts):
            if not rejected and self.check(inputs, {k: getattr(current, k) for k in self.outputs})[0]:
                break
            try:
                current, rejected = self.solver(**inputs, config=config), False
            except Exception:  # kept in the graph by the tracer; a failed attempt, the last parsed answer stands
                rejected = True
        return current
