"""wfc.attention: grouped key/value heads broadcast inside SDPA give what transformers' copying ``sdpa`` gives, and a
CPU policy uses them (on the tiny model: 2 query heads, 1 key/value head)."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from compilers.packing import naive_logprobs, packed_logprobs
from wfc.attention import GQA_SDPA, gqa_sdpa_attention_forward, use_gqa_sdpa
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.engines.hf import HFEngine
from wfc.models import load_model
from wfc.policy import Policy


class _Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("queries", [1, 7])
def test_matches_transformers_sdpa(masked, queries):
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, K, D = 3, 6, 2, 7, 16
    q = torch.randn(B, H, queries, D, generator=g)
    k, v = torch.randn(B, Hkv, K, D, generator=g), torch.randn(B, Hkv, K, D, generator=g)
    mask = None
    if masked:  # padding: the first two keys of row 0 masked out
        mask = torch.zeros(B, 1, queries, K)
        mask[0, ..., :2] = torch.finfo(torch.float32).min
    module = _Module(H // Hkv)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    got, weights = gqa_sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert weights is None and got.shape == (B, queries, H, D)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_cpu_policy_switches_and_generation_is_unchanged():
    """A policy on the CPU runs GQA_SDPA; greedy and seeded sampled rows are token for token what the plain
    ``sdpa`` model generates, with the same log-probs."""
    switched = HFEngine(policy=Policy("tiny", device="cpu"))
    assert switched.policy.base_model.config._attn_implementation == GQA_SDPA
    reference = Policy("tiny", device="cpu")
    reference.base_model.set_attn_implementation("sdpa")  # undo the switch: the reference is transformers' own
    assert reference.base_model.config._attn_implementation == "sdpa"
    plain = HFEngine(policy=reference)
    assert switched.policy.base_model.config._attn_implementation == GQA_SDPA  # two models, not one
    messages = [({"role": "user", "content": f"What is {i} + {i + 2}?"},) for i in range(5)]
    for sampling in (SamplingParams(temperature=0.0, max_tokens=6), SamplingParams(temperature=0.9, max_tokens=6)):
        reqs = [GenerationRequest(messages=m, sampling=sampling, seed=i) for i, m in enumerate(messages)]
        a, b = switched.generate(reqs), plain.generate(reqs)
        assert [x.completion_ids for x in a] == [y.completion_ids for y in b]
        for x, y in zip(a, b):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_packed_logprobs_run_on_it():
    """The update's packed forward (4-D mask) accepts the variant and still equals the naive rows."""
    policy = Policy("tiny", device="cpu")
    model = policy.model
    assert model.config._attn_implementation == GQA_SDPA
    groups = [([5, 6, 7, 8], [[9, 10], [11], [12, 13, 14]]), ([5, 6, 20], [[21, 22]])]
    with torch.no_grad():
        packed = packed_logprobs(model, groups)
        naive = naive_logprobs(model, groups)
    for pg, ng in zip(packed, naive):
        for p, n in zip(pg, ng):
            torch.testing.assert_close(p, n, rtol=1e-5, atol=1e-5)


def test_left_alone_off_the_cpu_or_off_sdpa():
    handle = load_model("tiny")
    assert not use_gqa_sdpa(handle.model, "meta")  # not the CPU: transformers' choice stays
    handle.model.set_attn_implementation("eager")
    assert not use_gqa_sdpa(handle.model, "cpu")
    assert handle.model.config._attn_implementation == "eager"
