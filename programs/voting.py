"""Voting: one voter role called ``n`` times in parallel on the same input, then an aggregator.

The ``n`` voters are one role with fan-out (path ``voter``), not ``n`` roles: they share an adapter and their calls
form one group per invocation index. They are submitted concurrently so the engine generates them in one batch.
A voter whose output cannot be parsed (or that crashes) is left out of the vote, and stays in the rollout graph with
its status; if every voter fails, the run fails with the first error.

``skip_unanimous=True``: when every voter that answered gave the same text (compared after stripping whitespace),
the run returns that answer without calling the aggregator: there is nothing to choose, and a weak aggregator can
only lose it (measured on the demo: greedy voters right on 48 of 100 problems, the aggregator's copy right on 40).
Greedy voters are always unanimous, so at greedy inference the program then costs one voter call per input; in
sampled training rollouts the aggregator is called, and trained, exactly when the voters disagree.

``sample_voters=T``: in a greedy run (evaluation, ``wfc.load``, serving) the voters sample at temperature ``T``, so
the vote has distinct answers to decide between (self-consistency); in a sampled run (training rollouts) every call
keeps the run's own temperature, so the trainer's log-probs stay those of the distribution the calls were drawn from.
(``programs._sampling``: the rule Retry's attempts follow too.)
"""

from __future__ import annotations

import dspy

from programs._fields import derive, primary_output, task_signature
from programs._sampling import check_temperature, greedy_run_config
from wfc.lower import parallel_map
from wfc.program import Program


class Voting(Program):
    """n parallel voters answer, an aggregator picks the final answer."""

    def __init__(self, signature, *, n: int = 4, predictor: type[dspy.Predict] = dspy.Predict,
                 name: str | None = None, skip_unanimous: bool = False, sample_voters: float | None = None):
        super().__init__(name=name)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"Voting needs n >= 1 voters, got {n!r}")
        sig = task_signature(signature)
        self.n = n
        self.skip_unanimous = bool(skip_unanimous)
        self.sample_voters = check_temperature(sample_voters, "sample_voters")
        self.output = primary_output(sig)
        self.voter = predictor(sig)
        self.aggregator = predictor(derive(
            sig,
            instructions=(f"{sig.instructions.strip()}\nSeveral solvers proposed answers. "
                          "Give the final answer, usually the one most of them agree on."),
            extra_inputs={"candidates": (list[str], "the solvers' proposed answers")},
        ))

    def _voter_config(self) -> dict:
        """The voters' per-call DSPy config: a temperature only when this run is greedy and ``sample_voters`` is set."""
        # getattr: artifacts saved before the option existed rebuild without the attribute
        return greedy_run_config(self.voter, getattr(self, "sample_voters", None))

    def forward(self, **inputs):
        config = self._voter_config()

        def vote(_):
            try:
                return self.voter(**inputs, config=config)  # {}: the run's own settings
            except Exception as exc:  # kept in the graph by the tracer; left out of the vote here
                return exc

        votes = parallel_map(vote, range(self.n))
        good = [v for v in votes if not isinstance(v, Exception)]
        if not good:
            raise votes[0]
        candidates = [str(getattr(v, self.output)) for v in good]
        if getattr(self, "skip_unanimous", False) and len({c.strip() for c in candidates}) == 1:
            return good[0]
        return self.aggregator(**inputs, candidates=candidates)
