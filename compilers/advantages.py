"""Group-relative advantage estimators: one group's rewards in, one advantage per member out.

Data model: a *group* is the rewards of the rollouts that share a prompt and a role (see the group stage). Every
estimator is a pure function ``rewards -> list[float]`` over one group, where ``rewards`` is a non-empty
``Sequence[float]`` or a 1-D tensor; the output has the same length and order as the input. Arithmetic is done in
Python floats (float64), so results do not depend on the tensor dtype the caller used.

Estimators (registry :data:`ADVANTAGES`, look-up :func:`get_estimator`):

- ``grpo``:    ``(r_i - mean) / (std + eps)``, *population* std (divide by ``n``, not ``n - 1``), ``eps = 1e-6``.
- ``dr_grpo``: ``r_i - mean`` (Dr. GRPO: no std scaling, so easy/hard prompts are not re-weighted).
- ``rloo``:    ``r_i - mean_{j != i} r_j`` (leave-one-out baseline; equals ``n / (n - 1) * (r_i - mean)``).
- ``mc_grpo``: ``r_i - median`` (MC-GRPO: median baseline; optionally scaled by ``std + eps`` like ``grpo``).

Invariants (tested):

- A zero-variance group (all rewards equal, which includes a group of one) gives *exactly* ``0.0`` for every member
  under every estimator. This is checked up front rather than left to the arithmetic, because e.g. ``mean([0.1] * 3)``
  is not exactly ``0.1`` in floating point. :func:`group_advantages` reports such groups as ``no_signal``.
- Rewards must be finite. NaN or inf raise ``ValueError``: a failed rollout must be resolved to a failure score by
  the caller before it gets here; an advantage of "unknown" is not 0 and must not be silently made one.
- An empty group raises ``ValueError``.
- ``grpo``, ``dr_grpo`` and ``rloo`` advantages sum to zero (up to rounding); ``mc_grpo``'s need not (the median is
  not the mean), which is the point of it.

Options such as ``eps`` are keyword-only; bind them with :func:`functools.partial` and pass the result wherever an
estimator is expected, e.g. ``group_advantages(r, partial(grpo, eps=1e-4))``.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Union

import torch

Rewards = Union[Sequence[float], torch.Tensor]
Estimator = Callable[[Rewards], list[float]]

DEFAULT_EPS = 1e-6


def as_rewards(rewards: Rewards) -> list[float]:
    """Validate one group's rewards and return them as a list of Python floats.

    Raises ``ValueError`` for an empty group, a tensor that is not 1-D, and NaN/inf rewards; ``TypeError`` for
    members that are not numbers.
    """
    if isinstance(rewards, torch.Tensor):
        if rewards.dim() != 1:
            raise ValueError(
                f"rewards must be a 1-D tensor (one group), got shape {tuple(rewards.shape)}; "
                "call the estimator once per group"
            )
        values = [float(x) for x in rewards.detach().cpu().tolist()]
    else:
        if isinstance(rewards, (str, bytes)):
            raise TypeError("rewards must be a sequence of numbers, not a string")
        values = []
        for x in rewards:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise TypeError(f"rewards must be numbers, got {x!r} of type {type(x).__name__}")
            values.append(float(x))
    if not values:
        raise ValueError("empty reward group: a group needs at least one scored rollout")
    bad = [i for i, x in enumerate(values) if not math.isfinite(x)]
    if bad:
        raise ValueError(
            f"non-finite rewards at positions {bad} ({[values[i] for i in bad]}); resolve failed rollouts to a "
            "failure score (e.g. 0.0) before computing advantages"
        )
    return values


def is_zero_variance(values: Sequence[float]) -> bool:
    """True when all rewards are exactly equal (a group of one included): the group carries no learning signal."""
    return max(values) == min(values)


def _group_estimator(fn: Callable[..., list[float]]) -> Estimator:
    """Wrap an estimator body with the shared contract: validate rewards, and exact zeros for zero-variance groups.

    The body receives a validated ``list[float]`` of length >= 2 with non-zero spread.
    """

    @functools.wraps(fn)
    def estimator(rewards: Rewards, **options: float | bool) -> list[float]:
        values = as_rewards(rewards)
        if is_zero_variance(values):
            return [0.0] * len(values)
        return fn(values, **options)

    return estimator


def _population_std(values: Sequence[float]) -> float:
    return statistics.pstdev(values)


@_group_estimator
def grpo(rewards: list[float], *, eps: float = DEFAULT_EPS) -> list[float]:
    """``(r_i - mean) / (pstd + eps)`` with the population std (``n`` in the denominator). ``eps >= 0``."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    mean = statistics.fmean(rewards)
    scale = _population_std(rewards) + eps
    return [(r - mean) / scale for r in rewards]


@_group_estimator
def dr_grpo(rewards: list[float]) -> list[float]:
    """``r_i - mean``: mean baseline, no std scaling (Dr. GRPO)."""
    mean = statistics.fmean(rewards)
    return [r - mean for r in rewards]


@_group_estimator
def rloo(rewards: list[float]) -> list[float]:
    """``r_i - (sum_j r_j - r_i) / (n - 1)``: each member's baseline is the mean of the *other* members.

    A group of one has no "others"; it is zero-variance and gets 0 by the shared contract.
    """
    n, total = len(rewards), math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


@_group_estimator
def mc_grpo(rewards: list[float], *, scale: bool = False, eps: float = DEFAULT_EPS) -> list[float]:
    """``r_i - median`` (MC-GRPO); with ``scale=True``, divided by ``pstd + eps`` exactly as in :func:`grpo`.

    Median of an even-size group: the mean of the two middle values (``statistics.median``), so no member need get
    exactly 0. With an odd size exactly the median member(s) get 0; MC-GRPO samples ``G + 1`` rollouts for that reason
    and the caller may drop the zero-advantage pivot from the batch.

    Scaling uses the std, not the median absolute deviation: MAD is 0 in groups such as ``[0, 0, 0, 1]`` that do carry
    a signal, and dividing by ``0 + eps`` would blow the advantage up to ``1 / eps``.
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    median = statistics.median(rewards)
    divisor = _population_std(rewards) + eps if scale else 1.0
    return [(r - median) / divisor for r in rewards]


ADVANTAGES: dict[str, Estimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "mc_grpo": mc_grpo,
}


def get_estimator(name: str) -> Estimator:
    """The estimator registered under ``name``; ``ValueError`` naming the valid choices otherwise."""
    try:
        return ADVANTAGES[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(ADVANTAGES))
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of: {valid}") from None


@dataclass(frozen=True)
class GroupAdvantage:
    """One group's advantages, in the order of its rewards.

    ``no_signal`` is True when every reward in the group was equal (a group of one included); then every advantage
    is exactly 0.0 and the group contributes no policy gradient.
    """

    advantages: list[float]
    no_signal: bool


def group_advantages(rewards: Rewards, estimator: str | Estimator) -> GroupAdvantage:
    """Advantages of one group under ``estimator`` (a registry name or an estimator callable), plus its signal flag.

    The zero-variance contract holds for any callable, registered or not: a ``no_signal`` group gets exact zeros
    without calling the estimator.
    """
    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    if not callable(fn):
        raise TypeError(f"estimator must be a name in ADVANTAGES or a callable, got {type(estimator).__name__}")
    values = as_rewards(rewards)
    if is_zero_variance(values):
        return GroupAdvantage(advantages=[0.0] * len(values), no_signal=True)
    advantages = [float(a) for a in fn(values)]
    if len(advantages) != len(values):
        raise ValueError(f"estimator returned {len(advantages)} advantages for a group of {len(values)} rewards")
    if not all(math.isfinite(a) for a in advantages):
        raise ValueError(f"estimator returned non-finite advantages {advantages} for rewards {values}")
    return GroupAdvantage(advantages=advantages, no_signal=False)


def no_signal_rate(groups: Iterable[GroupAdvantage]) -> float:
    """Fraction of ``groups`` with ``no_signal`` (in [0, 1]). ``ValueError`` when there are no groups at all."""
    flags = [g.no_signal for g in groups]
    if not flags:
        raise ValueError("no_signal_rate needs at least one group; got none")
    return sum(flags) / len(flags)


def role_scales(advantages: Iterable[tuple[str, Sequence[float]]], *, eps: float = DEFAULT_EPS) -> dict[str, float]:
    """Per-role advantage normalisation (Dr.MAS / AgentRL): role -> the factor that gives its advantages unit RMS.

    ``advantages`` is ``(role, one group's advantages)`` for every group of a step. A role's RMS is taken over the
    members of its groups *with signal* (zero-variance groups are all-zero and would only shrink it); a role with no
    such group gets 1.0, so exact zeros stay zeros. Why: with one shared adapter, a role whose rewards vary on a
    larger scale (a verifier's 0/1 next to a partial-credit score) would otherwise hold most of the gradient.
    """
    sums: dict[str, list[float]] = {}
    for role, values in advantages:
        vals = [float(a) for a in values]
        acc = sums.setdefault(role, [0.0, 0.0])
        if any(a != 0.0 for a in vals):
            acc[0] += math.fsum(a * a for a in vals)
            acc[1] += len(vals)
    return {role: (1.0 / (math.sqrt(sq / n) + eps) if n else 1.0) for role, (sq, n) in sums.items()}
