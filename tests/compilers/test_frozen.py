"""Frozen roles: a role that runs on the base model and is never trained; ``skip_frozen`` leaves its calls out of
training rollouts. On the tiny real model (what trains, what runs where, what the budget counts, the artifact) and
on scripted runs (the rules that say when skipping is exact)."""

import json

import dspy
import pytest
import torch
from pydantic import ValidationError

import wfc
from compilers import MMGRPO, MMGRPOConfig
from compilers.mmgrpo import _check_skippable
from programs import EvalOpt, Voting
from wfc.engines.hf import HFEngine
from wfc.lower import roles, trace
from wfc.models import load_model
from tiny_setup import SIG, TRAIN, length_metric, tiny_config

CODE = dspy.Signature("prompt -> code", "Write the Python function.")


def code_length(example, prediction, trace=None):  # spread across samples, as length_metric
    return (len(str(prediction.code)) % 4) / 3.0


def checked_program():
    from wfc.tasks.visible import example_check

    return EvalOpt(CODE, rounds=1, check=example_check)


def tasks(n=4):
    from wfc.tasks.codegen import make_codegen

    return make_codegen(n, seed=1)


def lora_b(model, adapter):
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_B" in k and f".{adapter}." in k}


def test_a_frozen_fixer_runs_on_the_base_model_in_every_rollout_and_only_the_writer_trains(engine, tmp_path):
    """frozen_roles=['optimizer'] under isolated adapters: one adapter (the writer's) exists and moves; the
    optimizer's calls are in every training rollout (the tiny model's code never passes the example), on the base
    model, and make no rows; the artifact lists the optimizer with no adapter and reloads to answer the same."""
    train = tasks()
    compiled = MMGRPO(code_length, **tiny_config(steps=1, eval_every=0, temperature=1.0, max_tokens=8,
                                                 credit="own_output", frozen_roles=["optimizer"])).compile(
        checked_program(), trainset=train, engine=engine, backend="isolated", run_dir=tmp_path / "run",
        progress=False)
    assert compiled.manifest.roles == {"generator": "generator", "optimizer": None}
    assert [n for n in engine.policy.model.peft_config if n != "default"] == ["generator"]
    assert lora_b(engine.policy.model, "generator") and any(
        v.abs().sum() > 0 for v in lora_b(engine.policy.model, "generator").values())
    (step,) = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert step["roles"]["optimizer"]["calls"] == step["roles"]["generator"]["calls"] > 0
    assert step["roles"]["optimizer"].get("frozen") is True and "frozen" not in step["roles"]["generator"]
    (logged,) = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
                 if r["kind"] == "step"]
    assert set(logged["adapters"]) == {"generator"} and set(logged["adapters"]["generator"]["roles"]) == {"generator"}
    graph = compiled.trace(train[0])
    assert {c.role: c.adapter for c in graph.calls} == {"generator": "generator", "optimizer": None}
    loaded = wfc.load(compiled.save(tmp_path / "art"), model="tiny")
    try:
        assert loaded.roles == {"generator": "generator", "optimizer": None}
        for task in train[:2]:
            assert loaded(prompt=task.prompt).code == compiled(prompt=task.prompt).code
    finally:
        loaded.engine.close()


def test_skip_frozen_leaves_the_fixer_out_of_training_rollouts_and_the_budget_but_not_validation(engine, tmp_path):
    """skip_frozen: training rollouts stop where the frozen fixer would be called (no call, no tokens: the step's
    completion tokens are the writer's alone) and are scored on the writer's code; validation runs the whole
    program, fixer included. With the same seed the writer's rollouts and update are those of the unskipped run."""
    train = tasks()
    cfg = dict(steps=1, eval_every=0, temperature=1.0, max_tokens=8, credit="own_output", frozen_roles=["optimizer"],
               seed=3)

    def run(skip, where, eng):
        compiled = MMGRPO(code_length, **tiny_config(**cfg, skip_frozen=skip)).compile(
            checked_program(), trainset=train, valset=train[:2], engine=eng, backend="isolated",
            run_dir=tmp_path / where, progress=False)
        (step,) = [r for r in compiled.manifest.history if r["kind"] == "step"]
        return compiled, step, lora_b(eng.policy.model, "generator")

    full, full_step, full_weights = run(False, "full", engine)
    other = HFEngine(load_model("tiny"), batch_wait_s=0.02)  # a fresh base for the second compile, seeded alike
    try:
        skipped, step, weights = run(True, "skip", other)
        graph = skipped.trace(train[0])
    finally:
        other.close()
    assert "optimizer" not in step["roles"] and step["roles"]["generator"]["calls"] == 2 * 3  # examples x group
    assert step["drawing"]["completion_tokens"] == step["roles"]["generator"]["tokens"]
    assert step["drawing"]["completion_tokens"] < full_step["drawing"]["completion_tokens"]
    assert step["reward_mean"] == pytest.approx(full_step["roles"]["generator"]["reward_mean"])
    for k in weights:  # the writer's rows are the same: the skipped calls trained nothing in the full run either
        assert torch.allclose(weights[k], full_weights[k], atol=1e-5), k
    assert [c.role for c in graph.calls] == ["generator", "optimizer"] and graph.stopped_at is None


def test_skipping_is_refused_where_it_would_not_be_exact():
    """The rules, on scripted validation runs: a frozen role followed by a trained one, or a frozen role that does
    not give the program's answer, cannot be skipped; a frozen last reviser can."""
    from wfc.engines.fake import ScriptedEngine

    engine = ScriptedEngine(lambda r: "4")
    check = lambda inputs, proposal: (False, "not 5")  # noqa: E731
    evalopt = EvalOpt(SIG, rounds=1, check=check)
    graphs = [trace(evalopt, {"question": "2 + 3?"}, engine)]
    _check_skippable(graphs, ["optimizer"], roles(evalopt))  # the last reviser: fine
    with pytest.raises(ValueError, match=r"trained role\(s\) \['optimizer'\] were called after frozen role "
                                         r"'generator'"):
        _check_skippable(graphs, ["generator"], roles(evalopt))
    judged = EvalOpt(SIG, rounds=1)
    engine = ScriptedEngine(lambda r: "correct" if "Check the proposed" in r.messages[0]["content"] else "4")
    graphs = [trace(judged, {"question": "2 + 3?"}, engine)]
    assert [c.role for c in graphs[0].calls] == ["generator", "evaluator"]
    with pytest.raises(ValueError, match="frozen role 'evaluator' gives \\['verdict'\\], not the program's answer"):
        _check_skippable(graphs, ["evaluator"], roles(judged))


@pytest.mark.parametrize("kw, match", [
    ({"skip_frozen": True}, "frozen_roles is empty"),
    ({"skip_frozen": True, "frozen_roles": ["aggregator"], "credit": "inherit"}, "per-call credit"),
    ({"frozen_roles": ["voter", "voter"]}, "twice"),
    ({"skip_frozen": True, "frozen_roles": ["aggregator"], "credit": "verified", "counterfactual_roles": ["voter"]},
     "counterfactual"),
])
def test_frozen_settings_that_cannot_work_are_refused_by_the_config(kw, match):
    with pytest.raises(ValidationError, match=match):
        MMGRPOConfig(**kw)


@pytest.mark.parametrize("frozen, match", [(["judge"], "does not have"), (["voter", "aggregator"], "every role")])
def test_frozen_roles_must_leave_a_program_role_to_train(engine, tmp_path, frozen, match):
    with pytest.raises(ValueError, match=match):
        MMGRPO(length_metric, **tiny_config(frozen_roles=frozen)).compile(
            Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
