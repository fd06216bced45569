"""Sampling inside a greedy run: the one rule topologies that draw several answers at inference share.

A program that needs distinct answers from one role (Voting's voters, Retry's attempts) samples them at its own
temperature only when the run is greedy (evaluation, ``wfc.load``, serving). In a sampled run (training rollouts)
every call keeps the run's own temperature, so the trainer's log-probs stay those of the distribution the calls were
drawn from. The run's temperature is read from the role's bound LM (``wfc.lower.bind`` gives each role its own),
else DSPy's.
"""

from __future__ import annotations

from typing import Any

import dspy


def check_temperature(value: Any, option: str) -> float | None:
    """``value`` as a temperature (> 0) or None; a ValueError naming ``option`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{option} is a temperature used in greedy runs: a number > 0 or None, got {value!r}")
    return float(value)


def greedy_run(predictor: dspy.Predict) -> bool:
    """Whether the run ``predictor`` is called in is greedy (evaluation, ``wfc.load``, serving) rather than sampled
    (training rollouts)."""
    lm = predictor.lm or dspy.settings.lm
    return ((getattr(lm, "kwargs", None) or {}).get("temperature") or 0.0) == 0.0


def greedy_run_config(predictor: dspy.Predict, temperature: float | None) -> dict:
    """The per-call DSPy config for ``predictor``: ``{"temperature": temperature}`` when it is set and the run is
    greedy, else ``{}`` (the run's own settings)."""
    return {"temperature": temperature} if temperature is not None and greedy_run(predictor) else {}
