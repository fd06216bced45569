"""The policy (wfc.policy): revisions, exact export / restore, devices; and a whole compile on a scripted engine,
which works because the trainer touches only the policy and hands adapters to the engine with ``load_adapters``."""

from __future__ import annotations

import itertools
import json
import threading

import pytest
import torch

from compilers import MMGRPO
from compilers.config import LoraSettings, MMGRPOConfig
from programs import Single
from tiny_setup import SIG, TRAIN, length_metric, tiny_config
from wfc.engines.base import AdapterRevision, GenerationRequest, SamplingParams
from wfc.engines.fake import ScriptedEngine
from wfc.engines.hf import HFEngine
from wfc.policy import Policy, resolve_device

LORA = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])


@pytest.fixture
def policy():
    return Policy("tiny", device="cpu")


def _perturb(policy: Policy, name: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if f"lora_B.{name}." in n:
                p.copy_(torch.randn(p.shape, generator=gen))


def test_revisions_count_every_weight_change(policy, tmp_path):
    from wfc.artifact import write_adapter

    policy.add_adapter("solver", LORA.peft_config())
    assert policy.adapters == ["solver"] and policy.revision("solver") == 1
    assert policy.mark_changed("solver") == 2  # what update() does after an optimizer step
    policy.restore_adapter("solver", policy.adapter_state("solver"))
    assert policy.revision("solver") == 3
    write_adapter(policy.lora_config("solver"), policy.adapter_state("solver"), tmp_path / "solver")
    policy.load_adapter("solver", str(tmp_path / "solver"))
    assert policy.revision("solver") == 4
    policy.add_adapter("critic", LORA.peft_config())
    assert policy.revision("critic") == 1 and policy.revision("solver") == 4  # counters are per adapter
    with pytest.raises(ValueError, match="unknown adapter 'nope'"):
        policy.revision("nope")
    with pytest.raises(ValueError, match="already exists"):
        policy.add_adapter("solver", LORA.peft_config())


def test_export_restore_round_trip_is_exact(policy):
    from peft import get_peft_model_state_dict

    policy.add_adapter("solver", LORA.peft_config())
    _perturb(policy, "solver", 1)
    [rev] = policy.export(["solver"])
    assert rev.name == "solver" and rev.revision == policy.revision("solver") and rev.config.r == 4
    assert set(rev.tensors) == set(get_peft_model_state_dict(policy.model, adapter_name="solver"))
    assert all(t.device.type == "cpu" for t in rev.tensors.values())
    saved = {k: v.clone() for k, v in rev.tensors.items()}
    _perturb(policy, "solver", 2)  # the policy moves on: the exported revision does not (its tensors are clones)
    assert all(torch.equal(rev.tensors[k], saved[k]) for k in saved)
    assert any(not torch.equal(v, saved[k]) for k, v in policy.adapter_state("solver").items())
    policy.restore_adapter("solver", rev.tensors)
    assert all(torch.equal(v, saved[k]) for k, v in policy.adapter_state("solver").items())


def test_devices_resolve_and_bad_ones_say_what_to_pass():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="'auto', 'cpu', 'cuda' or 'cuda:N'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")
    with pytest.raises(ValueError, match="device"):
        MMGRPOConfig(device="gpu")
    with pytest.raises(ValueError, match="dtype"):
        Policy("tiny", dtype="int8")
    with Policy("tiny", device="cpu").autocast():  # a no-op on the CPU
        assert not torch.is_autocast_enabled()


def test_hf_engine_shares_a_policy(policy):
    engine = HFEngine(policy=policy)
    try:
        assert engine.policy is policy and engine.handle is policy.handle and engine.tokenizer is policy.tokenizer
        policy.add_adapter("solver", LORA.peft_config())
        assert engine.adapters == ["solver"]
        engine.load_adapters(policy.export(["solver"]))  # colocated: nothing to do
        assert policy.revision("solver") == 1  # nothing was copied onto the weights it already holds
        with pytest.raises(ValueError, match="carries no LoRA config"):
            engine.load_adapters([AdapterRevision(name="other", revision=1, config=None, tensors={})])
        messages = ({"role": "user", "content": "What is 1 plus 2?"},)
        assert ScriptedEngine(["x"], tokenizer=policy.tokenizer).encode_prompt(messages) == engine.encode_prompt(messages)
    finally:
        engine.close()
    with pytest.raises(ValueError, match="not both"):
        HFEngine("tiny", policy=policy)


def test_hf_engine_with_its_own_bf16_weights_takes_handed_over_revisions(policy):
    """A rollout engine apart from the trainer: its own bf16 base; every changed revision is copied in (cast), an
    unchanged one is not copied again, and generation follows the adapter it was handed."""
    engine = HFEngine("tiny", dtype="bfloat16", device="cpu")
    try:
        assert engine.policy is not policy
        assert {p.dtype for n, p in engine.policy.model.named_parameters()} == {torch.bfloat16}
        messages = ({"role": "user", "content": "What is 1 plus 2?"},)
        greedy = SamplingParams(temperature=0.0, max_tokens=6)
        base_ids = engine.generate([GenerationRequest(messages=messages, sampling=greedy)])[0].completion_ids
        policy.add_adapter("solver", LORA.peft_config())
        _perturb(policy, "solver", 3)
        engine.load_adapters(policy.export(["solver"]))
        held = engine.policy.adapter_state("solver")
        assert {v.dtype for v in held.values()} == {torch.bfloat16}  # computed in the engine's dtype
        assert all(torch.equal(held[k], v.to(held[k].dtype)) for k, v in policy.adapter_state("solver").items())
        copies = engine.policy.revision("solver")
        engine.load_adapters(policy.export(["solver"]))  # the same weights again: nothing to copy
        assert engine.policy.revision("solver") == copies
        tuned = engine.generate([GenerationRequest(messages=messages, adapter="solver", sampling=greedy)])[0]
        assert tuned.completion_ids != base_ids, "a perturbed adapter must change the engine's greedy text"
        _perturb(policy, "solver", 4)
        engine.load_adapters(policy.export(["solver"]))  # a new revision is copied over the old one
        assert engine.policy.revision("solver") == copies + 1
        held = engine.policy.adapter_state("solver")
        assert all(torch.equal(held[k], v.to(held[k].dtype)) for k, v in policy.adapter_state("solver").items())
    finally:
        engine.close()
    with pytest.raises(ValueError, match="holds torch.float32"):
        HFEngine(policy=policy, dtype="bfloat16")


def test_compile_with_a_bf16_rollout_engine_trains_the_fp32_policy(policy, tmp_path):
    """Rollouts on a bf16 engine of their own, training on the fp32 policy: the engine ends holding the policy's
    kept adapter, and the step log measures the bf16 log-probs against the trainer's (importance correction)."""
    engine = HFEngine("tiny", dtype="bfloat16", device="cpu")
    try:
        compiled = MMGRPO(length_metric, **tiny_config()).compile(
            Single(SIG), trainset=TRAIN, valset=TRAIN[:2], engine=engine, policy=policy, run_dir=tmp_path / "run",
            progress=False)
        assert compiled.policy is policy and compiled.engine is engine
        assert {p.dtype for n, p in policy.base_model.named_parameters()} == {torch.float32}
        held = engine.policy.adapter_state("shared")
        assert all(torch.equal(held[k], v.to(held[k].dtype)) for k, v in policy.adapter_state("shared").items())
        steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in steps if r["kind"] == "step"]
        assert steps and all(r["logprob_mismatch"]["tokens"] > 0 for r in steps)
        assert max(r["logprob_mismatch"]["max_abs"] for r in steps) > 1e-4  # bf16 is not the trainer's fp32
    finally:
        engine.close()


def test_compile_on_a_scripted_engine_trains_the_policy(policy, tmp_path):
    """The whole loop with no model in the engine: scripted answers with real token ids of the policy's tokenizer;
    the adapter moves, the base does not, and the engine receives every changed revision, in increasing order."""
    answers = itertools.cycle(["seven", "7", "I think it is seven"])
    lock = threading.Lock()

    def script(request):
        with lock:
            return next(answers)

    def metric(example, prediction, trace=None):
        return float(prediction.answer == "seven")

    engine = ScriptedEngine(script, tokenizer=policy.tokenizer)
    base = {k: v.clone() for k, v in policy.model.state_dict().items()}
    compiled = MMGRPO(metric, **tiny_config()).compile(Single(SIG), trainset=TRAIN, valset=TRAIN[:2], engine=engine,
                                                       policy=policy, run_dir=tmp_path / "run", progress=False)
    assert compiled.policy is policy and compiled.engine is engine
    lora_b = [p for n, p in policy.model.named_parameters() if "lora_B.shared." in n]
    assert lora_b and any(float(p.detach().abs().sum()) > 0 for p in lora_b), "LoRA B starts at 0: training must move it"
    for name, p in policy.base_model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p.detach(), base[name.replace(".base_layer", "")]), f"base weight {name} changed"
    revisions = [rev for handoff in engine.handoffs for name, rev in handoff if name == "shared"]
    assert revisions[0] == 1 and len(revisions) >= 3  # creation, then (at least) one per step
    assert revisions == sorted(set(revisions)), f"revisions must strictly increase: {revisions}"
    assert revisions[-1] == policy.revision("shared")  # the engine holds what the policy holds
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["kind"] == "step"]
    assert len(steps) == 2 and all(r["adapters"]["shared"]["trained_rows"] > 0 for r in steps)
    # the scripted log-probs are placeholders, treated as unknown: importance weight 1, no mismatch
    assert all(r["logprob_mismatch"]["max_abs"] == 0.0 and r["logprob_mismatch"]["weight_mean"] == 1.0 for r in steps)
    [call] = compiled.trace(TRAIN[0]).calls  # real ids: the chat template's prompt, the text's ids plus EOS
    assert call.prompt_ids == engine.encode_prompt(call.messages) and not call.logprobs_known
    assert call.completion_ids == [*policy.tokenizer(call.text, add_special_tokens=False)["input_ids"],
                                   policy.tokenizer.eos_token_id]
    path = compiled.save(tmp_path / "art")  # saved from the policy, not the engine
    assert (path / "adapters" / "shared" / "adapter_model.safetensors").exists()


def test_a_bf16_hf_engine_alone_gets_a_policy_of_its_own_in_the_config_dtype():
    from compilers.mmgrpo import _policy_and_engine

    engine = HFEngine("tiny", dtype="bfloat16", device="cpu")
    try:
        same, policy = _policy_and_engine(engine, None, "tiny", MMGRPOConfig(device="cpu"))
        assert same is engine and policy is not engine.policy and policy.dtype == torch.float32
        assert policy.handle.checksum == engine.handle.checksum  # the same base weights, loaded apart
        fp32 = HFEngine("tiny", device="cpu")
        assert _policy_and_engine(fp32, None, "tiny", MMGRPOConfig(device="cpu"))[1] is fp32.policy  # colocated
        fp32.close()
    finally:
        engine.close()


def _lora_grads_and_layer_calls(policy: Policy) -> tuple[dict[str, torch.Tensor], int]:
    """One backward through adapter "solver" in training mode: its LoRA gradients, and how often layer 0's attention
    ran (a hook on the attention, not the layer: a checkpointed recompute stops once it has what backward needs, before
    the layer's own forward returns)."""
    torch.manual_seed(0)  # lora_A's initial draw: the same adapter in every policy compared
    policy.add_adapter("solver", LORA.peft_config())
    _perturb(policy, "solver", seed=1)  # lora_B starts at 0; make A's gradients non-zero too
    calls = []
    handle = policy.base_model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with policy.training() as model:
        model.set_adapter("solver")
        model(input_ids=ids).logits.float().pow(2).mean().backward()
    handle.remove()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if "lora_" in n and p.grad is not None}
    return grads, len(calls)


@pytest.mark.parametrize("how", ["constructor", "config"])
def test_gradient_checkpointing_recomputes_layers_in_backward_with_the_same_gradients(how):
    """Checkpointing runs each layer again in backward (so its activations were not kept) and changes no gradient;
    compile turns it on for a policy taken from an HF engine that was built without it (code_workflow and the demo
    pass such an engine: before, ``gradient_checkpointing=True`` was silently ignored there)."""
    from compilers.mmgrpo import _policy_and_engine

    plain_grads, plain_calls = _lora_grads_and_layer_calls(Policy("tiny", device="cpu"))
    if how == "constructor":
        policy = Policy("tiny", device="cpu", gradient_checkpointing=True)
    else:
        engine = HFEngine("tiny", device="cpu")
        try:
            cfg = MMGRPOConfig(device="cpu", gradient_checkpointing=True)
            policy = _policy_and_engine(engine, None, "tiny", cfg)[1]
        finally:
            engine.close()
        assert policy is engine.policy
    grads, calls = _lora_grads_and_layer_calls(policy)
    assert (plain_calls, calls) == (1, 2)
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-5, atol=1e-6)
    assert not policy.model.training  # eval mode again after the update: rollouts never checkpoint
