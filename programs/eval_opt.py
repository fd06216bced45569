"""EvalOpt: a generator proposes, an evaluator judges, an optimizer revises, up to ``rounds`` revisions.

Stops as soon as the evaluator accepts (its verdict's first word reads as accept: "correct", "yes", ...; see
``wfc.verdict``). Roles: ``generator``, ``evaluator`` (called once per round: a variable number of times per rollout),
``optimizer`` (0..rounds times).

``choose_verdict=True`` declares the verdict as ``Literal["correct", "incorrect"]``: the engine then decodes it as one
of the two (``SamplingParams.choices``), so every verdict is readable and decides, where a small model's free-text
verdict is prose that reads as neither and always sends the proposal to revision. The optimizer is then told only
the word, not a reason.

``check=fn`` judges with a function instead of an evaluator role: ``fn(inputs, proposal) -> (accepted, feedback)``
(e.g. ``wfc.tasks.visible.example_check``, which runs the examples a code prompt shows). The program then has two
roles, ``generator`` and ``optimizer``, and the optimizer is told the check's feedback. A check costs no tokens, so
at an equal token budget the optimizer's calls are all the program spends beyond the generator's. Make ``fn`` a
module-level function: an artifact records it by name (anything else needs the pickle and ``trust_code=True``).

``show_previous=False``: the optimizer is not shown the proposal it replaces, only the task and the feedback, and
writes a new answer. Why: shown the wrong code, SmolLM2-135M's untrained fixer repeated it verbatim in 13 of its 16
failed fixes (docs/results.md, stop 41); told only what the check found, it fixed 7 of the tasks one trained writer
failed where the fixer shown the code fixed 3 (on two other writers, the same as shown: 0 and 6). Not the default:
compiled on three seeds with the fixer frozen (``examples/code_workflow.py --check --frozen-fixer --fresh-fix``) it
scored 0.781 / 0.856 / 0.863 against 0.756 / 0.856 / 0.863 with the fixer shown the code (docs/results.md).
"""

from __future__ import annotations

from typing import Callable, Literal

import dspy

from programs._fields import derive, task_signature
from wfc.program import Program
from wfc.verdict import read_verdict

Verdict = Literal["correct", "incorrect"]  # the evaluator's output under choose_verdict=True


def accepted(verdict: str) -> bool:
    """Whether the evaluator accepted: its verdict's first word reads as accept (``wfc.verdict``, the reading that
    verified credit scores the evaluator on); a reject or an unreadable verdict is revised."""
    return read_verdict(verdict) is True


class EvalOpt(Program):
    """Generate, evaluate, revise until accepted or out of rounds."""

    def __init__(self, signature, *, rounds: int = 2, predictor: type[dspy.Predict] = dspy.Predict,
                 choose_verdict: bool = False, check: Callable | None = None, show_previous: bool = True,
                 name: str | None = None):
        super().__init__(name=name)
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"EvalOpt needs rounds >= 0, got {rounds!r}")
        if check is not None and not callable(check):
            raise TypeError(f"EvalOpt's check is a function (inputs, proposal) -> (accepted, feedback), got {check!r}")
        if check is not None and choose_verdict:
            raise ValueError("EvalOpt takes check= or choose_verdict=True, not both: a check replaces the evaluator")
        sig = task_signature(signature)
        self.rounds = rounds
        self.outputs = list(sig.output_fields)
        self.check = check
        self.show_previous = bool(show_previous)
        self.generator = predictor(sig)
        if check is None:
            if choose_verdict:
                ask = "Check the proposed solution of the task: is it right?"
                verdict = (Verdict, "verdict")
            else:
                ask = ("Check the proposed solution of the task. Reply 'correct' if it is right; otherwise reply "
                       "'incorrect' and say briefly what is wrong.")
                verdict = (str, "'correct', or 'incorrect' with the reason")
            self.evaluator = predictor(derive(sig, outputs_as_inputs=True, instructions=ask,
                                              outputs={"verdict": verdict}))
        # (shown the proposal, not shown it): what the optimizer is told, by who judged
        told = ({True: "The previous solution failed a check. Fix it.",
                 False: "An earlier solution failed this check. Write a new, correct solution."} if check is not None
                else {True: "A reviewer found a problem with the previous solution. Fix it.",
                      False: "A reviewer found a problem with an earlier solution. Write a new, correct solution."})
        self.optimizer = predictor(derive(
            sig, outputs_as_inputs=self.show_previous, prefix="previous_",
            instructions=f"{sig.instructions.strip()}\n{told[self.show_previous]}",
            extra_inputs={"feedback": (str, f"what the {'check' if check is not None else 'reviewer'} found wrong")},
        ))

    def forward(self, **inputs):
        current = self.generator(**inputs)
        for _ in range(self.rounds):
            proposal = {k: getattr(current, k) for k in self.outputs}
            check = getattr(self, "check", None)  # getattr: artifacts saved before check= rebuild without it
            if check is not None:
                ok, feedback = check(inputs, proposal)
            else:
                feedback = self.evaluator(**inputs, **proposal).verdict
                ok = accepted(feedback)
            if ok:
                break
            # getattr: artifacts saved before show_previous= rebuild without it (and showed the proposal)
            show = getattr(self, "show_previous", True)
            previous = {f"previous_{k}": v for k, v in proposal.items()} if show else {}
            current = self.optimizer(**inputs, **previous, feedback=feedback)
        return current
