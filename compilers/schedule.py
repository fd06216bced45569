"""Learning-rate schedules: the multiplier of an adapter's base learning rate at each optimizer step.

A schedule is a pure function ``(step, total) -> multiplier`` (``step`` is 1-based: the step about to be taken;
``total`` the compile's ``steps``). Registry :data:`SCHEDULES`; :func:`lr_multiplier` adds linear warm-up and a floor:

- warm-up: steps ``1..warmup`` ramp linearly ``1/warmup, 2/warmup, ..., 1``;
- after it, the schedule's own shape over the remaining ``total - warmup`` steps, from 1 at the first of them down
  to ``min_ratio`` at the last (``constant`` stays at 1; a single step after warm-up takes the full rate; steps past
  ``total`` hold the floor);
- the multiplier is always in ``[min_ratio, 1]`` after warm-up and never above 1.

:func:`partial_step_scale` is a second factor, for dynamic sampling (``scale_partial_steps``): a step whose draw
rounds ran out before ``examples_per_step`` examples with signal were found takes ``kept / examples_per_step`` of
the rate. The missing examples count as zero gradient, as the flat groups of GRPO without dynamic sampling do, rather
than a few groups taking a full-size Adam step (Adam's update size does not shrink with a smaller loss, the rate
does).

Why decay here: with a constant rate the demo's validation rose to a peak and fell back on some seeds (stop 22:
0.27 at step 5, 0.21 at step 10); a decaying rate takes smaller steps once the policy is near a good one. The base
rate stays in the optimizer (``AdapterOptimizers``), so a cliff rollback's ``cliff_lr_factor`` scales it and the
schedule keeps applying on top.
"""

from __future__ import annotations

import math
from typing import Callable

Shape = Callable[[float], float]  # progress in [0, 1] -> multiplier before the floor, 1 at 0

SCHEDULES: dict[str, Shape] = {
    "constant": lambda p: 1.0,
    "linear": lambda p: 1.0 - p,
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
}


def lr_multiplier(step: int, total: int, *, schedule: str = "constant", warmup: int = 0,
                  min_ratio: float = 0.0) -> float:
    """The multiplier of the base learning rate for optimizer step ``step`` (1-based) of ``total``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule={schedule!r} is unknown: use one of {sorted(SCHEDULES)}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_ratio}")
    if step < 1:
        raise ValueError(f"step is 1-based, got {step}")
    if warmup > 0 and step <= warmup:
        return step / warmup
    span = total - warmup  # decay steps after warm-up
    # a resumed compile may run past the planned total (steps raised): hold the floor there
    progress = 0.0 if span <= 1 else min((step - warmup - 1) / (span - 1), 1.0)
    shape = SCHEDULES[schedule](progress)
    return min_ratio + (1.0 - min_ratio) * shape


def partial_step_scale(kept: int, quota: int) -> float:
    """The share of a full step that ``kept`` examples with signal make, of the ``quota`` a step holds:
    ``min(kept / quota, 1)`` (0 with nothing kept; a round that overshot the quota counts as full)."""
    if quota < 1:
        raise ValueError(f"quota (examples_per_step) must be >= 1, got {quota}")
    if kept < 0:
        raise ValueError(f"kept must be >= 0, got {kept}")
    return min(kept / quota, 1.0)
