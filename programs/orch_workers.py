"""OrchWorkers: an orchestrator splits the task into subtasks, one worker role per subtask, a synthesizer combines.

The worker is one role with a variable fan-out (1..``max_subtasks`` calls per rollout, in parallel). An orchestrator
that returns no subtasks gets one: the whole task.
"""

from __future__ import annotations

import dspy

from programs._fields import derive, task_signature
from wfc.lower import parallel_map
from wfc.program import Program


class OrchWorkers(Program):
    """Plan subtasks, solve them in parallel, synthesize the answer."""

    def __init__(self, signature, *, max_subtasks: int = 3, predictor: type[dspy.Predict] = dspy.Predict,
                 name: str | None = None):
        super().__init__(name=name)
        if not isinstance(max_subtasks, int) or max_subtasks < 1:
            raise ValueError(f"OrchWorkers needs max_subtasks >= 1, got {max_subtasks!r}")
        sig = task_signature(signature)
        self.max_subtasks = max_subtasks
        self.orchestrator = predictor(derive(
            sig, instructions=f"Break the task into 1 to {max_subtasks} short subtasks, one per line.",
            outputs={"subtasks": (list[str], "the subtasks, one per line")},
        ))
        self.worker = predictor(derive(
            sig, instructions="Solve this one subtask of the task. Be brief.",
            extra_inputs={"subtask": (str, "the subtask to solve")},
            outputs={"result": (str, "the subtask's result")},
        ))
        self.synthesizer = predictor(derive(
            sig, instructions=f"{sig.instructions.strip()}\nUse the results of the subtasks.",
            extra_inputs={"results": (list[str], "results of the subtasks")},
        ))

    def forward(self, **inputs):
        subtasks = [s for s in self.orchestrator(**inputs).subtasks if s.strip()][: self.max_subtasks]
        if not subtasks:
            subtasks = ["Solve the whole task."]
        results = parallel_map(lambda s: self.worker(**inputs, subtask=s).result, subtasks)
        return self.synthesizer(**inputs, results=results)
