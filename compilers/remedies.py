"""Choosing the remedies for a weak signal from a probe of the untrained program (``auto_remedies``).

GRPO learns from a group only when its rollouts score differently. Before step 1, ``auto_remedies`` samples the
untrained program ``K`` times on each of ``AUTO_PROBE_EXAMPLES`` training examples (a seeded subset: the probe of all
400 examples of the ChainOfThought demo took 18.5 min on the 2-core CPU, longer than the compile after it) and
:func:`choose` reads the rates:

- *signal at the configured group size*: the expected share of groups of ``G`` rollouts with at least one pass and
  one failure, ``mean_e [1 - r_e^G - (1 - r_e)^G]`` (independent runs at the probed rate). At or above
  ``ENOUGH_SIGNAL`` nothing is switched on.
- *adaptive rollouts* when signal is short and some example passed: a low-rate example gets a bigger group, so its
  group holds a success (``compilers.sampling.adaptive_group_sizes``), within the same rollout budget.
- *a warm start from the probe's own passing runs* when the mean pass rate is under ``WARM_BELOW`` and the probe
  found at least ``WARM_MIN_RUNS`` passing runs: fine-tuning on them first raises the rate GRPO starts from (the runs
  are already sampled: it costs the fine-tune only).
- *starved*: no example passed in ``K`` runs. No sampling remedy can make a group with a pass; the reason says so and
  what would help (easier examples first, more tokens a call, a stronger teacher).

The thresholds are the first choice, stated here as the rule's constants; the choice, the numbers it rests on and its
reasons go to the step log (``remedies`` record) and the manifest. Pure: same rates, same choice.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

ENOUGH_SIGNAL = 0.5  # expected share of groups with signal at which the configured sampling is left alone
WARM_BELOW = 0.2  # mean probed pass rate under which a warm start is worth its fine-tune
WARM_MIN_RUNS = 8  # passing probe runs a warm start needs to be more than noise
AUTO_PROBE_RUNS = 4  # probe runs per example when pass_rate_probe is unset
AUTO_PROBE_EXAMPLES = 64  # training examples the probe samples (a seeded subset of a larger trainset)


def probe_subset(n: int, size: int, *, seed: int) -> list[int]:
    """Indices of the examples to probe: all of ``range(n)`` when ``n <= size``, else ``size`` of them drawn by
    ``random.Random(seed)`` (no global generator), in increasing order."""
    if n <= size:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), size))


def pass_rates(rollouts: Sequence[Sequence[Any]], score: Callable[[Any], float]) -> list[float]:
    """Per example, the mean of its runs' rewards clipped to [0, 1] (``rollouts[e]``: example ``e``'s runs)."""
    return [statistics.fmean(min(max(score(g), 0.0), 1.0) for g in graphs) for graphs in rollouts]


def group_signal(rates: Sequence[float], group_size: int) -> float:
    """Expected share of groups of ``group_size`` independent runs that hold a pass and a failure (rates in [0, 1];
    a reward between 0 and 1 counts as its probability of passing)."""
    if not rates:
        return 0.0
    return statistics.fmean(1.0 - r ** group_size - (1.0 - r) ** group_size for r in rates)


@dataclass(frozen=True)
class Remedies:
    adaptive_rollouts: bool
    warm_start: bool
    starved: bool
    reasons: tuple[str, ...]
    stats: dict[str, Any]


def choose(rates: Sequence[float], *, group_size: int, passing_runs: int, runs_per_example: int) -> Remedies:
    """The remedies the probed ``rates`` (one per training example) call for at ``group_size``, given the probe's
    ``passing_runs`` (runs at full marks) out of ``runs_per_example`` per example (module doc)."""
    if not rates:
        raise ValueError("no probed rates: auto_remedies needs a non-empty trainset")
    mean = statistics.fmean(rates)
    passed = sum(r > 0 for r in rates) / len(rates)
    signal = group_signal(rates, group_size)
    stats = {"pass_rate": mean, "examples_passed": passed, "group_signal": signal, "group_size": group_size,
             "passing_runs": passing_runs, "runs_per_example": runs_per_example, "examples": len(rates)}
    at = f"at group_size {group_size}, {signal:.0%} of groups would score differently"
    if passed == 0:
        return Remedies(False, False, True, (
            f"starved: no training example passed in {runs_per_example} sampled runs (pass rate 0): no sampling "
            "remedy can make a group with a pass; give easier examples first (curriculum_key), more tokens a call "
            "(max_tokens), or demos (strategy 'p -> w')",), stats)
    if signal >= ENOUGH_SIGNAL:
        return Remedies(False, False, False, (f"{at} (>= {ENOUGH_SIGNAL:.0%}): no remedy needed",), stats)
    reasons = [f"adaptive_rollouts: {at} (< {ENOUGH_SIGNAL:.0%}) and {passed:.0%} of examples passed at least "
               "once: low-rate examples get bigger groups, within the same rollout budget"]
    warm = mean < WARM_BELOW and passing_runs >= WARM_MIN_RUNS
    if warm:
        reasons.append(f"warm start: mean pass rate {mean:.3f} (< {WARM_BELOW}) with {passing_runs} passing probe "
                       "runs to fine-tune on first")
    elif mean < WARM_BELOW:
        reasons.append(f"no warm start: only {passing_runs} passing probe runs (< {WARM_MIN_RUNS})")
    return Remedies(True, warm, False, tuple(reasons), stats)
