"""HFEngine on the tiny model: determinism, log-prob bookkeeping, and mixed-adapter batches; ScriptedEngine basics."""

from __future__ import annotations

import pytest
import torch

from wfc.engines.base import Engine, GenerationRequest, SamplingParams
from wfc.engines.fake import ScriptedEngine

MESSAGES = ({"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"})
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def request(adapter=None, *, sampling=GREEDY, messages=MESSAGES) -> GenerationRequest:
    return GenerationRequest(messages=messages, adapter=adapter, sampling=sampling)


def test_greedy_generation_is_deterministic(tiny_engine):
    (first,) = tiny_engine.generate([request()])
    (second,) = tiny_engine.generate([request()])
    assert first.completion_ids == second.completion_ids and first.text == second.text
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-5)
    # the same request twice in one batch: both rows equal the lone run
    rows = tiny_engine.generate([request(), request()])
    assert [r.completion_ids for r in rows] == [first.completion_ids] * 2


def test_logprobs_match_a_teacher_forced_forward_pass(tiny_engine):
    (gen,) = tiny_engine.generate([request(sampling=SamplingParams(temperature=0.7, max_tokens=8))])
    assert len(gen.logprobs) == len(gen.completion_ids) >= 1
    assert gen.prompt_ids == tiny_engine.encode_prompt(MESSAGES)
    assert gen.finish_reason == ("length" if len(gen.completion_ids) == 8 else "stop")
    ids = torch.tensor([gen.prompt_ids + gen.completion_ids])  # (1, P + R)
    with torch.inference_mode():
        logits = tiny_engine.policy.base_model(ids).logits[0, len(gen.prompt_ids) - 1: -1]  # (R, V): predicts each token
    expected = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(1, torch.tensor(gen.completion_ids)[:, None])
    assert gen.logprobs == pytest.approx(expected.squeeze(1).tolist(), abs=1e-4)


def test_max_tokens_and_protocol(tiny_engine):
    (gen,) = tiny_engine.generate([request(sampling=SamplingParams(temperature=1.0, max_tokens=3))])
    assert len(gen.completion_ids) <= 3 and len(gen.logprobs) == len(gen.completion_ids)
    assert isinstance(tiny_engine, Engine) and isinstance(ScriptedEngine([]), Engine)


def test_mixed_adapter_batch_matches_each_adapter_alone():
    from peft import LoraConfig

    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"), batch_wait_s=0.2)  # its own model: adapters must not leak to tiny_engine
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for name in ("one", "two"):
                engine.policy.add_adapter(name, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=False))
        assert engine.adapters == ["one", "two"]
        with pytest.raises(ValueError, match="already exists"):
            engine.policy.add_adapter("one", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        wanted = [None, "one", "two", "one"]
        alone = {name: engine.generate([request(name)])[0] for name in (None, "one", "two")}
        calls_before = engine.stats["generate_calls"]
        mixed = engine.generate([request(name) for name in wanted])
        assert engine.stats["generate_calls"] == calls_before + 1  # one generate call for the mixed batch
        for name, row in zip(wanted, mixed):
            assert row.completion_ids == alone[name].completion_ids, f"adapter {name!r} row differs"
            assert row.text == alone[name].text
            assert row.logprobs == pytest.approx(alone[name].logprobs, abs=1e-4)
        # the check means something only if the adapters change the model
        assert alone["one"].logprobs != pytest.approx(alone[None].logprobs, abs=1e-3)
        assert alone["one"].logprobs != pytest.approx(alone["two"].logprobs, abs=1e-3)
        with pytest.raises(ValueError, match="unknown adapter"):
            engine.generate([request("nope")])
    finally:
        engine.close()


def test_scripted_engine_records_and_fails_like_an_engine():
    engine = ScriptedEngine({"2 + 3": "5"})
    (gen,) = engine.generate([request("x")])
    assert gen.text == "5" and len(gen.logprobs) == len(gen.completion_ids) == 1
    assert engine.calls[0].adapter == "x" and engine.generate_calls == 1
    with pytest.raises(LookupError, match="no scripted answer"):
        engine.generate([request(messages=({"role": "user", "content": "other"},))])
    with pytest.raises(LookupError, match="ran out"):
        ScriptedEngine([]).generate([request()])


def test_shared_prefill_gives_the_same_tokens_as_separate_prefill(tiny_handle):
    """Duplicate prompts in a batch are prefilled once; greedy results equal the unshared path row by row."""
    from wfc.engines.base import GenerationRequest, SamplingParams
    from wfc.engines.hf import HFEngine

    prompts = [({"role": "user", "content": f"What is {10 ** i} plus {'many ' * i}apples?"},) for i in range(3)]
    sampling = SamplingParams(temperature=0.0, max_tokens=8)
    requests = [GenerationRequest(messages=prompts[i % 3], sampling=sampling) for i in range(7)]
    shared, separate = HFEngine(tiny_handle, share_prefill=True), HFEngine(tiny_handle, share_prefill=False)
    a = shared._generate_batch(requests, sampling)  # direct call: skips the engine's greedy de-duplication
    b = separate._generate_batch(requests, sampling)
    assert shared.stats["shared_prefill_rows"] == 4 and "shared_prefill_rows" not in separate.stats
    for x, y in zip(a, b):
        assert x.prompt_ids == y.prompt_ids and x.completion_ids == y.completion_ids
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) < 1e-4
