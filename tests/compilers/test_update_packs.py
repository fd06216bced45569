"""Packs of rows whose prompts share a long prefix (an aggregator's prompts within one example) train exactly as
the rows apart: same loss, same LoRA update (fp32, tiny model)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from peft import LoraConfig, get_peft_model

import compilers.update as update_mod
from compilers.config import UpdateConfig
from compilers.packing import row_cost
from compilers.update import Row, _packs, update_adapter


def _rows() -> list[Row]:
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(5, 4000, (n,), generator=g).tolist()  # noqa: E731
    prefix = ids(40)  # system turn + question: the same in every aggregator prompt of the example
    tails = [ids(4), ids(6), ids(3)]  # the candidates differ
    other = tuple(ids(20))  # a voter's prompt: nothing in common with the aggregator's
    rows = [Row("a", "aggregator", tuple(prefix + t), ids(5), adv) for t, adv in zip(tails, (1.0, -0.5, 0.25))]
    rows.append(Row("a", "aggregator", rows[0].prompt_ids, ids(2), -0.75))  # the same prompt twice
    rows += [Row("a", "aggregator", other, ids(4), 0.5), Row("a", "aggregator", other, ids(3), -0.5)]
    return rows


def test_prompts_with_a_long_common_prefix_share_a_pack():
    rows = _rows()
    packs = _packs(rows)
    assert sorted(len(idx) for _, idx in packs) == [2, 4]
    shared = next(p for p, idx in packs if len(idx) == 4)
    assert shared == rows[0].prompt_ids[:40] and sorted(next(i for p, i in packs if p == shared)) == [0, 1, 2, 3]
    assert _packs(rows, min_shared=10**9) == [(p, i) for p, i in sorted(
        {r.prompt_ids: [j for j, s in enumerate(rows) if s.prompt_ids == r.prompt_ids] for r in rows}.items())]


# Hand-worked: a 20-token prefix, three prompts with 10-token tails, one 10-token completion each. Apart a row is
# 40 tokens; two merged 20 + 2 * 20 = 60; three 80. With cost T + T^2 / K: two merge iff 60 + 3600/K < 2(40 + 1600/K),
# i.e. K > 20; the third joins iff 80 + 6400/K < (60 + 3600/K) + (40 + 1600/K), i.e. K > 60.
@pytest.mark.parametrize("attention_tokens, sizes", [(None, [3]), (100, [3]), (40, [2, 1]), (10, [1, 1, 1])])
def test_merging_stops_where_attention_costs_more_than_the_prefix_saves(attention_tokens, sizes):
    prefix = tuple(range(1000, 1020))
    rows = [Row("a", "aggregator", prefix + tuple(range(k * 100, k * 100 + 10)), list(range(10)), 1.0)
            for k in range(3)]
    packs = _packs(rows, attention_tokens=attention_tokens)
    assert [len(idx) for _, idx in packs] == sizes
    assert sorted(i for _, idx in packs for i in idx) == [0, 1, 2]
    assert all(p == (prefix if len(idx) > 1 else rows[idx[0]].prompt_ids) for p, idx in packs)


def test_row_cost_table():
    assert row_cost(40, None) == 40
    assert row_cost(40, 40) == 80  # 40 + 1600 / 40
    assert row_cost(1600, 1600) == 3200  # attention costs as much as the rest at ATTENTION_TOKENS
    assert row_cost(0) == 0
    with pytest.raises(ValueError, match="attention_tokens"):
        row_cost(10, 0)
    with pytest.raises(ValueError, match="tokens >= 0"):
        row_cost(-1)


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_a_shared_prefix_pack_trains_exactly_as_the_rows_apart(tiny_handle, monkeypatch, aggregation):
    model = get_peft_model(copy.deepcopy(tiny_handle.model),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    start = [p.detach().clone() for p in params]
    config = UpdateConfig(max_grad_norm=1e9, loss_aggregation=aggregation)

    def delta() -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        stats = update_adapter(model, torch.optim.SGD(params, lr=1.0), _rows(), config=config, temperature=0.7)
        return torch.cat([(s - p.detach()).flatten() for s, p in zip(start, params)]), stats["loss"]

    shared, loss_shared = delta()
    monkeypatch.setattr(update_mod, "_packs", functools.partial(_packs, min_shared=10**9))
    apart, loss_apart = delta()
    assert apart.abs().sum() > 0
    assert loss_shared == pytest.approx(loss_apart, abs=1e-6)
    assert torch.allclose(shared, apart, atol=1e-6), (shared - apart).abs().max()
