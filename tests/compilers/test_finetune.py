"""``compilers.finetune``: DSPy's ``BootstrapFinetune`` trains a LoRA adapter of the local model through
``LocalFinetune``; the fine-tuned predictors run on it. Data rules on the tiny model's tokenizer, the optimizer end to
end on the tiny model."""

from __future__ import annotations

import dspy
import pytest
import torch
from dspy.clients.utils_finetune import TrainDataFormat

from compilers.finetune import LocalFinetune, chat_rows, finetunable, fresh_adapter
from wfc.engines.hf import HFEngine
from wfc.lm import LocalLM
from wfc.models import load_model


@pytest.fixture(scope="module")
def engine():
    engine = HFEngine(load_model("tiny"), batch_wait_s=0.05)
    yield engine
    engine.close()


def _chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "system", "content": "Answer."}, {"role": "user", "content": question},
                         {"role": "assistant", "content": answer}]}


def _base(policy) -> dict[str, torch.Tensor]:
    """The base model's weights, named as before peft wrapped its layers."""
    return {k.replace(".base_layer", ""): v.clone() for k, v in policy.base_model.state_dict().items()
            if "lora_" not in k}


def _lora(policy, name: str) -> dict[str, torch.Tensor]:
    return policy.adapter_state(name)


def test_a_chat_row_is_the_engines_prompt_then_the_answer_and_eos(engine):
    item = _chat("1 + 2?", "3")
    (row,) = chat_rows(engine, [item], "finetune")
    tok = engine.tokenizer
    assert list(row.prompt_ids) == engine.encode_prompt(item["messages"][:-1])
    assert row.completion_ids == tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert (row.adapter, row.advantage, row.engine_logprobs) == ("finetune", 1.0, None)
    with pytest.raises(ValueError, match="chat format"):
        chat_rows(engine, [{"messages": [{"role": "user", "content": "x"}]}], "finetune")


def test_fresh_names_and_bad_settings(engine):
    assert fresh_adapter([]) == "finetune"
    assert fresh_adapter(["finetune", "finetune_2"]) == "finetune_3"
    provider = LocalFinetune(engine, epochs=1, batch=4, learning_rate=1e-3)
    assert provider.settings({"num_train_epochs": 2, "lr": 0.1}) == {"epochs": 2, "batch": 4, "learning_rate": 0.1,
                                                                     "seed": 0}
    with pytest.raises(ValueError, match="known"):
        provider.settings({"warmup_ratio": 0.1})


def test_a_copy_named_after_an_adapter_runs_on_it(engine):
    lm = LocalLM(engine)
    tuned = lm.copy(model=f"{lm.model}@some_adapter", temperature=0.5)
    assert tuned.adapter == "some_adapter" and tuned.wfc_engine is engine and tuned.kwargs["temperature"] == 0.5
    assert tuned.copy(model=lm.model).adapter is None  # the bare model name: the base
    with pytest.raises(ValueError, match="stays on its engine"):
        lm.copy(model="openai/gpt-4o")


def test_bootstrap_finetune_trains_a_new_adapter_of_the_local_model(engine):
    lm = finetunable(LocalLM(engine, max_tokens=8), epochs=2, batch=4, learning_rate=1e-2)
    program = dspy.Predict("question -> answer")
    program.set_lm(lm)
    trainset = [dspy.Example(question=f"{a} + 1?", answer=str(a + 1)).with_inputs("question") for a in range(6)]
    policy = engine.policy
    base = _base(policy)
    with dspy.context(adapter=dspy.ChatAdapter()):
        tuned = dspy.BootstrapFinetune(metric=lambda g, p, t=None: True, num_threads=4).compile(program,
                                                                                               trainset=trainset)
        assert tuned.lm.adapter == "finetune" and tuned.lm.wfc_engine is engine
        out = tuned(question="3 + 1?")  # it runs on the new adapter, every call still parses
    assert isinstance(out.answer, str)
    (job,) = lm.provider.jobs
    assert job["adapter"] == "finetune" and job["rows"] == 6 and job["from"] is None and job["optimizer_steps"] == 4
    assert job["loss_after"]["all"] < job["loss_before"]["all"]
    assert any(t.abs().sum() > 0 for k, t in _lora(policy, "finetune").items() if "lora_B" in k)
    after = _base(policy)
    assert base.keys() == after.keys() and all(torch.equal(base[k], after[k]) for k in base)  # the base model is untouched

    # fine-tuning the tuned LM starts from its adapter and leaves that one as it was
    first = _lora(policy, "finetune")
    name = tuned.lm.provider.finetune(None, tuned.lm.model, [_chat("2 + 1?", "3")] * 4, TrainDataFormat.CHAT,
                                      {"epochs": 1})
    assert name.endswith("@finetune_2") and lm.provider.jobs[-1]["from"] == "finetune"
    assert all(torch.equal(first[k], v) for k, v in _lora(policy, "finetune").items())
    with pytest.raises(ValueError, match="chat data"):
        lm.provider.finetune(None, lm.model, [_chat("a", "b")], TrainDataFormat.COMPLETION)
    with pytest.raises(ValueError, match="no training data"):
        lm.provider.finetune(None, lm.model, [], TrainDataFormat.CHAT)


def test_the_fine_tune_is_the_seeds_whatever_order_the_threads_hand_the_data_in(engine):
    data = [_chat(f"{a} + 2?", str(a + 2)) for a in range(5)]
    lm = LocalLM(engine)
    outside = torch.random.get_rng_state()

    def tune(seed: int, items) -> dict[str, torch.Tensor]:
        provider = LocalFinetune(engine, epochs=1, batch=2, learning_rate=1e-2, seed=seed)
        name = provider.finetune(None, lm.model, items, TrainDataFormat.CHAT).partition("@")[2]
        return _lora(engine.policy, name)

    first, shuffled, other = tune(3, data), tune(3, data[::-1]), tune(4, data)
    assert all(torch.equal(first[k], shuffled[k]) for k in first)  # same seed, data in another order: same weights
    assert not all(torch.equal(first[k], other[k]) for k in first)  # another seed: another init and order
    assert torch.equal(torch.random.get_rng_state(), outside)  # the global generator did not move
