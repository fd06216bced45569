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


def _adapter_engine():
    """An engine on its own tiny model (adapters must not leak to tiny_engine) with two non-zero adapters."""
    from peft import LoraConfig

    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name in ("one", "two"):
            engine.policy.add_adapter(name, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"],
                                                       init_lora_weights=False))
    return engine


def _unshared(engine, requests, sampling):
    engine.share_prefill = False
    try:
        return engine._generate_batch(requests, sampling)
    finally:
        engine.share_prefill = True


@pytest.mark.parametrize("wanted", [[None] * 6, ["one"] * 6, [None, "one", "two", "one", None, "two"]])
def test_common_prefix_prefill_matches_separate_prefill(wanted):
    """Rows sharing a long system prompt (and some whole prompts): the shared prefix is prefilled once per adapter,
    the rest row by row, and every row's tokens and log-probs equal the unshared path's, for one adapter, none, or
    a mix (each adapter's prefix cache is its own)."""
    system = {"role": "system", "content": "You are a careful solver of arithmetic word problems. " * 3}
    questions = ["What is 2 + 3?", "Tom has 12 apples and buys 7 more apples. How many now?", "What is 2 + 3?",
                 "Add 40 and 2.", "Tom has 12 apples and buys 7 more apples. How many now?", "Seven minus one?"]
    requests = [GenerationRequest(messages=(system, {"role": "user", "content": q}), adapter=a, sampling=GREEDY)
                for q, a in zip(questions, wanted)]
    shared = _adapter_engine()
    ids, mask, prefix = shared._layout([shared.encode_prompt(r.messages) for r in requests])
    assert prefix >= 20  # the system prompt and chat template are shared by every row
    for row, r in enumerate(requests):  # each row is exactly its own prompt
        assert ids[row][mask[row].bool()].tolist() == shared.encode_prompt(r.messages)
    a = shared._generate_batch(requests, GREEDY)
    assert shared.stats["shared_prefix_tokens"] > 0
    b = _unshared(shared, requests, GREEDY)
    for x, y in zip(a, b):
        assert x.prompt_ids == y.prompt_ids and x.completion_ids == y.completion_ids
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) < 1e-4
    if len(set(wanted)) > 1:  # the adapters really differ, so sharing one prefix cache across them would show
        alone = {w: shared._generate_batch([requests[0].model_copy(update={"adapter": w})], GREEDY)[0]
                 for w in (None, "one", "two")}
        assert len({tuple(round(v, 3) for v in g.logprobs) for g in alone.values()}) == 3


def test_sampled_rows_with_a_shared_prefix_record_their_true_logprobs():
    """Sampling over a prefix-shared cache: each row's recorded log-probs equal a teacher-forced pass of the
    adapter's model over that row's own prompt and completion."""
    shared = _adapter_engine()
    system = {"role": "system", "content": "Solve it and reply with a number only, please. " * 2}
    sampling = SamplingParams(temperature=0.8, max_tokens=6)
    requests = [GenerationRequest(messages=(system, {"role": "user", "content": q}), adapter="one",
                                  sampling=sampling) for q in ("1 + 1?", "What is 17 minus 9?", "1 + 1?")]
    torch.manual_seed(0)
    rows = shared._generate_batch(requests, sampling)
    model = shared.policy.model
    model.set_adapter("one")
    for gen in rows:
        ids = torch.tensor([gen.prompt_ids + gen.completion_ids])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(gen.prompt_ids) - 1: -1]
        expected = torch.log_softmax(logits.float() / 0.8, -1).gather(1, torch.tensor(gen.completion_ids)[:, None])
        assert gen.logprobs == pytest.approx(expected.squeeze(1).tolist(), abs=1e-4)


def test_prefill_cost_and_subbatch_plan_by_hand():
    """Hand-worked: two 'voter' prompts of 6 tokens sharing 4, two 'aggregator' prompts of 12 sharing 8, and the two
    kinds sharing 2 tokens (the chat template)."""
    from wfc.engines.hf import plan_subbatches, prefill_cost, shared_prefix

    v1, v2 = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8]
    a1, a2 = [1, 2, 9, 9, 9, 9, 9, 9, 5, 5, 5, 5], [1, 2, 9, 9, 9, 9, 9, 9, 6, 6, 6, 6]
    assert shared_prefix([v1, v2]) == 4 and shared_prefix([v1, v1]) == 0  # one distinct prompt: nothing to share
    assert shared_prefix([[1, 2], [1, 2, 3]]) == 1  # below the shortest prompt
    assert shared_prefix([v1, v2], min_shared=5) == 0
    assert prefill_cost([v1, v2, v1]) == 4 + 2 * 2  # the duplicate costs nothing
    prompts, kinds = [v1, v2, a1, a2], ["voter", "voter", "agg", "agg"]
    # together: shared 2, width 10, 4 distinct rows -> 2 + 4 * 10 = 42; apart: (4 + 2 * 2) + (8 + 2 * 4) = 24
    assert prefill_cost(prompts) == 42
    assert plan_subbatches(prompts, kinds, decode_cost=17) == [[0, 1], [2, 3]]  # 24 + 17 < 42
    assert plan_subbatches(prompts, kinds, decode_cost=18) == [[0, 1, 2, 3]]  # 24 + 18 is not < 42
    assert plan_subbatches(prompts, ["x"] * 4, decode_cost=0) == [[0, 1, 2, 3]]


def test_a_batch_of_two_roles_is_split_and_each_row_matches_the_unsplit_batch():
    """Rows of two system prompts (one short, one long): generated as two calls, each sharing its own prefix, and
    greedy results equal one unshared call's."""
    engine = _adapter_engine()
    short = {"role": "system", "content": "Answer."}
    long = {"role": "system", "content": "Several solvers proposed answers; pick the one most agree on. " * 4}
    requests = [GenerationRequest(messages=(sys, {"role": "user", "content": q}), adapter="one", sampling=GREEDY)
                for sys in (short, long) for q in ("What is 2 + 3?", "What is 40 + 2?", "Seven minus one?")]
    calls = engine.stats["generate_calls"]
    a = engine._generate_batch(requests, GREEDY)
    assert engine.stats["generate_calls"] == calls + 2
    b = _unshared(engine, requests, GREEDY)
    for x, y in zip(a, b):
        assert x.prompt_ids == y.prompt_ids and x.completion_ids == y.completion_ids
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) < 1e-4


def test_inverse_cdf_sampling_by_hand():
    """p = (0.1, 0.2, 0.3, 0.4): cumulative (0.1, 0.3, 0.6, 1.0), so u picks the first index whose cumulative
    probability exceeds it; a zero-probability entry is stepped over."""
    from wfc.engines.hf import sample_tokens

    logp = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(4, 4)
    assert sample_tokens(logp, torch.tensor([0.05, 0.25, 0.55, 0.95])).tolist() == [0, 1, 2, 3]
    with_zero = torch.tensor([[0.5, 0.0, 0.5]]).log()
    assert sample_tokens(with_zero, torch.tensor([0.5])).tolist() == [2]
    # u just under 1 (u * total may round up to the total): still a token of positive probability
    assert sample_tokens(torch.tensor([[0.5, 0.5, 0.0]]).log(), torch.tensor([1 - 2 ** -24])).tolist() == [1]


def test_inverse_cdf_top_p_by_hand_and_against_transformers():
    """top_p=0.6 over p = (0.2, 0.4, 0.1, 0.3): keep the tokens whose strictly-more-probable mass is below 0.6 (0.4
    and 0.3), renormalised to (4/7, 3/7): u=0.5 -> 0.35 of 0.7 -> token 1; u=0.9 -> token 3. On random logits the
    kept set is exactly the one transformers' TopPLogitsWarper leaves finite."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from wfc.engines.hf import sample_tokens

    logp = torch.tensor([[0.2, 0.4, 0.1, 0.3]]).log().expand(2, 4)
    assert sample_tokens(logp, torch.tensor([0.5, 0.9]), top_p=0.6).tolist() == [1, 3]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen) * 3
    logp = torch.log_softmax(logits, -1)
    kept_hf = torch.isfinite(TopPLogitsWarper(0.8)(None, logits.clone()))
    draws = torch.stack([sample_tokens(logp, torch.rand(64, generator=gen), top_p=0.8) for _ in range(200)], 1)
    for row in range(64):
        assert set(draws[row].tolist()) <= set(kept_hf[row].nonzero().squeeze(1).tolist())


def test_inverse_cdf_sampling_draws_the_distribution():
    """20,000 draws from p = (0.5, 0.3, 0.15, 0.05): each frequency within 4 standard errors of p."""
    from wfc.engines.hf import sample_tokens

    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20_000
    draws = sample_tokens(p.log().expand(n, 4), torch.rand(n, generator=torch.Generator().manual_seed(1)))
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.all((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt())


def test_sampled_generation_is_seeded_and_varied(tiny_engine):
    """Sampled rows draw from torch's global generator: the same seed gives the same tokens, identical requests in
    one batch get their own draws, and every recorded log-prob is that of a token of positive probability."""
    hot = request(sampling=SamplingParams(temperature=1.5, max_tokens=6))
    torch.manual_seed(3)
    first = tiny_engine._generate_batch([hot] * 8, hot.sampling)
    torch.manual_seed(3)
    again = tiny_engine._generate_batch([hot] * 8, hot.sampling)
    assert [g.completion_ids for g in first] == [g.completion_ids for g in again]
    assert len({tuple(g.completion_ids) for g in first}) > 1
    assert all(lp > float("-inf") for g in first for lp in g.logprobs)


def test_a_seeded_request_samples_alike_in_any_batch(tiny_engine):
    """A request's own seed fixes its tokens: alone, in a batch with other prompts (other padding, other rows'
    draws) and whatever torch's global generator holds; another seed draws other tokens, and rows without a seed
    still draw from the global generator."""
    hot = SamplingParams(temperature=1.5, max_tokens=6)
    other = ({"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour, please."})

    def seeded(seed, messages=MESSAGES):
        return GenerationRequest(messages=messages, sampling=hot, seed=seed)

    torch.manual_seed(0)
    (alone,) = tiny_engine._generate_batch([seeded(11)], hot)
    torch.manual_seed(99)
    mixed = tiny_engine._generate_batch([seeded(5, other), seeded(11), request(sampling=hot, messages=other)], hot)
    assert mixed[1].completion_ids == alone.completion_ids
    assert mixed[1].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    draws = {tuple(tiny_engine._generate_batch([seeded(s)], hot)[0].completion_ids) for s in range(8)}
    assert len(draws) > 1  # seeds are not ignored
    torch.manual_seed(1)
    unseeded = [tiny_engine._generate_batch([request(sampling=hot)], hot)[0].completion_ids for _ in range(2)]
    torch.manual_seed(1)
    assert [tiny_engine._generate_batch([request(sampling=hot)], hot)[0].completion_ids for _ in range(2)] == unseeded
