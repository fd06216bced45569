"""EvalOpt: a generator proposes, an evaluator judges, an optimizer revises, up to ``rounds`` revisions.

Stops as soon as the evaluator accepts (its verdict's first word reads as accept: "correct", "yes", ...; see
``wfc.verdict``). Roles: ``generator``, ``evaluator`` (called once per round: a variable number of times per rollout),
``optimizer`` (0..rounds times).

``choose_verdict=True`` declares the verdict as ``Literal["correct", "incorrect"]``: the engine then decodes it as one
of the two (``SamplingParams.choices``), so every verdict is readable and decides, where a small model's free-text
verdict is prose that reads as neither and always sends the proposal to revision. The optimizer is then told only
the word, not a reason.
"""

from __future__ import annotations

from typing import Literal

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
                 choose_verdict: bool = False, name: str | None = None):
        super().__init__(name=name)
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"EvalOpt needs rounds >= 0, got {rounds!r}")
        sig = task_signature(signature)
        self.rounds = rounds
        self.outputs = list(sig.output_fields)
        self.generator = predictor(sig)
        if choose_verdict:
            check = "Check the proposed solution of the task: is it right?"
            verdict = (Verdict, "verdict")
        else:
            check = ("Check the proposed solution of the task. Reply 'correct' if it is right; otherwise reply "
                     "'incorrect' and say briefly what is wrong.")
            verdict = (str, "'correct', or 'incorrect' with the reason")
        self.evaluator = predictor(derive(sig, outputs_as_inputs=True, instructions=check,
                                          outputs={"verdict": verdict}))
        self.optimizer = predictor(derive(
            sig, outputs_as_inputs=True, prefix="previous_",
            instructions=f"{sig.instructions.strip()}\nA reviewer found a problem with the previous solution. Fix it.",
            extra_inputs={"feedback": (str, "what the reviewer found wrong")},
        ))

    def forward(self, **inputs):
        current = self.generator(**inputs)
        for _ in range(self.rounds):
            proposal = {k: getattr(current, k) for k in self.outputs}
            verdict = self.evaluator(**inputs, **proposal).verdict
            if accepted(verdict):
                break
            previous = {f"previous_{k}": v for k, v in proposal.items()}
            current = self.optimizer(**inputs, **previous, feedback=verdict)
        return current
