"""The suite's tasks (issue 46): program shapes and tasks that compile() was not tuned on, each with the program a
DSPy user would write for it, its data in disjoint train/validation/test splits, and its metric.

- ``arithmetic``: the demo (``compilers.presets.arithmetic``): Voting (three ``Predict`` voters, an aggregator) on
  one-step word problems.
- ``multistep``: a drafter then a checker shown the draft (two ``Predict`` roles with ``answer: int``) on two-step
  word problems (``wfc.tasks.arithmetic``, ``steps=2``).
- ``classify``: ``Predict`` with a ``Literal`` output: the topic of a templated sentence (``wfc.tasks.labels``).
- ``extract``: ``Predict`` with a pydantic output (name, age, city) from one sentence (``wfc.tasks.extraction``).
- ``multihop``: ``programs.agents.MultiHop`` (a ``ChainOfThought`` query writer called twice over a keyword search,
  then an answerer) on two-hop questions over a generated local corpus (``wfc.tasks.multihop``).
- ``agent``: ``dspy.ReAct`` with calculator tools (``programs.agents.calculator_agent``) on ``multistep``'s problems.
- ``code``: ``Predict(WriteCode)`` (``wfc.tasks.signatures``) on the generated function-writing tasks of the code
  workflow (``compilers.presets.codegen.code_task``), scored by running their tests in the sandbox.

Not in :data:`ALL` (run them by name):

- ``code-evalopt``: the code workflow's default program (``programs.EvalOpt``: writer, reviewer, fixer) on ``code``'s
  tasks: three calls reading or writing code per run instead of one.
- ``gsm8k``: ``ChainOfThought("question -> answer: float")`` on GSM8K from ``WFC_DATA_DIR`` only (never
  downloaded); its ``splits()`` raises :class:`DataMissing` when the data is absent.

Invariants: a task's splits come from a fixed data seed (the compile's seed varies, the data does not), so every run
of a task sees the same problems; no example's inputs are in two splits (:class:`Splits` refuses it); program
builders return a fresh program each call.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import dspy
from pydantic import BaseModel

from compilers.presets import arithmetic, codegen
from programs.agents import KeywordSearch, MultiHop, calculator_agent
from wfc.tasks import WriteCode, code_metric, get_task
from wfc.tasks.extraction import make_people, person_metric
from wfc.tasks.labels import make_topics, topic_metric
from wfc.tasks.math import math_metric
from wfc.tasks.math_data import DATA_ENV, load_gsm8k
from wfc.tasks.multihop import exact_match, make_multihop
from wfc.tasks.registry import unique_splits

SIZES = (300, 50, 200)  # train, validation, test of the generated tasks (the demo and code keep their own)
DATA_SEED = 2  # the generators' seed for the new tasks (the demo's is 1)


class DataMissing(FileNotFoundError):
    """A task's data set is not on this machine (the row is skipped, with this message)."""


@dataclass(frozen=True)
class Splits:
    """Train, validation and test examples; ``ValueError`` when one example's inputs are in two splits."""

    train: list
    val: list
    test: list

    def __post_init__(self):
        seen: dict[tuple, str] = {}
        for name, split in (("train", self.train), ("val", self.val), ("test", self.test)):
            for ex in split:
                key = tuple(sorted(ex.inputs().items()))
                if seen.setdefault(key, name) != name:
                    raise ValueError(f"an example is in both {seen[key]} and {name}: {dict(key)!r}")

    def head(self, limit: int | None) -> "Splits":
        """The first ``limit`` examples of each split (all of them for None)."""
        return self if limit is None else Splits(self.train[:limit], self.val[:limit], self.test[:limit])

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


@dataclass(frozen=True)
class SuiteTask:
    """One row of the suite: ``splits()`` -> :class:`Splits`, ``program()`` -> a fresh student, ``metric``."""

    name: str
    shape: str  # the program, in a few words
    data: str  # where the examples come from
    splits: Callable[[], Splits]
    program: Callable[[], dspy.Module]
    metric: Callable


# ---------------------------------------------------------------------------------------------------- programs


class DraftThenCheck(dspy.Module):
    """A drafter answers; a checker sees the question and the draft and gives the final answer."""

    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("question -> answer: int")
        self.check = dspy.Predict(dspy.Signature("question, draft: int -> answer: int",
                                                 "Check the draft answer to the word problem; give the right one."))

    def forward(self, question: str):
        draft = self.draft(question=question).answer
        return self.check(question=question, draft=draft)


class Topic(dspy.Signature):
    """Classify the sentence by its topic."""

    sentence: str = dspy.InputField()
    topic: Literal["sports", "food", "weather", "music"] = dspy.OutputField()


class Person(BaseModel):
    name: str
    age: int
    city: str


class ExtractPerson(dspy.Signature):
    """Extract the person the text is about."""

    text: str = dspy.InputField()
    person: Person = dspy.OutputField()


# ---------------------------------------------------------------------------------------------------- data


def _generated(make: Callable[[int], list], key: str) -> Splits:
    pool = make(4 * sum(SIZES))
    return Splits(*unique_splits(pool, list(SIZES), key=key))


def _task_splits(name: str, **kwargs) -> Splits:
    task = get_task(name, **kwargs)
    return Splits(task.trainset, task.valset, task.testset)


def _two_step() -> Splits:
    return _task_splits("arithmetic", n_train=SIZES[0], n_val=SIZES[1], n_test=SIZES[2], seed=DATA_SEED, steps=2,
                        max_operand=20)


@functools.lru_cache(maxsize=1)
def _multihop_data() -> tuple[list[str], Splits]:
    corpus, examples = make_multihop(sum(SIZES), seed=DATA_SEED)  # one unique person per question
    n_train, n_val, _ = SIZES
    return corpus, Splits(examples[:n_train], examples[n_train:n_train + n_val], examples[n_train + n_val:])


def _gsm8k() -> Splits:
    folder = os.environ.get(DATA_ENV)
    if not folder or not (Path(folder) / "gsm8k").is_dir():
        raise DataMissing(f"GSM8K is read from ${DATA_ENV}/gsm8k/ only and {DATA_ENV}={folder!r} has none: point "
                          f"{DATA_ENV} at a folder holding gsm8k/train.jsonl and gsm8k/test.jsonl")
    train = load_gsm8k("train", path=folder)
    return Splits(train[:SIZES[0]], train[-SIZES[1]:], load_gsm8k("test", path=folder, limit=SIZES[2]))


def _code() -> Splits:
    task = codegen.code_task()
    return Splits(task.trainset, task.valset, task.testset)


# ---------------------------------------------------------------------------------------------------- registry


def _task(name, shape, data, splits, program, metric) -> tuple[str, SuiteTask]:
    return name, SuiteTask(name, shape, data, splits, program, metric)


TASKS: dict[str, SuiteTask] = dict([
    _task("arithmetic", "Voting (3 Predict voters + aggregator)", "generated one-step problems (the demo)",
          lambda: _task_splits("arithmetic", n_train=400, n_val=100, n_test=300, seed=1, steps=1, max_operand=20),
          arithmetic.program, math_metric),
    _task("multistep", "drafter -> checker (2 Predict, answer: int)", "generated two-step problems", _two_step,
          DraftThenCheck, math_metric),
    _task("classify", "Predict, Literal output (4 topics)", "generated topic sentences",
          lambda: _generated(lambda n: make_topics(n, seed=DATA_SEED), "sentence"),
          lambda: dspy.Predict(Topic), topic_metric),
    _task("extract", "Predict, pydantic output (name, age, city)", "generated person sentences",
          lambda: _generated(lambda n: make_people(n, seed=DATA_SEED), "text"),
          lambda: dspy.Predict(ExtractPerson), person_metric),
    _task("multihop", "MultiHop (ChainOfThought query x2 + Predict answer)", "generated 2-hop questions, local corpus",
          lambda: _multihop_data()[1], lambda: MultiHop(KeywordSearch(_multihop_data()[0]), answer="answer"),
          exact_match),
    _task("agent", "ReAct, calculator tools", "generated two-step problems", _two_step, calculator_agent,
          math_metric),
    _task("code", "Predict (prompt -> code)", "generated function-writing tasks", _code,
          lambda: dspy.Predict(WriteCode), code_metric),
    _task("code-evalopt", "EvalOpt (writer -> reviewer -> fixer)", "generated function-writing tasks", _code,
          lambda: codegen.CodeWorkflow().build(WriteCode), code_metric),
    _task("gsm8k", "ChainOfThought (answer: float)", f"GSM8K from ${DATA_ENV}", _gsm8k,
          lambda: dspy.ChainOfThought("question -> answer: float"), math_metric),
])
ALL = ("arithmetic", "multistep", "classify", "extract", "multihop", "agent", "code")  # the seven shapes


def task_names(spec: str) -> list[str]:
    """``"all"`` -> :data:`ALL`; else the comma-separated names, in order. ``ValueError`` for an unknown name."""
    names = list(ALL) if spec.strip() == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ValueError(f"unknown suite task(s) {unknown or spec!r}: use 'all' or names from {sorted(TASKS)}")
    return names
