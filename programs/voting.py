"""Voting: one voter role called ``n`` times in parallel on the same input, then an aggregator.

The ``n`` voters are one role with fan-out (path ``voter``), not ``n`` roles: they share an adapter and their calls
form one group per invocation index. They are submitted concurrently so the engine generates them in one batch.
A voter whose output cannot be parsed (or that crashes) is left out of the vote, and stays in the rollout graph with
its status; if every voter fails, the run fails with the first error.
"""

from __future__ import annotations

import dspy

from programs._fields import derive, primary_output, task_signature
from wfc.lower import parallel_map
from wfc.program import Program


class Voting(Program):
    """n parallel voters answer, an aggregator picks the final answer."""

    def __init__(self, signature, *, n: int = 4, predictor: type[dspy.Predict] = dspy.Predict,
                 name: str | None = None):
        super().__init__(name=name)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"Voting needs n >= 1 voters, got {n!r}")
        sig = task_signature(signature)
        self.n = n
        self.output = primary_output(sig)
        self.voter = predictor(sig)
        self.aggregator = predictor(derive(
            sig,
            instructions=(f"{sig.instructions.strip()}\nSeveral solvers proposed answers. "
                          "Give the final answer, usually the one most of them agree on."),
            extra_inputs={"candidates": (list[str], "the solvers' proposed answers")},
        ))

    def forward(self, **inputs):
        def vote(_):
            try:
                return self.voter(**inputs)
            except Exception as exc:  # kept in the graph by the tracer; left out of the vote here
                return exc

        votes = parallel_map(vote, range(self.n))
        good = [v for v in votes if not isinstance(v, Exception)]
        if not good:
            raise votes[0]
        candidates = [str(getattr(v, self.output)) for v in good]
        return self.aggregator(**inputs, candidates=candidates)
