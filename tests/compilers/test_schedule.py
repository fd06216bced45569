"""Learning-rate schedules (compilers.schedule): hand-worked tables (the schedule, the partial-step scale), the
optimizer's base rate under a schedule and a cliff cut, and compiles on the tiny real model whose logged rates follow
the schedule and the partial-step scale."""

import math

import pytest
import torch

from compilers import MMGRPO
from compilers.config import MMGRPOConfig
from compilers.schedule import lr_multiplier, partial_step_scale
from compilers.update import AdapterOptimizers
from programs import Voting
from tiny_setup import SIG, TRAIN, length_metric, tiny_config


@pytest.mark.parametrize("schedule, warmup, min_ratio, total, expected", [
    # constant: 1 everywhere after warm-up
    ("constant", 0, 0.0, 4, [1.0, 1.0, 1.0, 1.0]),
    ("constant", 2, 0.0, 4, [0.5, 1.0, 1.0, 1.0]),
    # linear over 5 steps to 0: 1, 3/4, 1/2, 1/4, 0
    ("linear", 0, 0.0, 5, [1.0, 0.75, 0.5, 0.25, 0.0]),
    # linear to a floor of 0.2: 0.2 + 0.8 x (1, 3/4, 1/2, 1/4, 0)
    ("linear", 0, 0.2, 5, [1.0, 0.8, 0.6, 0.4, 0.2]),
    # warm-up 1 step, then linear over the 3 left: 1, 1/2, 0 (floor 0.1: 1, 0.55, 0.1)
    ("linear", 1, 0.1, 4, [1.0, 1.0, 0.55, 0.1]),
    # cosine over 3 steps: (1 + cos 0) / 2, (1 + cos pi/2) / 2, (1 + cos pi) / 2 = 1, 1/2, 0
    ("cosine", 0, 0.0, 3, [1.0, 0.5, 0.0]),
    # warm-up 2 of 5 steps, cosine over 3 to a floor of 0.1: 1/2, 1, then 1, 0.55, 0.1
    ("cosine", 2, 0.1, 5, [0.5, 1.0, 1.0, 0.55, 0.1]),
    # one step after warm-up takes the full rate
    ("linear", 0, 0.0, 1, [1.0]),
])
def test_multiplier_tables(schedule, warmup, min_ratio, total, expected):
    got = [lr_multiplier(s, total, schedule=schedule, warmup=warmup, min_ratio=min_ratio)
           for s in range(1, total + 1)]
    assert got == pytest.approx(expected)


def test_steps_past_the_total_hold_the_floor_and_bad_input_is_refused():
    assert lr_multiplier(9, 5, schedule="cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_multiplier(3, 10, schedule="cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 9)))
    with pytest.raises(ValueError, match="cosine"):
        lr_multiplier(1, 5, schedule="step")
    with pytest.raises(ValueError, match="min_lr_ratio"):
        lr_multiplier(1, 5, schedule="linear", min_ratio=1.5)
    with pytest.raises(ValueError, match="1-based"):
        lr_multiplier(0, 5)


def test_optimizer_keeps_its_base_rate_under_schedule_and_cliff_cut():
    model = torch.nn.Linear(2, 2)
    for p in model.parameters():
        p.requires_grad_(True)
    model.lora_A = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 1)})  # named so adapter_parameters finds it
    opts = AdapterOptimizers(model, ["a"], lr=1e-3)
    opts.apply_schedule(0.5)
    assert opts.lr("a") == pytest.approx(5e-4) and opts.base_lr("a") == pytest.approx(1e-3)
    opts.scale_lr("a", 0.5)  # a cliff rollback cuts the base: the schedule applies on top of the cut
    assert opts.base_lr("a") == pytest.approx(5e-4) and opts.lr("a") == pytest.approx(2.5e-4)
    opts.apply_schedule(1.0)
    assert opts.lr("a") == pytest.approx(5e-4)
    state = opts.optimizers["a"].state_dict()  # a checkpoint carries the base rate
    fresh = AdapterOptimizers(model, ["a"], lr=1e-3)
    fresh.optimizers["a"].load_state_dict(state)
    assert fresh.base_lr("a") == pytest.approx(5e-4)


def test_compile_on_tiny_model_follows_the_schedule(engine, tmp_path):
    compiled = MMGRPO(length_metric, **tiny_config(steps=3, learning_rate=4e-3, lr_schedule="linear",
                                                   min_lr_ratio=0.25, cliff_guard=False)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    steps = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert [r["lr_multiplier"] for r in steps] == pytest.approx([1.0, 0.625, 0.25])
    assert [r["learning_rates"]["shared"] for r in steps] == pytest.approx([4e-3, 2.5e-3, 1e-3])
    assert compiled.manifest.config["lr_schedule"] == "linear"


@pytest.mark.parametrize("kept, quota, expected", [
    (8, 8, 1.0), (2, 8, 0.25), (3, 8, 0.375), (0, 8, 0.0),
    (10, 8, 1.0),  # a round that overshot the quota is a full step, never more
    (1, 1, 1.0),
])
def test_partial_step_scale_table(kept, quota, expected):
    assert partial_step_scale(kept, quota) == pytest.approx(expected)


def test_partial_step_scale_refuses_bad_counts():
    with pytest.raises(ValueError, match="examples_per_step"):
        partial_step_scale(1, 0)
    with pytest.raises(ValueError, match="kept"):
        partial_step_scale(-1, 4)


def test_scale_partial_steps_without_dynamic_sampling_is_refused():
    with pytest.raises(ValueError, match="dynamic_sampling=True"):
        MMGRPOConfig(scale_partial_steps=True)
    assert MMGRPOConfig(scale_partial_steps=True, dynamic_sampling=True).scale_partial_steps


@pytest.mark.parametrize("scale", [True, False])
def test_compile_on_tiny_model_scales_partial_steps(engine, tmp_path, scale):
    """With dynamic sampling, a step's rate is the schedule's times kept / examples_per_step when
    ``scale_partial_steps`` is on, and the schedule's alone when it is off."""
    compiled = MMGRPO(length_metric, **tiny_config(
        steps=3, examples_per_step=4, learning_rate=4e-3, dynamic_sampling=True, max_draw_rounds=1,
        pass_band=(0.0, 1.0), scale_partial_steps=scale, cliff_guard=False)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    steps = [r for r in compiled.manifest.history if r["kind"] == "step"]
    kept = [r["drawing"]["examples_kept"] for r in steps]
    want = [min(k / 4, 1.0) if scale else 1.0 for k in kept]
    assert [r["lr_multiplier"] for r in steps] == pytest.approx(want)
    assert [r["learning_rates"]["shared"] for r in steps] == pytest.approx([4e-3 * w for w in want])
    assert [r["partial_scale"] for r in steps] == ([pytest.approx(w) for w in want] if scale else [None] * 3)
    if scale:
        assert any(k < 4 for k in kept), "the tiny model should leave some step partial: the test needs one"
