"""The update stage: scored groups -> one optimizer step per adapter on the resident peft model.

Rows: every group member with a completion becomes a training row (adapter, prompt ids, completion ids, advantage).
With ``beta == 0`` a row whose advantage is 0 contributes exactly 0 to the loss, so it is not run through the model,
but it still counts in the aggregation's denominator: skipping it changes the cost, never the gradient.

Packing: rows with identical prompt ids (the voters of one example, the members of a group) are packed into one row
(``compilers.packing``: exact shared-prefix log-probs), micro-batches bounded by ``token_budget``, backward per
micro-batch. The step's loss is the configured aggregation over all of the adapter's rows: each micro-batch's
aggregated loss is rescaled by its share of the step's tokens (``token``) or rows (``sequence``, ``constant``).

Old log-probs are recomputed by the trainer (no engine/trainer numerics mismatch): with ``inner_epochs == 1`` they are
the detached current ones (ratio 1); with more epochs, a no-grad pass before the first epoch. The reference for KL is
the same model with the adapter disabled (no second model in memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from compilers.group import Group
from compilers.loss import policy_loss
from compilers.packing import packed_length, packed_logprobs, plan_microbatches


@dataclass
class Row:
    adapter: str
    role: str
    prompt_ids: tuple[int, ...]
    completion_ids: list[int]
    advantage: float
    weight: float = 1.0


def rows_from_groups(groups: Sequence[Group], role_adapters: dict[str, str]) -> list[Row]:
    rows = []
    for g in groups:
        if g.advantages is None:
            raise ValueError(f"group ({g.example}, {g.role!r}, {g.invocation}) has no advantages: score it first")
        if g.role not in role_adapters:
            raise ValueError(f"role {g.role!r} has no adapter; known roles: {sorted(role_adapters)}")
        for m, a in zip(g.members, g.advantages):
            if m.call.completion_ids:
                rows.append(Row(role_adapters[g.role], g.role, tuple(m.call.prompt_ids), list(m.call.completion_ids),
                                float(a)))
    return rows


def adapter_parameters(model, adapter: str) -> list[torch.nn.Parameter]:
    """The LoRA parameters of ``adapter`` (peft names them ``...lora_A.<adapter>.weight``)."""
    params = [p for n, p in model.named_parameters() if "lora_" in n and f".{adapter}." in n]
    if not params:
        raise ValueError(f"no LoRA parameters for adapter {adapter!r}")
    return params


class AdapterOptimizers:
    """One AdamW state per adapter: an adapter's update never touches another's moments."""

    def __init__(self, model, adapters: Sequence[str], *, lr: float | dict[str, float]):
        self.optimizers = {}
        for a in adapters:
            rate = lr[a] if isinstance(lr, dict) else lr
            self.optimizers[a] = torch.optim.AdamW(adapter_parameters(model, a), lr=rate, weight_decay=0.0)

    def scale_lr(self, adapter: str, factor: float) -> None:
        for group in self.optimizers[adapter].param_groups:
            group["lr"] *= factor


def _pad(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(t.shape[0] for t in tensors)
    out = torch.zeros(len(tensors), width, dtype=tensors[0].dtype)
    mask = torch.zeros(len(tensors), width, dtype=torch.bool)
    for i, t in enumerate(tensors):
        out[i, : t.shape[0]] = t
        mask[i, : t.shape[0]] = True
    return out, mask


def _packs(rows: list[Row]) -> list[tuple[tuple[int, ...], list[int]]]:
    """Rows sharing prompt ids -> (prompt ids, row indices)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(r.prompt_ids, []).append(i)
    return list(by_prompt.items())


def update_adapter(model, optimizer: torch.optim.Optimizer, rows: list[Row], *, config,
                   max_grad_norm: float | None = None, row_weights: dict[str, float] | None = None) -> dict[str, Any]:
    """One optimizer step of one adapter (already active and trainable) on its rows. Returns diagnostics."""
    stats: dict[str, Any] = {"rows": len(rows), "trained_rows": 0, "loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0}
    if not rows:
        return stats
    total_tokens = sum(len(r.completion_ids) for r in rows)
    total_rows = len(rows)
    max_tokens = max(len(r.completion_ids) for r in rows)
    live = [r for r in rows if r.advantage != 0.0] if config.beta == 0 else list(rows)
    stats["trained_rows"] = len(live)
    if not live:
        return stats
    packs = _packs(live)
    groups = [(list(p), [live[i].completion_ids for i in idx]) for p, idx in packs]
    plan = plan_microbatches([packed_length(g) for g in groups], config.token_budget)
    old: dict[int, list[torch.Tensor]] = {}
    if config.inner_epochs > 1:
        with torch.no_grad():
            for mb in plan:
                for g, lps in zip(mb, packed_logprobs(model, [groups[g] for g in mb], token_budget=1 << 30)):
                    old[g] = [t.detach() for t in lps]
    clip_fracs, losses, norm = [], [], 0.0
    for _ in range(config.inner_epochs):
        optimizer.zero_grad(set_to_none=True)
        for mb in plan:
            mb_groups = [groups[g] for g in mb]
            lps = packed_logprobs(model, mb_groups, token_budget=1 << 30)
            flat, flat_old, adv, weights = [], [], [], []
            for g, group_lps in zip(mb, lps):
                for j, (i, t) in enumerate(zip(packs[g][1], group_lps)):
                    flat.append(t)
                    flat_old.append(old[g][j] if old else t.detach())
                    adv.append(live[i].advantage)
                    weights.append(live[i].weight * (row_weights or {}).get(live[i].role, 1.0))
            logprobs, mask = _pad(flat)
            old_lp, _ = _pad(flat_old)
            ref = None
            if config.beta > 0:
                with torch.no_grad(), model.disable_adapter():
                    ref_lps = packed_logprobs(model, mb_groups, token_budget=1 << 30)
                ref, _ = _pad([t for group in ref_lps for t in group])
            loss, st = policy_loss(
                logprobs, old_lp, torch.tensor(adv), mask, aggregation=config.loss_aggregation,
                clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high, ref_logprobs=ref, beta=config.beta,
                weights=torch.tensor(weights), max_tokens=max_tokens if config.loss_aggregation == "constant" else None,
            )
            share = (int(mask.sum()) / total_tokens) if config.loss_aggregation == "token" else (len(flat) / total_rows)
            (loss * share).backward()
            losses.append(float(loss.detach()) * share)
            clip_fracs.append(st.get("clip_fraction", 0.0))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm or config.max_grad_norm))
        if math.isfinite(norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    stats.update(loss=sum(losses) / config.inner_epochs, grad_norm=norm,
                 clip_fraction=sum(clip_fracs) / max(len(clip_fracs), 1))
    return stats


def update(engine, optimizers: AdapterOptimizers, groups: Sequence[Group], role_adapters: dict[str, str], *,
           config) -> dict[str, dict[str, Any]]:
    """One step for every adapter in play. Holds the engine lock: no generation sees a half-updated adapter."""
    rows = rows_from_groups(groups, role_adapters)
    out = {}
    with engine.lock:
        model = engine.model
        for adapter, optimizer in optimizers.optimizers.items():
            mine = [r for r in rows if r.adapter == adapter]
            model.set_adapter(adapter)  # only this adapter is active and trainable
            out[adapter] = update_adapter(model, optimizer, mine, config=config)
        model.eval()
    return out
