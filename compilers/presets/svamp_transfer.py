"""The SVAMP transfer preset: the demo's program (``compilers.presets.arithmetic``) trained on generated problems only,
the demo's easy ones first and a harder pool after them, to be measured on SVAMP (evaluation only: never trained or
validated on).

The training pool is the demo's problems (difficulty 0) followed by ``arithmetic`` (one step of + - x /, operands up
to 100, difficulty 1) or ``stories`` (600 generated SVAMP-style stories: changes, comparisons, groups, prices,
distractors, two steps; difficulty 1-3). :func:`curriculum` opens the easy half first and the whole pool by a given
step. Validation is 100 of the harder problems. The pools are generated from their own fixed seed, so every run sees
the same problems; a run's seed varies training only.
"""

from __future__ import annotations

from typing import Any, Callable

import dspy

from compilers.presets import arithmetic
from wfc.tasks import get_task

Pool = tuple[list[dspy.Example], list[dspy.Example], list[int]]  # (trainset, valset, difficulty per train example)


def _arithmetic_pool(seed: int) -> Pool:
    """One step of + - x /, operands up to 100, all at difficulty 1."""
    hard = get_task("arithmetic", n_train=400, n_val=100, n_test=1, seed=seed, steps=1, max_operand=100, ops="+-*/")
    return hard.trainset, hard.valset, [1] * len(hard.trainset)


def _stories_pool(seed: int) -> Pool:
    """SVAMP-like wording (``wfc.tasks.wordproblems``); its own difficulty 0-2 shifted past the demo's problems."""
    hard = get_task("wordproblems", n_train=600, n_val=100, n_test=1, seed=seed)
    return hard.trainset, hard.valset, [1 + ex.difficulty for ex in hard.trainset]


# pool name -> the harder half of the training pool
TRAINING_POOLS: dict[str, Callable[[int], Pool]] = {"arithmetic": _arithmetic_pool, "stories": _stories_pool}
PROGRAMS = {"voting": arithmetic.program, "single": arithmetic.single_program}


def training_task(seed: int = 2, pool: str = "arithmetic") -> tuple[list[dspy.Example], list[dspy.Example]]:
    """(trainset, valset): the demo's training problems at difficulty 0, then the ``pool``'s harder ones easiest
    first (generation order within a level), none repeating a question seen before; validation is the pool's, less
    any question in the trainset. Every example takes ``question`` as its only input (``difficulty`` is a label the
    curriculum reads, never a prompt input). ``ValueError`` for an unknown pool."""
    if pool not in TRAINING_POOLS:
        raise ValueError(f"training pool {pool!r} is unknown: use one of {sorted(TRAINING_POOLS)}")
    easy = arithmetic.demo_task().trainset
    hard_train, hard_val, levels = TRAINING_POOLS[pool](seed)
    seen = {ex.question for ex in easy}
    train = [ex.copy(difficulty=0) for ex in easy]
    ordered = sorted(zip(levels, range(len(hard_train))))  # easiest first, generation order within a level
    train += [hard_train[i].copy(difficulty=d) for d, i in ordered if hard_train[i].question not in seen]
    val = [ex for ex in hard_val if ex.question not in seen]
    return [ex.with_inputs("question") for ex in train], val


def program(kind: str, stop: tuple[str, ...] = (), *, calculator: bool = False) -> dspy.Module:
    """The program trained: ``voting`` (the demo's Voting, n=3) or ``single`` (one role on the demo's signature: the
    single-role rival; compare the two at equal rollout tokens with ``max_rollout_tokens``). ``ValueError`` for any
    other kind."""
    if kind not in PROGRAMS:
        raise ValueError(f"program {kind!r} is unknown: use one of {sorted(PROGRAMS)}")
    return PROGRAMS[kind](stop, calculator=calculator)


def curriculum(*, steps: int) -> dict[str, Any]:
    """The config fields of the easy-first curriculum: the easier half of the pool (by ``difficulty``) open at
    step 1, the whole pool by step ``steps``."""
    return {"curriculum_key": "difficulty", "curriculum_steps": steps, "curriculum_start": 0.5}
