"""Promises on the embedded default model (SmolLM2-135M, CPU): slow tier, run by CI.

- the model converts/loads from the PyPI package with no network;
- a Voting rollout on it is batched (voters in one generate) and lowered with exact token ids;
- a one-step compile really updates the adapter, and save -> load gives the same greedy answers.
"""

import logging

import pytest
import torch

import wfc
from compilers import MMGRPO
from programs import Voting
from wfc.engines.hf import HFEngine
from wfc.lower import trace
from wfc.tasks import get_task
from wfc.tasks.signatures import SolveMath

pytestmark = pytest.mark.slow
logging.getLogger("dspy").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def engine():
    eng = HFEngine("smollm2-135m")
    yield eng
    eng.close()


def test_voting_rollout_on_embedded_model(engine):
    task = get_task("arithmetic", n_train=8, n_val=4, n_test=4)
    before = engine.stats["generate_calls"]
    graph = trace(Voting(SolveMath, n=3), task.valset[0], engine)
    assert graph.status == "ok" and graph.fan_out("voter") == 3
    assert engine.stats["generate_calls"] - before == 2  # one batched call for the voters, one for the aggregator
    for call in graph.calls:
        assert call.prompt_ids == engine.encode_prompt(call.messages)
        assert len(call.logprobs) == len(call.completion_ids) > 0


def test_one_step_compile_updates_adapter_and_round_trips(engine, tmp_path):
    task = get_task("arithmetic", n_train=16, n_val=4, n_test=4)

    def dense(example, prediction, trace=None):  # graded so every group carries signal in one step
        return 1.0 / (1.0 + len(str(prediction.answer)))

    compiled = MMGRPO(dense, steps=1, examples_per_step=1, group_size=4, max_tokens=12, eval_every=0, keep="last",
                      lora={"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}).compile(
        Voting(SolveMath, n=2), trainset=task.trainset, engine=engine, run_dir=tmp_path / "run", progress=False)
    lora_b = [p for n, p in engine.policy.model.named_parameters() if "lora_B" in n and ".shared." in n]
    assert lora_b and any(bool(p.abs().sum() > 0) for p in lora_b)
    path = compiled.save(tmp_path / "art")
    questions = [ex.question for ex in task.testset[:2]]
    expected = [compiled(question=q).answer for q in questions]
    loaded = wfc.load(path)
    try:
        assert [loaded(question=q).answer for q in questions] == expected
    finally:
        loaded.engine.close()
    assert torch.is_tensor(lora_b[0])
