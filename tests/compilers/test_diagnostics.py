"""Step diagnostics: starvation (most drawn examples flat) said plainly, against hand-worked steps."""

import pytest

from compilers.config import MMGRPOConfig
from compilers.diagnostics import remedies_in_force, starvation, starvation_note, starvation_postfix


def test_starvation_is_most_drawn_examples_flat():
    s = starvation(20, 24, pass_rate=0.03, step_pass_rate=0.02, remedies=[])
    assert s == {"flat": 20, "drawn": 24, "flat_fraction": pytest.approx(20 / 24), "starved": True,
                 "pass_rate": 0.03, "step_pass_rate": 0.02, "remedies": []}
    assert not starvation(12, 24, pass_rate=0.5, step_pass_rate=0.5, remedies=[])["starved"]  # half is not most
    assert starvation(13, 24, pass_rate=0.5, step_pass_rate=0.5, remedies=[])["starved"]
    assert starvation(2, 4, pass_rate=None, step_pass_rate=None, remedies=[], above=0.25)["starved"]
    empty = starvation(0, 0, pass_rate=None, step_pass_rate=None, remedies=[])  # nothing drawn: not starved
    assert empty["flat_fraction"] == 0.0 and not empty["starved"]


def test_starvation_on_the_progress_bar_and_in_a_sentence():
    s = starvation(22, 24, pass_rate=0.034, step_pass_rate=0.02, remedies=["dynamic_sampling", "adaptive_rollouts"])
    assert starvation_postfix(s) == {"flat": "22/24", "pass": "0.03", "starved": "dynamic_sampling+adaptive_rollouts"}
    assert starvation_note(7, s) == (
        "step 7 starved of signal: 22 of 24 drawn examples were flat (every rollout scored the same); running pass "
        "rate 0.034; remedies in force: dynamic_sampling, adaptive_rollouts")
    bare = starvation(4, 4, pass_rate=None, step_pass_rate=0.0, remedies=[])
    assert starvation_postfix(bare) == {"flat": "4/4", "pass": "-", "starved": "no remedy"}
    assert "running pass rate unknown" in starvation_note(1, bare) and "none (try adaptive_rollouts" in \
        starvation_note(1, bare)
    fine = starvation(1, 4, pass_rate=0.4, step_pass_rate=0.4, remedies=[])
    assert starvation_postfix(fine) == {"flat": "1/4", "pass": "0.40"}  # no starved field on a step with signal


def test_remedies_in_force_by_field_name():
    assert remedies_in_force(MMGRPOConfig()) == []  # the defaults switch none on
    cfg = MMGRPOConfig(dynamic_sampling=True, pass_band=(0.0, 1.0), curriculum_steps=5, pass_rate_probe=4,
                       adaptive_rollouts=True, warm_start_runs=4, strategy="p -> w", retrieved_demos=2)
    assert remedies_in_force(cfg) == ["dynamic_sampling", "pass_band", "curriculum_steps", "pass_rate_probe",
                                      "adaptive_rollouts", "warm_start_runs", "strategy=p -> w", "retrieved_demos"]


def test_adaptive_rollouts_config_is_checked():
    with pytest.raises(ValueError, match="max_group_size"):
        MMGRPOConfig(adaptive_rollouts=True, group_size=8, max_group_size=4)
    with pytest.raises(ValueError, match="adaptive_budget >= 0.25"):
        MMGRPOConfig(adaptive_rollouts=True, group_size=8, adaptive_budget=0.2)
    MMGRPOConfig(adaptive_rollouts=False, group_size=8, max_group_size=4)  # off: not checked
