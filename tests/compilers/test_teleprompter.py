"""MMGRPO as a DSPy Teleprompter: one step of ``dspy.BetterTogether`` in either order, on the tiny real model, with
the prompt optimizer's demos kept, trained on and saved; a second weight step never overwrites the first's adapters."""

from __future__ import annotations

import dspy
import torch
from dspy.teleprompt import Teleprompter

import wfc
from compilers import MMGRPO
from compilers.backends import BackendPlan, fresh_names
from tests.compilers.tiny_setup import SIG, TRAIN, length_metric, tiny_config
from wfc.artifact import CompiledProgram
from wfc.lm import LocalLM


def test_fresh_names_rename_only_adapters_the_engine_already_holds():
    plan = BackendPlan("isolated", {"a": "a", "b": "b", "c": "b"})
    assert fresh_names(plan, []) is plan
    got = fresh_names(plan, ["b", "b-2"])
    assert got.role_adapters == {"a": "a", "b": "b-3", "c": "b-3"} and "'b'" in got.reasons[-1]


def _state(compiled: CompiledProgram) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in compiled.policy.adapter_state(compiled.roles["self"]).items()}


def _strategies(best) -> dict[str, dspy.Module]:
    return {c["strategy"]: c["program"] for c in best.candidate_programs}


def test_better_together_runs_mmgrpo_after_a_prompt_optimizer_and_before_one(engine, tmp_path):
    lm = LocalLM(engine, max_tokens=6)
    student = dspy.Predict(SIG)
    student.set_lm(lm)
    assert isinstance(MMGRPO(length_metric), Teleprompter)
    with dspy.context(lm=lm):
        best = dspy.BetterTogether(length_metric, p=dspy.LabeledFewShot(k=2),
                                   w=MMGRPO(length_metric, **tiny_config(steps=1))).compile(
            student, trainset=TRAIN[:8], valset=TRAIN[8:], strategy="p -> w")
    trained = _strategies(best)["p -> w"]
    assert isinstance(trained, CompiledProgram) and len(trained.program.predictors()[0].demos) == 2
    assert trained.program.predictors()[0].lm.adapter == trained.roles["self"] == "shared"  # DSPy sees the adapter
    first = _state(trained)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in first.items())  # trained from B = 0
    assert student.demos == []  # the input program is left alone
    trained.save(tmp_path / "art")
    assert len(wfc.load(tmp_path / "art", engine=engine).program.predictors()[0].demos) == 2  # demos travel

    with dspy.context(lm=lm):
        best = dspy.BetterTogether(length_metric, p=dspy.LabeledFewShot(k=2),
                                   w=MMGRPO(length_metric, **tiny_config(steps=1))).compile(
            student, trainset=TRAIN[:8], valset=TRAIN[8:], strategy="w -> p")
    got = _strategies(best)
    assert got["w"].roles["self"] == "shared-2"  # a second compile on the engine: its own adapter
    assert isinstance(got["w -> p"], CompiledProgram) and len(got["w -> p"].program.predictors()[0].demos) == 2
    assert all(torch.equal(v, trained.policy.adapter_state("shared")[k]) for k, v in first.items())
