"""Shared-prefix packing is exact: packed log-probs and LoRA grads equal the naive ones (fp32, tiny model)."""

from __future__ import annotations

import copy

import pytest
import torch

from compilers.packing import (
    naive_logprobs,
    packed_length,
    packed_logprobs,
    packed_mask,
    plan_microbatches,
    rho,
)

ATOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tiny_handle):
    """The session's shared tiny model: tests below deep-copy it before changing anything."""
    return tiny_handle.model


def _ids(gen: torch.Generator, n: int, vocab: int = 49152) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def _groups(seed: int = 0) -> list:
    """Prompts of different lengths, ragged completions, an N=1 group and a one-token completion."""
    g = torch.Generator().manual_seed(seed)
    return [
        (_ids(g, 7), [_ids(g, 5), _ids(g, 3), _ids(g, 9)]),
        (_ids(g, 12), [_ids(g, 4)]),  # N = 1
        (_ids(g, 3), [_ids(g, 6), _ids(g, 6), _ids(g, 1), _ids(g, 2)]),
        (_ids(g, 1), [_ids(g, 4), _ids(g, 2)]),  # a one-token prompt
    ]


def _reference(model, groups, temperature: float = 1.0) -> list[list[torch.Tensor]]:
    """Independent of the module: one unpadded row per completion, full logits."""
    out = []
    for prompt, comps in groups:
        row = []
        for comp in comps:
            logits = model(torch.tensor([prompt + comp])).logits[0]  # (T, V)
            logp = torch.log_softmax(logits / temperature, -1)[len(prompt) - 1 : len(prompt) - 1 + len(comp)]
            row.append(logp.gather(-1, torch.tensor(comp)[:, None])[:, 0])
        out.append(row)
    return out


def _max_diff(a, b) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    diffs = []
    for xs, ys in zip(a, b):
        for x, y in zip(xs, ys):
            assert x.shape == y.shape
            diffs.append((x - y).abs().max().item() if x.numel() else 0.0)
    return max(diffs)


# --- pure helpers ---------------------------------------------------------------------------------------------


def test_rho_table():
    assert rho(384, 48, 8) == pytest.approx(8 * 432 / 768)  # 4.5, the field-notes probe
    assert rho(512, 64, 8) == pytest.approx(8 * 576 / 1024)
    assert rho(100, 10, 1) == 1.0  # a group of one saves nothing
    assert rho(0, 10, 4) == pytest.approx(1.0)  # no shared prefix, nothing to share
    with pytest.raises(ValueError):
        rho(10, 10, 0)


def test_plan_microbatches_respects_budget_and_covers_all():
    lengths = [10, 3, 7, 25, 4, 4]
    plan = plan_microbatches(lengths, 16)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        cost = len(mb) * max(lengths[i] for i in mb)
        assert cost <= 16 or len(mb) == 1  # an over-budget row runs alone
    assert [3] in plan
    with pytest.raises(ValueError):
        plan_microbatches(lengths, 0)


def test_plan_microbatches_min_fill_bounds_padding():
    lengths = [746, 700, 640, 600, 365]  # a step's aggregator packs under the quadratic cost
    assert plan_microbatches(lengths, 4096) == [[0, 1, 2, 3, 4]]  # 5 x 746 = 3,730 padded tokens for 3,051
    assert plan_microbatches(lengths, 4096, min_fill=0.75) == [[0, 1, 2, 3], [4]]  # 600 >= 559.5 > 365
    assert plan_microbatches(lengths, 4096, min_fill=1.0) == [[0], [1], [2], [3], [4]]
    assert plan_microbatches([5, 5, 5], 100, min_fill=1.0) == [[0, 1, 2]]  # equal rows still share
    for fill in (-0.1, 1.5):
        with pytest.raises(ValueError, match="min_fill"):
            plan_microbatches(lengths, 4096, min_fill=fill)


def test_packed_mask_pattern():
    seg = torch.tensor([[0, 0, 1, 1, 2, -1]])  # prompt of 2, completions of 2 and 1, one pad
    allowed = packed_mask(seg, torch.float32)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],  # completion 2 does not see completion 1
            [0, 0, 0, 0, 0, 1],  # padding sees only itself: no fully masked row
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


def test_bad_groups_raise():
    with pytest.raises(ValueError, match="empty prompt"):
        packed_logprobs(None, [([], [[1, 2]])])
    with pytest.raises(ValueError, match="no completions"):
        naive_logprobs(None, [([1], [])])
    with pytest.raises(TypeError, match="list of token-id lists"):
        packed_logprobs(None, [([1], [1, 2])])


# --- exactness on the tiny model ------------------------------------------------------------------------------


@torch.no_grad()
def test_naive_matches_unpadded_full_logits(tiny):
    groups = _groups()
    ref = _reference(tiny, groups)
    assert _max_diff(naive_logprobs(tiny, groups), ref) < ATOL
    assert _max_diff(naive_logprobs(tiny, groups, token_budget=20), ref) < ATOL  # mixed-group padded batches


@torch.no_grad()
def test_temperature_scaled_logprobs_match_the_reference(tiny):
    """Log-probs under softmax(logits / T): what the engines report for tokens sampled at temperature T."""
    groups = _groups()
    ref = _reference(tiny, groups, temperature=0.7)
    assert _max_diff(packed_logprobs(tiny, groups, temperature=0.7), ref) < ATOL
    assert _max_diff(naive_logprobs(tiny, groups, temperature=0.7), ref) < ATOL
    assert _max_diff(packed_logprobs(tiny, groups), _reference(tiny, groups)) < ATOL
    with pytest.raises(ValueError, match="temperature"):
        packed_logprobs(tiny, groups, temperature=0.0)


@torch.no_grad()
def test_entropy_of_each_position_matches_the_reference(tiny):
    """With ``entropy=True`` column 0 is the log-prob as before and column 1 the entropy of softmax(logits / T) at
    the position that predicts each completion token, packed or not."""
    groups = _groups(2)
    expected = []
    for prompt, comps in groups:
        row = []
        for comp in comps:
            logits = tiny(torch.tensor([prompt + comp])).logits[0] / 0.7
            logp = torch.log_softmax(logits, -1)[len(prompt) - 1: len(prompt) - 1 + len(comp)]
            row.append(-(logp.exp() * logp).sum(-1))
        expected.append(row)
    lps = _reference(tiny, groups, temperature=0.7)
    for got in (packed_logprobs(tiny, groups, temperature=0.7, entropy=True),
                naive_logprobs(tiny, groups, temperature=0.7, entropy=True)):
        assert _max_diff([[t[:, 0] for t in row] for row in got], lps) < ATOL
        assert _max_diff([[t[:, 1] for t in row] for row in got], expected) < ATOL
    assert all(float(t.min()) > 0 for row in expected for t in row)  # a random model is far from one-hot


@torch.no_grad()
@pytest.mark.parametrize("budget", [10_000, 20, 1])  # one micro-batch; several; one group each
def test_packed_matches_naive(tiny, budget):
    groups = _groups()
    if budget == 10_000:
        assert len(plan_microbatches([packed_length(g) for g in groups], budget)) == 1
    naive = naive_logprobs(tiny, groups)
    packed = packed_logprobs(tiny, groups, token_budget=budget)
    assert _max_diff(packed, naive) < ATOL


@torch.no_grad()
def test_packed_full_logits_path_and_eager_attention(tiny):
    groups = _groups(1)
    naive = naive_logprobs(tiny, groups)
    assert _max_diff(packed_logprobs(tiny, groups, fast=False), naive) < ATOL
    eager = copy.deepcopy(tiny)
    eager.set_attn_implementation("eager")
    assert _max_diff(packed_logprobs(eager, groups), naive) < ATOL


@torch.no_grad()
def test_mask_and_positions_matter(tiny):
    """Negative control: the model really honours the 4-D mask (otherwise packed would still look 'close')."""
    from compilers import packing

    groups = [_groups()[0]]
    naive = naive_logprobs(tiny, groups)
    batch = packing._packed_batch(groups, torch.device("cpu"), torch.float32)
    leaky = copy.copy(batch)
    seg = torch.zeros_like(batch.input_ids)  # everything "prompt": plain causal, completions see each other
    leaky.attention_mask = packed_mask(seg, torch.float32)
    flat = packing._token_logprobs(tiny, leaky)
    assert (flat - torch.cat(naive[0])).abs().max() > 1e-3


def test_packed_rejects_unmaskable_attention(tiny):
    other = copy.deepcopy(tiny)
    other.config._attn_implementation = "flash_attention_2"  # only the check is exercised, never the kernel
    with pytest.raises(ValueError, match="set_attn_implementation"):
        packed_logprobs(other, _groups())


# --- gradients through LoRA -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora(tiny):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(copy.deepcopy(tiny), config)  # B is random: the adapter changes outputs


def _lora_grads(model, groups, fn, weights):
    model.zero_grad(set_to_none=True)
    out = fn(model, groups)
    loss = sum((lp * w).sum() for lps, ws in zip(out, weights) for lp, w in zip(lps, ws))
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_lora_grads_match(lora):
    groups = _groups(2)
    g = torch.Generator().manual_seed(3)
    weights = [[torch.randn(len(c), generator=g) for c in comps] for _, comps in groups]
    naive = _lora_grads(lora, groups, naive_logprobs, weights)
    packed = _lora_grads(lora, groups, lambda m, gs: packed_logprobs(m, gs, token_budget=25), weights)
    assert naive.keys() == packed.keys() and len(naive) == 8  # (q, v) x 2 layers x (A, B)
    for name in naive:
        scale = naive[name].abs().max().item()
        assert scale > 0, f"{name} has no gradient: the check would be vacuous"
        diff = (naive[name] - packed[name]).abs().max().item()
        assert diff <= ATOL * max(1.0, scale), f"{name}: max abs diff {diff:.2e} (scale {scale:.2e})"


@torch.no_grad()
def test_disabled_adapter_equals_base(tiny, lora):
    groups = _groups(4)
    base = naive_logprobs(tiny, groups)
    with_adapter = packed_logprobs(lora, groups)
    assert _max_diff(with_adapter, base) > 1e-3  # the adapter does change things...
    with lora.disable_adapter():
        without = packed_logprobs(lora, groups)
    assert _max_diff(without, base) < ATOL  # ...and disabling it gives back the base model exactly
