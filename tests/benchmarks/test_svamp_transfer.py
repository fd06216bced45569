"""examples/svamp_transfer.py's training data: generated problems only, easy before hard, validation disjoint."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("svamp_transfer", ROOT / "examples" / "svamp_transfer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_task_is_generated_disjoint_and_ordered_by_difficulty():
    train, val = load().training_task()
    assert {ex.difficulty for ex in train} == {0, 1}
    assert [ex.difficulty for ex in train] == sorted(ex.difficulty for ex in train)  # the demo's problems first
    questions = [ex.question for ex in train]
    assert len(set(questions)) == len(questions)
    assert not {ex.question for ex in val} & set(questions)
    assert all(set(ex.inputs().keys()) == {"question"} for ex in train)  # difficulty is a label, never a prompt input
    assert any(op in ex.question for ex in train for op in ("equally", "doubled", "times"))  # the four-operation half
    assert len(val) == 100
