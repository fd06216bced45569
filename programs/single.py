"""Single: one role, the baseline every topology is compared with."""

from __future__ import annotations

import dspy

from programs._fields import task_signature
from wfc.program import Program


class Single(Program):
    """One solver role answers the task directly."""

    def __init__(self, signature, *, predictor: type[dspy.Predict] = dspy.Predict, name: str | None = None):
        super().__init__(name=name)
        self.solver = predictor(task_signature(signature))

    def forward(self, **inputs):
        return self.solver(**inputs)
