"""compilers.presets.svamp_transfer: training data from generated problems only, the demo's before the harder pool's,
validation disjoint from training; the programs and the curriculum's config."""

from __future__ import annotations

import pytest

from compilers.presets import svamp_transfer
from programs.calculator import Calculate


def test_training_task_is_generated_disjoint_and_ordered_by_difficulty():
    train, val = svamp_transfer.training_task()
    assert {ex.difficulty for ex in train} == {0, 1}
    assert [ex.difficulty for ex in train] == sorted(ex.difficulty for ex in train)  # the demo's problems first
    questions = [ex.question for ex in train]
    assert len(set(questions)) == len(questions)
    assert not {ex.question for ex in val} & set(questions)
    assert all(set(ex.inputs().keys()) == {"question"} for ex in train)  # difficulty is a label, never a prompt input
    assert any(op in ex.question for ex in train for op in ("equally", "doubled", "times"))  # the four-operation half
    assert len(val) == 100


def test_stories_pool_adds_svamp_style_stories_by_difficulty():
    train, val = svamp_transfer.training_task(pool="stories")
    assert {ex.difficulty for ex in train} == {0, 1, 2, 3}
    assert [ex.difficulty for ex in train] == sorted(ex.difficulty for ex in train)
    questions = [ex.question for ex in train]
    assert len(set(questions)) == len(questions) and not {ex.question for ex in val} & set(questions)
    assert all(set(ex.inputs().keys()) == {"question"} for ex in train + val)
    assert any("How many more" in q for q in questions) and any("$" in q for q in questions)
    assert len(val) == 100
    with pytest.raises(ValueError, match="stories"):
        svamp_transfer.training_task(pool="svamp")


def test_the_programs_are_the_demos_and_unknown_ones_are_refused():
    voting = svamp_transfer.program("voting", ("\n",), calculator=True)
    assert {name for name, _ in voting.named_predictors()} == {"voter", "aggregator"}
    assert all(type(p) is Calculate and p.config["stop"] == ("\n",) for _, p in voting.named_predictors())
    assert {name for name, _ in svamp_transfer.program("single").named_predictors()} == {"solver"}
    with pytest.raises(ValueError, match="single"):
        svamp_transfer.program("orchworkers")


def test_the_curriculum_opens_the_easier_half_first():
    assert svamp_transfer.curriculum(steps=10) == {"curriculum_key": "difficulty", "curriculum_steps": 10,
                                                   "curriculum_start": 0.5}
