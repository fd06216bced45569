"""DSPy signatures the built-in tasks are solved with: :class:`SolveMath` and :class:`WriteCode`.

Field names are part of the contract with the metrics: :func:`wfc.tasks.math.math_metric` reads ``answer``,
:func:`wfc.tasks.code.code_metric` reads ``code``; the inputs match the examples' ``with_inputs``.
"""

from __future__ import annotations

import dspy


class SolveMath(dspy.Signature):
    """Solve the problem. Give the final answer as a number."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="the final answer: a single number, no units")


class WriteCode(dspy.Signature):
    """Write a Python function that does what the prompt asks. Return only the code, with any imports it needs."""

    prompt: str = dspy.InputField()
    code: str = dspy.OutputField(desc="complete Python source defining the requested function")
