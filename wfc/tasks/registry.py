"""Named tasks: :data:`TASKS` (name -> builder) and :func:`get_task`, which returns a :class:`Task`.

A task bundles what ``compile(student, trainset=..., valset=...)`` and an evaluation need: the splits, the metric,
and a DSPy signature whose fields the metric reads. Nothing is loaded at import; ``get_task`` builds only the task
asked for.

Built-ins (keyword arguments of each builder in brackets):

- ``arithmetic`` (default): generated word problems [n_train, n_val, n_test, seed, steps, max_operand, ops].
- ``wordproblems``: generated SVAMP-style one- and two-step word problems (38 template kinds, distractors, a
  ``difficulty`` label) to train on for SVAMP transfer [n_train, n_val, n_test, seed, max_operand].
- ``gsm8k``: GSM8K; the validation split is a seeded sample of the train file, disjoint from the rest of train
  [n_train, n_val, n_test, seed, path].
- ``svamp``: SVAMP, **evaluation only**: ``testset`` holds all problems, ``valset`` is None, ``trainset`` raises
  [n_test, path].
- ``humaneval``: HumanEval, evaluation only like SVAMP (164 problems; train code on ``codegen``) [n_test, path].
- ``codegen``: generated function-writing tasks [n_train, n_val, n_test, seed].

Invariants: generated splits hold no question/prompt twice, across splits included; the same arguments give the same
splits; ``Task.trainset`` of an evaluation-only task raises ``ValueError`` rather than returning something to train on.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import dspy

from wfc.tasks.arithmetic import make_arithmetic
from wfc.tasks.code import code_metric
from wfc.tasks.codegen import make_codegen
from wfc.tasks.humaneval import load_humaneval
from wfc.tasks.math import math_metric
from wfc.tasks.math_data import load_gsm8k, load_svamp
from wfc.tasks.signatures import SolveMath, WriteCode
from wfc.tasks.wordproblems import make_wordproblems

DEFAULT_TASK = "arithmetic"


class UnknownTaskError(ValueError, KeyError):
    """A task name that is not in :data:`TASKS`. A ``ValueError`` (a user mistake), and a ``KeyError`` for callers
    that treat the registry as a mapping."""

    __str__ = ValueError.__str__  # KeyError would wrap the message in quotes


@dataclass(frozen=True)
class Task:
    """A named task. ``train_examples is None`` marks an evaluation-only task (see :attr:`trainset`)."""

    name: str
    signature: type[dspy.Signature] = field(repr=False)
    metric: Callable[..., float] = field(repr=False)
    valset: list[dspy.Example] | None = field(repr=False)
    testset: list[dspy.Example] | None = field(repr=False)
    train_examples: list[dspy.Example] | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes().items())
        return f"Task(name={self.name!r}, signature={self.signature.__name__}, {sizes})"

    @property
    def eval_only(self) -> bool:
        return self.train_examples is None

    @property
    def trainset(self) -> list[dspy.Example]:
        """The training examples; ``ValueError`` for an evaluation-only task (never silently empty)."""
        if self.train_examples is None:
            raise ValueError(
                f"task {self.name!r} is for evaluation only and has no trainset: train on another task (e.g. "
                f"'gsm8k' or 'arithmetic' for math, 'codegen' for code) and evaluate on this one's testset"
            )
        return self.train_examples

    def sizes(self) -> dict[str, int | None]:
        """Number of examples per split (None: no such split)."""
        sets = {"train": self.train_examples, "val": self.valset, "test": self.testset}
        return {k: None if v is None else len(v) for k, v in sets.items()}


def _check_size(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int{' or None' if allow_none else ''}, got {value!r}")


def unique_splits(examples: Iterable[dspy.Example], sizes: list[int], *, key: str) -> list[list[dspy.Example]]:
    """Fill splits of ``sizes`` in order from ``examples``, skipping any whose ``key`` field was already used.

    ``ValueError`` when the stream runs out first (the generator's space is too small for the sizes asked).
    """
    splits: list[list[dspy.Example]] = [[] for _ in sizes]
    seen: set[str] = set()
    current = 0
    for example in examples:
        while current < len(sizes) and len(splits[current]) >= sizes[current]:
            current += 1
        if current == len(sizes):
            break
        if example[key] in seen:
            continue
        seen.add(example[key])
        splits[current].append(example)
    if any(len(s) < n for s, n in zip(splits, sizes)):
        raise ValueError(
            f"only {len(seen)} distinct examples for splits of sizes {sizes}: ask for fewer, or widen the "
            f"generator (more steps, a larger max_operand, more ops)"
        )
    return splits


def arithmetic(*, n_train: int = 200, n_val: int = 50, n_test: int = 200, seed: int = 0, steps: int = 1,
               max_operand: int = 20, ops: str = "+-") -> Task:
    """Generated arithmetic word problems (:mod:`wfc.tasks.arithmetic`); the quick default task."""
    sizes = [n_train, n_val, n_test]
    for name, value in zip(("n_train", "n_val", "n_test"), sizes):
        _check_size(name, value, allow_none=False)
    pool = make_arithmetic(4 * sum(sizes) + 10, seed=seed, steps=steps, max_operand=max_operand, ops=ops)
    train, val, test = unique_splits(pool, sizes, key="question")
    return Task("arithmetic", SolveMath, math_metric, valset=val, testset=test, train_examples=train)


def wordproblems(*, n_train: int = 400, n_val: int = 100, n_test: int = 200, seed: int = 0,
                 max_operand: int = 50) -> Task:
    """Generated SVAMP-style word problems (:mod:`wfc.tasks.wordproblems`), for training that transfers to SVAMP."""
    sizes = [n_train, n_val, n_test]
    for name, value in zip(("n_train", "n_val", "n_test"), sizes):
        _check_size(name, value, allow_none=False)
    pool = make_wordproblems(sum(sizes), seed=seed, max_operand=max_operand)  # already distinct questions
    train, val, test = unique_splits(pool, sizes, key="question")
    return Task("wordproblems", SolveMath, math_metric, valset=val, testset=test, train_examples=train)


def gsm8k(*, n_train: int | None = None, n_val: int = 200, n_test: int | None = None, seed: int = 0,
          path=None) -> Task:
    """GSM8K: ``n_val`` problems sampled (seeded) from the train file for validation, the rest for training."""
    _check_size("n_train", n_train, allow_none=True)
    _check_size("n_val", n_val, allow_none=False)
    _check_size("n_test", n_test, allow_none=True)
    pool = load_gsm8k("train", path=path)
    if n_val >= len(pool):
        raise ValueError(f"n_val={n_val} leaves nothing to train on: GSM8K train has {len(pool)} problems")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    val = [pool[i] for i in order[:n_val]]
    train = [pool[i] for i in sorted(order[n_val:])]  # file order, minus the validation problems
    train = train if n_train is None else train[:n_train]
    test = load_gsm8k("test", path=path, limit=n_test)
    return Task("gsm8k", SolveMath, math_metric, valset=val, testset=test, train_examples=train)


def svamp(*, n_test: int | None = None, path=None) -> Task:
    """SVAMP, evaluation only: all problems in ``testset``; ``trainset`` raises."""
    _check_size("n_test", n_test, allow_none=True)
    return Task("svamp", SolveMath, math_metric, valset=None, testset=load_svamp(path=path, limit=n_test))


def humaneval(*, n_test: int | None = None, path=None) -> Task:
    """HumanEval, evaluation only: all problems in ``testset``; ``trainset`` raises (train on ``codegen``)."""
    _check_size("n_test", n_test, allow_none=True)
    return Task("humaneval", WriteCode, code_metric, valset=None, testset=load_humaneval(path=path, limit=n_test))


def codegen(*, n_train: int = 200, n_val: int = 50, n_test: int = 100, seed: int = 0) -> Task:
    """Generated function-writing tasks (:mod:`wfc.tasks.codegen`) scored by running their tests."""
    sizes = [n_train, n_val, n_test]
    for name, value in zip(("n_train", "n_val", "n_test"), sizes):
        _check_size(name, value, allow_none=False)
    train, val, test = unique_splits(make_codegen(4 * sum(sizes) + 10, seed=seed), sizes, key="prompt")
    return Task("codegen", WriteCode, code_metric, valset=val, testset=test, train_examples=train)


TASKS: Mapping[str, Callable[..., Task]] = MappingProxyType({
    "arithmetic": arithmetic,
    "wordproblems": wordproblems,
    "gsm8k": gsm8k,
    "svamp": svamp,
    "humaneval": humaneval,
    "codegen": codegen,
})


def get_task(name: str = DEFAULT_TASK, **kwargs) -> Task:
    """Build the task called ``name`` with the builder's keyword arguments (see the module docstring)."""
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    builder = TASKS[name]
    accepted = list(inspect.signature(builder).parameters)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"task {name!r} takes keyword arguments {accepted}; got unknown {unknown}")
    return builder(**kwargs)
