"""Retry: one solver answers; while a check rejects the answer and attempts remain, the solver answers again.

The check is a function, not a role: ``check(inputs, proposal) -> (accepted, feedback)``, the form ``EvalOpt(check=...)``
takes (e.g. ``wfc.tasks.visible.example_check``, which runs the examples a code prompt shows). The program has one
role, ``solver`` (the same path as ``Single``'s, so an adapter trained on either runs in the other), called 1 to
``1 + attempts`` times per run; it returns the first answer the check accepts, else the last one that parsed.

``sample_retries=T``: in a greedy run (evaluation, ``wfc.load``, serving) the retries sample at temperature ``T``, so
a retry can differ from the greedy answer that failed (``programs._sampling``: in training rollouts every call keeps
the run's temperature). The first answer always follows the run's own settings. Without ``sample_retries`` (and without
``vary_demos``, below) a greedy run's retries repeat the first answer, so they are refused: pass it, or use
``attempts=0``.

What it buys, measured on the generated code tasks (SmolLM2-135M, ``wfc.tasks.visible.example_check``, 4 attempts
at T=0.8; docs/results.md, stop 44): on the untrained writer, 0.569 -> 0.681 (18 of the 56 tasks it retried
fixed); on writers trained by GRPO, +0.000 to +0.019 (0 to 3 fixes), including one compiled inside Retry: training
sharpens the writer onto its remaining wrong answers, so a fresh draw mostly repeats them. At 8 attempts at T=1.2,
three trained writers gained +0.056 / +0.000 / +0.013 (one fixed all 7 ``larger`` tasks, one none).

``vary_demos=True`` (for a solver with retrieved demos, ``wfc.retrieve``: compile with ``retrieved_demos=k``):
each retry shows the solver's static demos and the ``k`` nearest retrieved ones whose answers differ from every demo
shown before in the run (``DemoRetriever.select(unlike=...)``), so a retry is asked with other examples, not only
drawn again. Why: a trained writer's remaining failures repeat under sampling when its nearest demo misleads it (the
``larger`` tasks, whose nearest demo is ``smaller``); shown another example instead, it answers them. Measured
(stop 45, 4 greedy retries, the three writers compiled alone with retrieved demos): **+0.0625** on each seed (10 of
160 held-out tasks fixed, none broken: every ``larger`` task), against +0.031 to +0.038 for the next-nearest demos
and +0.000 to +0.019 for sampled draws of the same prompt. With it, greedy retries (``sample_retries=None``) differ
from each other and are allowed. A run whose solver has no retrieved demos (no
retriever, or its inputs lack the retriever's query fields) repeats its prompt, sampled at ``sample_retries``;
without it the retries would repeat the first answer, so the run answers once (the uncompiled program, before
``compile`` installs its retrieved demos, is ``Single``).

``train_retries=False``: training rollouts (sampled runs) answer once, so compiling spends the whole budget on
first answers and trains the solver exactly as compiling ``Single`` would (same rollouts, same update); greedy runs
(validation, evaluation, serving) still retry. Why: retries in training cost rollout tokens, and measured at an
equal budget the writer compiled inside Retry with them came out weaker (0.894 against 0.912, stop 44).

A retry whose output cannot be parsed (or that crashes) counts as a failed attempt and stays in the rollout graph
with its status; a first answer that cannot be parsed fails the run, as in ``Single``.

Invariant: the check is called at most once per parsed answer, in order, never after it accepts, and never on the
last attempt's answer (nothing is left to do if it fails); calls of the solver after the first see the same prompt
as the first (a fresh draw, not a revision), so mmGRPO's ``pool_fanout`` may pool them with the first call's group,
except with ``vary_demos``, where call ``i`` shows other demos than call ``i - 1`` (same instructions and task; its
group, by invocation index, holds the calls of one prompt per example). The program a user holds never changes: the
demos are changed on the run's own copy (``wfc.lower.trace`` copies before it selects), and put back after the run.
"""

from __future__ import annotations

from typing import Callable

import dspy

from programs._fields import task_signature
from programs._sampling import check_temperature, greedy_run, greedy_run_config
from wfc.program import Program
from wfc.retrieve import DemoRetriever


class Retry(Program):
    """Answer, check, answer again while the check rejects (up to ``attempts`` more times)."""

    def __init__(self, signature, *, check: Callable, attempts: int = 4, sample_retries: float | None = 0.8,
                 vary_demos: bool = False, train_retries: bool = True, predictor: type[dspy.Predict] = dspy.Predict,
                 name: str | None = None):
        super().__init__(name=name)
        if not callable(check):
            raise TypeError(f"Retry's check is a function (inputs, proposal) -> (accepted, feedback), got {check!r}")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise ValueError(f"Retry needs attempts >= 0 (answers drawn after the first), got {attempts!r}")
        self.sample_retries = check_temperature(sample_retries, "sample_retries")
        for option, value in (("vary_demos", vary_demos), ("train_retries", train_retries)):
            if not isinstance(value, bool):
                raise TypeError(f"Retry's {option} is True or False, got {value!r}")
        if attempts and self.sample_retries is None and not vary_demos:
            raise ValueError("Retry without sample_retries would repeat a greedy answer on every attempt: pass "
                             "sample_retries=T (e.g. 0.8), vary_demos=True (retries shown other retrieved demos), "
                             "or attempts=0")
        self.vary_demos = vary_demos
        self.train_retries = train_retries
        sig = task_signature(signature)
        self.check = check
        self.attempts = attempts
        self.outputs = list(sig.output_fields)
        self.solver = predictor(sig)

    def forward(self, **inputs):
        if not self.train_retries and not greedy_run(self.solver):  # a training rollout: first answers only
            return self.solver(**inputs)
        shown = list(self.solver.demos)
        split = self._retrieved(inputs, shown)
        if split is None and self.sample_retries is None:
            # nothing to vary and no temperature: every retry would repeat the first answer (an uncompiled program
            # has no retrieved demos yet: compile installs them), so it stands alone
            return self.solver(**inputs)
        config = greedy_run_config(self.solver, self.sample_retries)
        current = self.solver(**inputs)
        rejected = False  # whether `current` has been checked and rejected already
        try:
            for _ in range(self.attempts):
                if not rejected and self.check(inputs, {k: getattr(current, k) for k in self.outputs})[0]:
                    break
                if split is not None:  # other examples: the nearest whose answers none shown so far has
                    static, retriever, seen = split
                    retrieved = retriever.select(inputs, unlike=seen + static)
                    seen += retrieved
                    self.solver.demos = static + retrieved
                try:
                    current, rejected = self.solver(**inputs, config=config), False
                except Exception:  # kept in the graph by the tracer; a failed attempt, the last parsed answer stands
                    rejected = True
        finally:
            self.solver.demos = shown
        return current

    def _retrieved(self, inputs: dict, shown: list):
        """``(static demos, retriever, retrieved demos shown)`` when retries should vary the solver's retrieved
        demos: ``vary_demos`` is on and this run's solver shows exactly its retriever's nearest demos after its
        static ones (what ``wfc.retrieve.select_demos`` put there); else None (the retries repeat the prompt)."""
        retriever = getattr(self.solver, "wfc_retriever", None)
        if not self.vary_demos or not isinstance(retriever, DemoRetriever) or not retriever.applies(inputs):
            return None
        nearest = retriever.select(inputs)
        if not nearest or len(shown) < len(nearest) or shown[len(shown) - len(nearest):] != nearest:
            return None
        return shown[:len(shown) - len(nearest)], retriever, list(nearest)
