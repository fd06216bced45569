"""Truncated importance correction: a hand-worked table for the pure functions, then its effect on a real update."""

import math

import pytest
import torch

from compilers.offpolicy import merge_mismatch, mismatch_stats, truncated_importance_weights
from compilers.update import Row
from wfc.artifact import adapter_state, restore_adapter

# trainer log-probs log(1), log(0.5), log(3) against engine log-probs 0: ratios 1, 0.5, 3; the cap 2 truncates 3.
# Row 2 has one real token (ratio e^1) and one padding slot holding garbage.
TRAINER = torch.tensor([[0.0, math.log(0.5), math.log(3.0)], [1.0, 123.0, 0.0]])
ENGINE = torch.tensor([[0.0, 0.0, 0.0], [0.0, -50.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_weights_table():
    w = truncated_importance_weights(TRAINER, ENGINE, MASK, cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 0.5, 2.0], [2.0, 0.0, 0.0]]))  # e^1 = 2.718 -> 2; padding -> 0
    assert not w.requires_grad


def test_mismatch_table():
    st = mismatch_stats(TRAINER, ENGINE, MASK, cap=2.0)
    deltas = [0.0, math.log(0.5), math.log(3.0), 1.0]
    assert st["tokens"] == 4
    assert st["mean_abs"] == pytest.approx(sum(abs(d) for d in deltas) / 4)
    assert st["max_abs"] == pytest.approx(math.log(3.0))
    assert st["kl"] == pytest.approx(-sum(deltas) / 4)
    assert st["weight_mean"] == pytest.approx((1.0 + 0.5 + 2.0 + 2.0) / 4)
    assert st["truncated_fraction"] == pytest.approx(2 / 4)
    merged = merge_mismatch([st, mismatch_stats(TRAINER[:1], TRAINER[:1], MASK[:1], cap=2.0)])
    assert merged["tokens"] == 7 and merged["max_abs"] == pytest.approx(math.log(3.0))
    assert merged["mean_abs"] == pytest.approx(sum(abs(d) for d in deltas) / 7)
    assert merge_mismatch([])["tokens"] == 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(TRAINER, ENGINE, MASK, cap=0.0)
    with pytest.raises(ValueError, match="shapes"):
        truncated_importance_weights(TRAINER, ENGINE[:, :2], MASK, cap=2.0)


def test_update_weights_the_policy_term_by_the_truncated_ratio(engine):
    """On the tiny model: engine log-probs equal to the trainer's change nothing; engine log-probs log 4 below the
    trainer's give weight min(4, cap 2) = 2 on every token, so (ratio 1, unclipped, loss linear in the weight) the
    SGD step doubles; with the correction off it is the plain step again, and the mismatch is reported either way."""
    from peft import LoraConfig

    from compilers.config import UpdateConfig
    from compilers.packing import packed_logprobs
    from compilers.update import update_adapter

    engine.policy.add_adapter("x", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model = engine.policy.model
    model.set_adapter("x")
    params = [p for n, p in model.named_parameters() if ".x." in n]
    start = adapter_state(model, "x")
    prompt, completion = tuple(range(10, 20)), [30, 31, 32, 33]
    with torch.no_grad():
        trainer = packed_logprobs(model, [(prompt, [completion])], temperature=0.7)[0][0].tolist()

    def delta(engine_lps, **cfg):
        restore_adapter(model, "x", start)
        before = [p.detach().clone() for p in params]
        config = UpdateConfig(max_grad_norm=1e9, **cfg)
        stats = update_adapter(model, torch.optim.SGD(params, lr=1.0), [Row("x", "a", prompt, completion, 1.0, 1.0,
                                                                            engine_lps)], config=config,
                               temperature=0.7)
        return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, params)]), stats

    plain, st_plain = delta(None)
    assert plain.abs().sum() > 0
    same, st_same = delta(trainer)
    assert torch.allclose(same, plain, atol=1e-7) and st_same["logprob_mismatch"]["max_abs"] < 1e-5
    off_policy = [lp - math.log(4.0) for lp in trainer]
    doubled, st = delta(off_policy)
    assert torch.allclose(doubled, 2 * plain, rtol=1e-4, atol=1e-8)
    assert st["logprob_mismatch"]["mean_abs"] == pytest.approx(math.log(4.0), abs=1e-4)
    assert st["logprob_mismatch"]["truncated_fraction"] == 1.0
    unweighted, st_off = delta(off_policy, importance_correction="none")
    assert torch.allclose(unweighted, plain, atol=1e-7)
    assert st_off["logprob_mismatch"]["mean_abs"] == pytest.approx(math.log(4.0), abs=1e-4)
    assert st_plain["logprob_mismatch"]["tokens"] == 4
    restore_adapter(model, "x", start)
