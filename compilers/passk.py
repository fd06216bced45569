"""Sampled pass@k of a program: can it solve a task at all when sampled, before any training?

:func:`sampled_passes` runs ``n`` sampled rollouts per example and counts the passing ones (a metric of at least 1,
full marks); :func:`mean_pass_at_k` turns those counts into the unbiased pass@k estimate (Chen et al. 2021;
``wfc.tasks.code.pass_at_k`` per example) averaged over the examples. pass@k with ``k < n`` uses every one of the
``n`` samples, so it has less variance than drawing exactly ``k``.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import dspy

from compilers.score import score_rollout
from wfc.engines.base import SamplingParams
from wfc.lower import derive_seed, run_rollouts
from wfc.tasks.code import pass_at_k

PASS = 1.0  # a rollout passes when the metric gives it full marks


def mean_pass_at_k(passes: Sequence[int], n: int, k: int) -> float:
    """The mean over examples of pass@k, each example having ``passes[i]`` passing samples out of ``n``.
    ``ValueError`` for no examples, or for counts / ``k`` outside ``0 <= c <= n``, ``1 <= k <= n``."""
    if not passes:
        raise ValueError("pass@k needs at least one example's pass count")
    return sum(pass_at_k(n, c, k) for c in passes) / len(passes)


def sampled_passes(program: dspy.Module, examples: Sequence[dspy.Example], engine, *, metric: Callable, n: int,
                   temperature: float, max_tokens: int, seed: int,
                   adapters: Mapping[str, str | None] | None = None) -> list[int]:
    """Per example, how many of ``n`` sampled rollouts of ``program`` pass (see :data:`PASS`). Rollout ``r`` of
    example ``i`` is seeded from ``(seed, i, r)``, so the counts repeat for one seed; ``adapters`` maps roles to
    adapters (default: the base model). A crashed or unparsed rollout fails; a metric that raises scores 0."""
    if n < 1:
        raise ValueError(f"n (samples per example) must be >= 1, got {n}")
    seeds = [derive_seed("pass@k", seed, i) for i in range(len(examples))]
    graphs = run_rollouts(program, list(examples), engine, repeats=n, adapters=dict(adapters or {}), seeds=seeds,
                          sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens))
    return [sum(score_rollout(metric, g, failure_score=0.0, metric_failure_score=0.0) >= PASS for g in gs)
            for gs in graphs]
