"""Hand-worked tables for compilers.loss: loss values *and* gradients w.r.t. logprobs.

Shared setup for the main table: old_logprobs = 0, logprobs = log(ratio), so ratio = exp(new - old) is the number
written in the table. Gradient of a token's unclipped loss -r*A w.r.t. its logprob is -r*A (dr/dlogp = r); a token
whose clip is active has gradient 0. clip_eps = 0.2 -> clip range [0.8, 1.2].

Row 0, A = +1, mask [1, 1, 1]
  ratio 1.5: min(1.5*1, 1.2*1) = 1.2 -> loss -1.2, clipped (high), grad 0
  ratio 1.0: min(1.0, 1.0)     = 1.0 -> loss -1.0, grad -1.0
  ratio 0.5: min(0.5, 0.8)     = 0.5 -> loss -0.5, unclipped (A > 0 never clips below), grad -0.5
  row sum -2.7, row mean -0.9
Row 1, A = -2, mask [1, 1, 0]
  ratio 1.5: min(-3.0, 1.2*-2 = -2.4) = -3.0 -> loss 3.0, unclipped, grad -1.5*-2 = 3.0
  ratio 0.5: min(-1.0, 0.8*-2 = -1.6) = -1.6 -> loss 1.6, clipped (low), grad 0
  padding: ignored (set to NaN/-inf below to prove it)
  row sum 4.6, row mean 2.3

token:    (-2.7 + 4.6) / 5 tokens        = 1.9 / 5 = 0.38     grad = per-token grad / 5
sequence: (-0.9 + 2.3) / 2               = 0.7               grad = per-token grad / n_i / 2
constant: 1.9 / (B=2 * max_tokens=4)     = 0.2375            grad = per-token grad / 8
stats: 5 tokens; 2 clipped (1 low, 1 high) -> 0.4; ratio mean (1.5+1+0.5+1.5+0.5)/5 = 1.0
"""

from __future__ import annotations

import math

import pytest
import torch

from compilers.loss import (
    AGGREGATIONS,
    clipped_surrogate,
    get_aggregation,
    kl_k3,
    masked_mean,
    policy_loss,
)

NAN, NEG_INF = float("nan"), float("-inf")


def batch(pad_value: float = NAN):
    ratios = torch.tensor([[1.5, 1.0, 0.5], [1.5, 0.5, 1.0]], dtype=torch.float64)
    logprobs = ratios.log()
    logprobs[1, 2] = pad_value  # garbage at the padded position
    logprobs.requires_grad_(True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    old[1, 2] = NEG_INF
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return logprobs, old, advantages, mask


PER_TOKEN_GRAD = [[0.0, -1.0, -0.5], [3.0, 0.0, 0.0]]

AGG_TABLE = [
    # (aggregation, loss, grad)
    ("token", 1.9 / 5, [[0.0, -1.0 / 5, -0.5 / 5], [3.0 / 5, 0.0, 0.0]]),
    ("sequence", 0.7, [[0.0, -1.0 / 6, -0.5 / 6], [3.0 / 4, 0.0, 0.0]]),
    ("constant", 1.9 / 8, [[0.0, -1.0 / 8, -0.5 / 8], [3.0 / 8, 0.0, 0.0]]),
]


@pytest.mark.parametrize("aggregation, expected_loss, expected_grad", AGG_TABLE)
def test_clipped_loss_table_each_aggregation(aggregation, expected_loss, expected_grad):
    logprobs, old, adv, mask = batch()
    loss, stats = policy_loss(logprobs, old, adv, mask, aggregation=aggregation, clip_eps=0.2, max_tokens=4)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert torch.allclose(logprobs.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12)
    assert stats == pytest.approx(
        {
            "token_count": 5.0,
            "clip_fraction": 0.4,
            "clip_low_fraction": 0.2,
            "clip_high_fraction": 0.2,
            "ratio_mean": 1.0,
            "kl_mean": 0.0,
            "entropy_mean": 0.0,
        }
    )


def test_surrogate_per_token_table():
    logprobs, old, adv, _ = batch(pad_value=0.0)
    old = torch.zeros_like(old)
    sur = clipped_surrogate(logprobs, old, adv, clip_eps=0.2)
    # last column of row 1 is ratio exp(0)=1, A=-2: min(-2, -2) = -2 -> loss 2 (it is padding in policy_loss)
    expected = torch.tensor([[-1.2, -1.0, -0.5], [3.0, 1.6, 2.0]], dtype=torch.float64)
    assert torch.allclose(sur.loss, expected, atol=1e-12)
    assert sur.clipped_high.tolist() == [[True, False, False], [False, False, False]]
    assert sur.clipped_low.tolist() == [[False, False, False], [False, True, False]]


@pytest.mark.parametrize("pad", [NAN, NEG_INF, 1e6])
def test_padding_values_never_leak(pad):
    logprobs, old, adv, mask = batch(pad_value=pad)
    loss, stats = policy_loss(logprobs, old, adv, mask)
    loss.backward()
    assert math.isfinite(loss.item()) and math.isfinite(stats["ratio_mean"])
    assert logprobs.grad[1, 2].item() == 0.0
    assert torch.isfinite(logprobs.grad).all()


def test_float_mask_equals_bool_mask():
    logprobs, old, adv, mask = batch()
    loss_bool, _ = policy_loss(logprobs, old, adv, mask)
    loss_float, _ = policy_loss(logprobs, old, adv, mask.double())
    assert loss_bool.item() == loss_float.item()
    with pytest.raises(ValueError, match="only 0 and 1"):
        policy_loss(logprobs, old, adv, mask.double() * 0.5)


def test_asymmetric_clip_higher():
    # One token, ratio 1.25, A = +1.
    #   symmetric eps 0.2:       clip at 1.2  -> loss -1.2,  grad 0
    #   clip_eps_high 0.28 (DAPO): 1.25 < 1.28 -> loss -1.25, grad -1.25
    logprobs = torch.tensor([[math.log(1.25)]], dtype=torch.float64, requires_grad=True)
    old, adv, mask = torch.zeros(1, 1, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1)
    loss, stats = policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert (loss.item(), grad.item(), stats["clip_fraction"]) == pytest.approx((-1.2, 0.0, 1.0))
    loss, stats = policy_loss(logprobs, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert (loss.item(), grad.item(), stats["clip_fraction"]) == pytest.approx((-1.25, -1.25, 0.0))
    # the low side still uses clip_eps: ratio 0.5, A = -1 -> min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped low
    low = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(low, old, -adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    assert (loss.item(), stats["clip_low_fraction"]) == pytest.approx((0.8, 1.0))


def test_on_policy_loss_is_minus_advantage():
    # ratio = 1 everywhere: loss_t = -A; grad_t = -A / n. A = [0.5, -1], 2 + 1 tokens:
    # token: (-0.5 - 0.5 + 1) / 3 = 0; grads [-0.5/3, -0.5/3, 1/3]
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logprobs, logprobs.detach(), torch.tensor([0.5, -1.0]), mask)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.5 / 3, -0.5 / 3], [1 / 3, 0.0]]))
    assert stats["ratio_mean"] == 1.0 and stats["clip_fraction"] == 0.0


WEIGHT_TABLE = [
    # weights [2, 0.5]: row sums become 2*-2.7 = -5.4 and 0.5*4.6 = 2.3; row means 2*-0.9 = -1.8, 0.5*2.3 = 1.15
    ("token", (-5.4 + 2.3) / 5),  # -0.62: denominator is still 5 tokens, not weighted
    ("sequence", (-1.8 + 1.15) / 2),  # -0.325
    ("constant", (-5.4 + 2.3) / 8),  # -0.3875
]


@pytest.mark.parametrize("aggregation, expected", WEIGHT_TABLE)
def test_row_weights(aggregation, expected):
    logprobs, old, adv, mask = batch()
    w = torch.tensor([2.0, 0.5], dtype=torch.float64)
    loss, _ = policy_loss(logprobs, old, adv, mask, aggregation=aggregation, weights=w, max_tokens=4)
    loss.backward()
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    # gradients scale row-wise: row 0 by 2, row 1 by 0.5, relative to the unweighted table
    unweighted = torch.tensor(dict((a, g) for a, _, g in AGG_TABLE)[aggregation], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, unweighted * w.unsqueeze(-1), atol=1e-12)


def test_all_ones_weights_change_nothing():
    logprobs, old, adv, mask = batch()
    for aggregation in AGGREGATIONS:
        plain, _ = policy_loss(logprobs, old, adv, mask, aggregation=aggregation, max_tokens=4)
        ones, _ = policy_loss(
            logprobs, old, adv, mask, aggregation=aggregation, max_tokens=4, weights=torch.ones(2, dtype=torch.float64)
        )
        assert plain.item() == ones.item()


def test_kl_k3_table():
    # delta = ref - new
    #   delta 0:     e^0 - 0 - 1 = 0
    #   delta ln 2:  2 - ln 2 - 1 = 1 - ln 2 ~= 0.30685
    #   delta -ln 2: 0.5 + ln 2 - 1 = ln 2 - 0.5 ~= 0.19315
    new = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.0, math.log(2), -math.log(2)], dtype=torch.float64)
    kl = kl_k3(new, ref)
    assert kl.tolist() == pytest.approx([0.0, 1 - math.log(2), math.log(2) - 0.5], abs=1e-12)
    # d/dnew = 1 - e^delta = [0, 1 - 2, 1 - 0.5] = [0, -1, 0.5]
    kl.sum().backward()
    assert new.grad.tolist() == pytest.approx([0.0, -1.0, 0.5], abs=1e-12)
    assert (kl >= 0).all()


def test_kl_zero_when_ref_equals_new():
    logprobs, old, adv, mask = batch()
    plain, _ = policy_loss(logprobs, old, adv, mask)
    with_kl, stats = policy_loss(logprobs, old, adv, mask, ref_logprobs=logprobs.detach().clone(), beta=0.5)
    assert with_kl.item() == pytest.approx(plain.item(), abs=1e-12)
    assert stats["kl_mean"] == 0.0


def test_kl_penalty_value_and_grad():
    # One token, new = old = 0, A = 0 -> policy term 0 with grad 0 (-min(0, 0)).
    # ref = ln 2, beta = 0.1: loss = 0.1 * (1 - ln 2) ~= 0.030685; grad = 0.1 * (1 - 2) = -0.1
    # importance weight 0.25 multiplies only the policy term (0 here), so the KL term is unchanged.
    new = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    args = (new, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), torch.ones(1, 1))
    ref = torch.full((1, 1), math.log(2), dtype=torch.float64)
    for iw in (None, torch.full((1, 1), 0.25, dtype=torch.float64)):
        loss, stats = policy_loss(*args, ref_logprobs=ref, beta=0.1, importance_weights=iw)
        (grad,) = torch.autograd.grad(loss, new)
        assert loss.item() == pytest.approx(0.1 * (1 - math.log(2)), abs=1e-12)
        assert grad.item() == pytest.approx(-0.1, abs=1e-12)
        assert stats["kl_mean"] == pytest.approx(1 - math.log(2), abs=1e-12)


def test_kl_measured_with_zero_beta():
    new = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    ref = torch.full((1, 1), math.log(2), dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, stats = policy_loss(new, new.detach(), adv, torch.ones(1, 1), ref_logprobs=ref)
    assert loss.item() == -1.0  # on-policy, A = 1: -1 * 1, no KL added
    assert stats["kl_mean"] == pytest.approx(1 - math.log(2))


def test_entropy_bonus_value_and_grad():
    # Two tokens of one row, on-policy (new = old = 0), A = 0: the policy term is 0 with grad 0.
    # entropy (1.0, 0.5) at coef 0.1, token aggregation: loss = -0.1 * (1.0 + 0.5) / 2 = -0.075;
    # d loss / d entropy_t = -0.1 / 2 = -0.05 on each token; row weight 2 doubles both; importance weight 0.25
    # multiplies only the policy term, so the bonus is unchanged.
    new = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[1.0, 0.5]], dtype=torch.float64, requires_grad=True)
    args = (new, torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), torch.ones(1, 2))
    for w, iw, scale in ((None, None, 1.0), (torch.tensor([2.0]), None, 2.0),
                         (None, torch.full((1, 2), 0.25, dtype=torch.float64), 1.0)):
        loss, stats = policy_loss(*args, entropy=ent, entropy_coef=0.1, weights=w, importance_weights=iw)
        (g_new, g_ent) = torch.autograd.grad(loss, (new, ent))
        assert loss.item() == pytest.approx(-0.075 * scale, abs=1e-12)
        assert torch.allclose(g_ent, torch.full((1, 2), -0.05 * scale, dtype=torch.float64), atol=1e-12)
        assert torch.all(g_new == 0)
        assert stats["entropy_mean"] == pytest.approx(0.75, abs=1e-12)


def test_entropy_measured_with_zero_coef_and_masked_padding():
    # coef 0: the loss is the policy term alone (-A = -1); the mean entropy skips the padded (NaN) position
    new = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[0.4, NAN]], dtype=torch.float64)
    mask = torch.tensor([[True, False]])
    loss, stats = policy_loss(new, new.detach(), torch.tensor([1.0], dtype=torch.float64), mask, entropy=ent)
    assert loss.item() == -1.0 and stats["entropy_mean"] == pytest.approx(0.4)
    assert policy_loss(new, new.detach(), torch.tensor([1.0], dtype=torch.float64), mask)[1]["entropy_mean"] == 0.0


def test_importance_weights_scale_policy_term_per_token():
    # Weight 0.5 on row 0 token 1 (loss -1.0, grad -1.0) -> loss -0.5, grad -0.5; weight 0 on row 1 token 0 removes it.
    # token aggregation: row 0 sum -1.2 - 0.5 - 0.5 = -2.2; row 1: 0 + 1.6 = 1.6 -> (-2.2 + 1.6) / 5 = -0.12
    logprobs, old, adv, mask = batch()
    iw = torch.ones(2, 3, dtype=torch.float64)
    iw[0, 1], iw[1, 0], iw[1, 2] = 0.5, 0.0, NAN  # NaN sits on padding: ignored
    loss, _ = policy_loss(logprobs, old, adv, mask, importance_weights=iw)
    loss.backward()
    assert loss.item() == pytest.approx(-0.12, abs=1e-12)
    expected = torch.tensor([[0.0, -0.5 / 5, -0.5 / 5], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, expected, atol=1e-12)


def test_sequence_aggregation_counts_empty_rows():
    # Row 1 has no completion tokens: it contributes 0 and still counts in B.
    # Row 0: one token, ratio 1, A = 1 -> loss -1; sequence: (-1 + 0) / 2 = -0.5; token: -1 / 1 = -1
    logprobs = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[True, False], [False, False]])
    args = (logprobs, torch.zeros(2, 2), torch.tensor([1.0, 1.0]), mask)
    assert policy_loss(*args, aggregation="sequence")[0].item() == -0.5
    assert policy_loss(*args, aggregation="token")[0].item() == -1.0


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_mean(x, mask).item() == 1.5  # (1 + 2) / 2
    assert masked_mean(x, mask, dim=-1).tolist() == [1.5, 0.0]  # empty row -> 0
    with pytest.raises(ValueError, match="all-false"):
        masked_mean(x, torch.zeros(2, 3))


def test_registry_and_lookup():
    assert set(AGGREGATIONS) == {"token", "sequence", "constant"}
    assert get_aggregation("token") is AGGREGATIONS["token"]
    with pytest.raises(ValueError) as err:
        get_aggregation("seq-mean-token-sum")
    assert all(name in str(err.value) for name in AGGREGATIONS)


def test_custom_aggregation_callable():
    logprobs, old, adv, mask = batch()

    def total(token_losses, mask, *, max_tokens):
        return token_losses.sum()

    loss, _ = policy_loss(logprobs, old, adv, mask, aggregation=total)
    assert loss.item() == pytest.approx(1.9, abs=1e-12)  # -2.7 + 4.6


def _ok():
    logprobs, old, adv, mask = batch()
    return dict(logprobs=logprobs, old_logprobs=old, advantages=adv, mask=mask)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(aggregation="mean"), "choose one of"),
        (dict(aggregation="constant"), "max_tokens"),
        (dict(aggregation="constant", max_tokens=2), "3 completion tokens"),
        (dict(beta=0.1), "ref_logprobs"),
        (dict(beta=-0.1), "beta"),
        (dict(clip_eps=1.0), "clip_eps"),
        (dict(clip_eps_high=-0.1), "clip_eps_high"),
        (dict(advantages=torch.zeros(2, 1)), r"shape \(2,\)"),
        (dict(advantages=torch.tensor([NAN, 0.0])), "NaN"),
        (dict(old_logprobs=torch.zeros(2, 4)), "align"),
        (dict(mask=torch.zeros(2, 3, dtype=torch.bool)), "no completion tokens"),
        (dict(weights=torch.tensor([1.0, -1.0])), "weights must be >= 0"),
        (dict(weights=torch.ones(3)), "one value per sequence"),
        (dict(importance_weights=torch.full((2, 3), -1.0)), "importance_weights"),
        (dict(ref_logprobs=torch.zeros(3, 3)), "align"),
        (dict(entropy_coef=0.1), "needs entropy"),
        (dict(entropy_coef=-0.1, entropy=torch.zeros(2, 3)), "entropy_coef must be >= 0"),
        (dict(entropy=torch.zeros(2, 4)), "align"),
    ],
)
def test_user_mistakes_raise_value_error(change, match):
    kwargs = _ok() | change
    with pytest.raises(ValueError, match=match):
        policy_loss(**kwargs)


def test_low_precision_inputs_are_upcast():
    # bf16 cannot represent exp(log(1.001)) - 1 well; the loss is computed in float32, so the ratio survives.
    logprobs = torch.tensor([[0.001]], dtype=torch.bfloat16, requires_grad=True)
    loss, stats = policy_loss(logprobs, torch.zeros(1, 1, dtype=torch.bfloat16), torch.tensor([1.0]), torch.ones(1, 1))
    assert loss.dtype == torch.float32
    assert stats["ratio_mean"] == pytest.approx(math.exp(float(logprobs.detach().float())), rel=1e-6)
