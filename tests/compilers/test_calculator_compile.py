"""A Voting program whose roles use the calculator (programs/calculator.py), compiled on the tiny real model: the
LoRA trains on what the model wrote, the artifact rebuilds its ``Calculate`` predictors by name, and the loaded
program answers as the compiled one did."""

import json

import torch

import wfc
from compilers import MMGRPO
from programs import Voting
from programs.calculator import Calculate, calculated, with_calculator
from tiny_setup import SIG, TRAIN, length_metric, tiny_config


def test_a_calculator_program_compiles_saves_and_loads_on_the_tiny_model(engine, tmp_path):
    metric = with_calculator(length_metric)
    compiled = MMGRPO(metric, **tiny_config(steps=1)).compile(
        Voting(SIG, n=2, predictor=Calculate), trainset=TRAIN, valset=TRAIN[:2], engine=engine,
        run_dir=tmp_path / "run", progress=False)
    trained = [v for k, v in engine.policy.model.named_parameters() if "lora_B" in k]
    assert trained and any(v.abs().sum() > 0 for v in trained), "LoRA B starts at 0: training must move it"
    steps = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert len(steps) == 1 and "voter" in steps[0]["roles"]

    path = compiled.save(tmp_path / "art")
    structure = json.loads((path / "program" / "structure.json").read_text())
    assert "programs.calculator:Calculate" in json.dumps(structure)  # referenced by name, no copied source
    questions = [ex.question for ex in TRAIN[:4]]
    expected = [compiled(question=q).answer for q in questions]
    loaded = wfc.load(path, model="tiny")
    try:
        assert all(type(p) is Calculate for _, p in loaded.program.named_predictors())
        got = [loaded(question=q).answer for q in questions]
        assert got == expected
        assert all(calculated(a) == a for a in got)  # a program answer has had its arithmetic done
        a = loaded.engine.policy.model.state_dict()
        b = engine.policy.model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a if "lora_" in k and ".shared." in k)
    finally:
        loaded.engine.close()
