"""Which training examples a step rolls out: difficulty-aware selection, a curriculum, and DAPO's signal quota.

Why: GRPO learns only from groups whose rewards differ. A prompt the policy always solves (pass rate 1) or never
solves (pass rate 0) yields zero-variance groups, so a step spent on it is a step wasted (the field notes' GSM8K probe
stalled at ~3% reward for exactly this reason). This stage keeps the step's rollouts on prompts with signal.

Data model: trainset examples are known by their index ``i``. :class:`PromptSampler` keeps, per example, a running
pass rate (exponential moving average of the mean reward of its rollouts; unknown until first seen) and draws indices
for a step:

- **order**: a seeded permutation of the pool, walked epoch by epoch (every example is drawn once per epoch before
  any is drawn twice), so the draw is reproducible and uniform when no rule applies;
- **band** (``band=(lo, hi)``): an example whose known pass rate is ``<= lo`` (too hard) or ``>= hi`` (too easy) is
  skipped while other examples remain in the epoch; too-hard ones are put on a replay list and come back after
  ``replay_after`` steps (the policy may have learnt enough by then), too-easy ones are retired for the epoch;
- **curriculum** (``curriculum_steps > 0``): the pool is ordered by ``difficulty[i]`` (easiest first) and only the
  easiest ``min(1, start + (1 - start) * step / curriculum_steps)`` fraction is drawn from; it grows to the whole
  pool by step ``curriculum_steps``. Where the task gives no difficulty, :func:`difficulty_from_rates` turns a
  measured pass rate per example (the compile's ``pass_rate_probe``) into one, and :meth:`PromptSampler.prime`
  installs both the order and the rates.

How many rollouts each drawn example gets: ``group_size`` each, or (``adaptive_rollouts``) the sizes
:func:`adaptive_group_sizes` gives from the running pass rates: an example that rarely passes gets a larger group, so
that its group likely holds a success (a group with a success on a hard example is signal; a group of failures is
none), within a budget of rollouts per draw taken from the examples that pass often.

The sampler is deterministic given its seed and the rewards it is shown, and its whole state is a JSON-able dict
(:meth:`PromptSampler.state_dict`), so a resumed compile draws exactly what an uninterrupted one would.

:func:`signal_examples` is the DAPO rule (dynamic sampling): an example's rollouts carry signal when at least one of
its role groups has non-equal rewards; the compile loop draws replacement examples until the step holds its quota of
examples with signal or its draw budget is spent.
"""

from __future__ import annotations

import math
import random
from typing import Any, Iterable, Mapping, Sequence


def in_band(rate: float | None, lo: float, hi: float) -> bool:
    """True when an example with running pass rate ``rate`` should be drawn: unknown rates are always in band."""
    return rate is None or lo < rate < hi


def ema(previous: float | None, value: float, alpha: float) -> float:
    """Exponential moving average; the first observation is taken as it is."""
    return value if previous is None else (1.0 - alpha) * previous + alpha * value


def curriculum_fraction(step: int, *, steps: int, start: float) -> float:
    """Share of the (easiest-first) pool open at ``step``: ``start`` at step 0, growing linearly to 1 at ``steps``."""
    if steps <= 0:
        return 1.0
    return min(1.0, start + (1.0 - start) * max(step, 0) / steps)


def group_size_for(rate: float | None, *, base: int, max_size: int, target: float) -> int:
    """The rollouts an example with running pass rate ``rate`` wants: ``base`` while the rate is unknown (None), else
    the smallest ``n`` in ``[2, max_size]`` with ``P(at least one pass in n) = 1 - (1 - rate)**n >= target``
    (``max_size`` when none reaches it, a rate of 0 included). Rates are clipped to ``[0, 1]``."""
    if rate is None:
        return base
    miss = 1.0 - min(max(float(rate), 0.0), 1.0)
    for n in range(2, max_size + 1):
        if 1.0 - miss**n >= target - 1e-12:  # the tolerance: 1 - 0.5**2 must meet a target of 0.75
            return n
    return max_size


def adaptive_group_sizes(rates: Sequence[float | None], *, base: int, max_size: int, budget: int,
                         target: float) -> list[int]:
    """Group size per drawn example (same order as ``rates``), summing to at most ``budget`` rollouts.

    Each example wants :func:`group_size_for` its rate. When the wants sum to more than ``budget``, they are capped
    at one level ``c`` (the largest with ``sum(min(want, c)) <= budget``; water-filling: the smallest wants are met
    whole, the largest are cut to the same size) and the rollouts left below ``budget`` go one each to the examples
    still cut, largest want first, ties in draw order. Deterministic; every size is at least 2. A ``budget`` below
    2 per example is a ``ValueError``."""
    if budget < 2 * len(rates):
        raise ValueError(f"a budget of {budget} rollouts cannot give {len(rates)} examples a group of 2 each: "
                         f"raise the budget (adaptive_budget) to at least {2 * len(rates)}")
    wants = [group_size_for(r, base=base, max_size=max_size, target=target) for r in rates]
    if sum(wants) <= budget:
        return wants
    cap = max(c for c in range(2, max(wants) + 1) if sum(min(w, c) for w in wants) <= budget)
    sizes = [min(w, cap) for w in wants]
    cut = sorted((i for i, w in enumerate(wants) if w > cap), key=lambda i: (-wants[i], i))
    for i in cut[: budget - sum(sizes)]:
        sizes[i] += 1
    return sizes


def difficulty_from_rates(rates: Sequence[float]) -> list[float]:
    """A curriculum's difficulty from measured pass rates: ``1 - rate`` (so the easiest, most often passed, come
    first; equal rates keep trainset order, :class:`PromptSampler`'s tie rule)."""
    return [1.0 - float(r) for r in rates]


def signal_examples(groups: Iterable, n_examples: int) -> list[bool]:
    """Per example index: does any of its groups have rewards that differ (signal for a group-relative update)?"""
    has = [False] * n_examples
    for g in groups:
        rewards = g.rewards
        if len(rewards) > 1 and max(rewards) != min(rewards):
            has[g.example] = True
    return has


class PromptSampler:
    """Seeded, stateful draw of trainset indices (see the module docstring for the rules)."""

    def __init__(self, n: int, *, seed: int = 0, band: tuple[float, float] | None = None, alpha: float = 0.5,
                 replay_after: int = 4, difficulty: Sequence[float] | None = None, curriculum_steps: int = 0,
                 curriculum_start: float = 0.3):
        if n < 1:
            raise ValueError("the trainset is empty: pass at least one example")
        if band is not None and not (0.0 <= band[0] < band[1] <= 1.0):
            raise ValueError(f"band must be (lo, hi) with 0 <= lo < hi <= 1, got {band!r}")
        if difficulty is not None and len(difficulty) != n:
            raise ValueError(f"difficulty has {len(difficulty)} entries for {n} examples: give one per example")
        if not 0.0 < curriculum_start <= 1.0:
            raise ValueError(f"curriculum_start must be in (0, 1], got {curriculum_start}")
        self.n = n
        self.band = tuple(band) if band is not None else None
        self.alpha = alpha
        self.replay_after = replay_after
        self.curriculum_steps = curriculum_steps
        self.curriculum_start = curriculum_start
        self.by_difficulty = easiest_first(difficulty) if difficulty is not None else list(range(n))
        self.rng = random.Random(seed)
        self.rates: dict[int, float] = {}
        self.seen: dict[int, int] = {}
        self.replay: dict[int, int] = {}  # index -> step at which it may come back
        self.queue: list[int] = []  # rest of the current epoch's order
        self.epoch = 0
        self.step = 0

    # ----- drawing ------------------------------------------------------------------------------------------------
    def _open_pool(self) -> list[int]:
        if self.curriculum_steps <= 0:
            return list(range(self.n))
        frac = curriculum_fraction(self.step, steps=self.curriculum_steps, start=self.curriculum_start)
        return self.by_difficulty[: max(1, math.ceil(frac * self.n))]

    def _refill(self) -> None:
        pool = self._open_pool()
        self.rng.shuffle(pool)
        self.queue = pool
        self.epoch += 1

    def draw(self, k: int, *, exclude: Iterable[int] = ()) -> list[int]:
        """``k`` distinct indices for this step (fewer only if the open pool is smaller), never one in ``exclude``."""
        taken = set(exclude)
        out: list[int] = []
        due = sorted(i for i, at in self.replay.items() if at <= self.step and i not in taken)
        for i in due[:k]:  # hard examples whose wait is over come back first
            del self.replay[i]
            out.append(i)
            taken.add(i)
        skipped: list[int] = []
        refills = 0
        while len(out) < k:
            if not self.queue:
                if refills >= 2:  # every open example was tried twice over: the band cannot be met, draw anyway
                    break
                self._refill()
                refills += 1
            i = self.queue.pop()
            if i in taken:
                continue
            rate = self.rates.get(i)
            if self.band is not None and not in_band(rate, *self.band):
                if rate is not None and rate <= self.band[0]:
                    self.replay[i] = self.step + self.replay_after
                skipped.append(i)
                continue
            out.append(i)
            taken.add(i)
        for i in skipped:  # the band left too few: fill with the skipped ones nearest the band, then anything open
            if len(out) >= k:
                break
            if i not in taken:
                self.replay.pop(i, None)
                out.append(i)
                taken.add(i)
        if len(out) < k:
            rest = [i for i in self._open_pool() if i not in taken]
            self.rng.shuffle(rest)
            out.extend(rest[: k - len(out)])
        return out

    def observe(self, index: int, pass_rate: float) -> None:
        """Record the mean reward (in [0, 1] for a 0/1 metric) of this example's rollouts in the current step."""
        self.rates[index] = ema(self.rates.get(index), float(pass_rate), self.alpha)
        self.seen[index] = self.seen.get(index, 0) + 1

    def prime(self, rates: Sequence[float] | Mapping[int, float], *, order: bool) -> None:
        """Measured pass rates (before any step), one per example or ``{index: rate}`` for the examples measured:
        each becomes that example's running pass rate (its first observation; ``seen`` is not counted; the others
        stay unknown), and with ``order`` (every example measured) its curriculum difficulty
        (:func:`difficulty_from_rates`). Both are in :meth:`state_dict`, so a resume does not measure again."""
        if isinstance(rates, Mapping):
            if order:
                raise ValueError("ordering the curriculum by pass rate needs every example's rate")
            if any(not 0 <= i < self.n for i in rates):
                raise ValueError(f"pass rates for examples outside 0..{self.n - 1}")
            self.rates = {int(i): float(r) for i, r in rates.items()}
            return
        if len(rates) != self.n:
            raise ValueError(f"{len(rates)} pass rates for {self.n} examples: give one per example")
        self.rates = {i: float(r) for i, r in enumerate(rates)}
        if order:
            self.by_difficulty = easiest_first(difficulty_from_rates(rates))

    def advance(self) -> None:
        """End of a step: the curriculum and replay clocks move on."""
        self.step += 1

    # ----- reporting and resume -----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        known = list(self.rates.values())
        out: dict[str, Any] = {"seen": len(self.rates), "epoch": self.epoch, "replay": len(self.replay),
                               "open": len(self._open_pool())}
        if known:
            out["mean_pass_rate"] = sum(known) / len(known)
            if self.band is not None:
                out["in_band"] = sum(in_band(r, *self.band) for r in known) / len(known)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rates": {str(k): v for k, v in self.rates.items()}, "seen": {str(k): v for k, v in self.seen.items()},
                "replay": {str(k): v for k, v in self.replay.items()}, "queue": list(self.queue),
                "epoch": self.epoch, "step": self.step, "rng": _rng_state(self.rng), "order": list(self.by_difficulty)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rates = {int(k): float(v) for k, v in state["rates"].items()}
        self.seen = {int(k): int(v) for k, v in state["seen"].items()}
        self.replay = {int(k): int(v) for k, v in state["replay"].items()}
        self.queue = [int(i) for i in state["queue"]]
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.rng.setstate(_rng_from(state["rng"]))
        if "order" in state:  # a checkpoint written before the order was saved keeps the constructor's
            self.by_difficulty = [int(i) for i in state["order"]]


def easiest_first(difficulty: Sequence[float]) -> list[int]:
    """Indices by ``difficulty`` ascending; ties keep trainset order, so a generated curriculum can be given by its
    order alone."""
    return sorted(range(len(difficulty)), key=lambda i: (difficulty[i], i))


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
