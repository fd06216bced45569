"""The update stage: scored groups -> one optimizer step per adapter on the resident peft model.

Rows: every group member with a completion becomes a training row (adapter, prompt ids, completion ids, advantage).
With ``beta == 0`` a row whose advantage is 0 contributes exactly 0 to the loss, so it is not run through the model,
but it still counts in the aggregation's denominator: skipping it changes the cost, never the gradient.

Packing: rows with identical prompt ids (the voters of one example, the members of a group) are packed into one row
(``compilers.packing``: exact shared-prefix log-probs), micro-batches bounded by ``token_budget``, backward per
micro-batch. The step's loss is the configured aggregation over all of the adapter's rows: each micro-batch's
aggregated loss is rescaled by its share of the step (``compilers.loss.Aggregation.share``: of its tokens for
``token``, of its rows for ``sequence`` and ``constant``).

Config: the update is given its own section (:class:`compilers.config.UpdateConfig`: loss, optimizer, importance
correction), the guards' section where guards act (:func:`update_rows`: role balancing and per-role clips), and the
rollouts' sampling temperature; the variants come from the section as objects (``config.aggregation``,
``config.correction``), so no name is tested here.

Old log-probs are recomputed by the trainer, under the rollouts' sampling temperature: with ``inner_epochs == 1`` they
are the detached current ones (ratio 1); with more epochs, a no-grad pass before the first epoch. Where they differ
from the engine's sampling log-probs (other kernels, bf16), truncated importance weights correct the policy term
(``compilers.offpolicy``; ``importance_correction``), and the mismatch is reported per adapter. The reference for KL is
the same model with the adapter disabled (no second model in memory).

Guards (``compilers.guards``): rows carry a ``weight`` (fan-out scaling, ``1/k``); for an adapter trained by several
roles, role balancing multiplies each role's rows so no role holds more than its capped share of the gradient mass.
Backward runs once per role: each role's gradient contribution (its part of the adapter's loss, under the adapter's
common normalisation, so the parts sum to the whole loss) is measured and, with ``role_clip``, clipped to that role's
``max_grad_norm`` before the roles are summed; the sum is then clipped to the adapter's ``max_grad_norm``. Both norms
are in the stats. Cost: one extra gradient buffer per adapter (LoRA-sized) and no extra forward tokens, except that
rows of different roles with identical prompts are no longer packed together.

Data parallel (``compilers.distributed``): every rank holds all of the step's rows, so the denominators (the
adapter's tokens / rows, the longest completion, role masses and balance weights) are global on every rank. Each
rank runs the forward/backward of its contiguous shard of each role's packs (rows sharing a prompt stay together),
and each role's gradient contribution is summed over the ranks before its norm and clip: the clipped sums, the
final clip and the optimizer step are then identical on every rank. Reported losses, clip fractions and log-prob
mismatch are over all ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from compilers.config import GuardsConfig, UpdateConfig
from compilers.distributed import Distributed, SingleProcess
from compilers.group import Group
from compilers.guards import balance_weights, member_key, role_mass
from compilers.loss import policy_loss
from compilers.offpolicy import merge_mismatch, mismatch_stats
from compilers.packing import ATTENTION_TOKENS, packed_length, packed_logprobs, plan_microbatches, row_cost
from wfc.constrain import GrammarMasks, forced
from wfc.memory import release_freed_memory
from wfc.policy import Policy

# A pack joins a micro-batch only when it is at least this share of the batch's longest pack: the quadratic cost
# merges a step's aggregator rows into packs of a few hundred tokens plus a short remainder, which padded to the
# longest would waste a fifth of the batch (benchmarks/bench_pack_cost.py).
MIN_FILL = 0.75


@dataclass
class Row:
    adapter: str
    role: str
    prompt_ids: tuple[int, ...]
    completion_ids: list[int]
    advantage: float
    weight: float = 1.0
    engine_logprobs: list[float] | None = None  # what the rollout engine reported while sampling (None: unknown)
    choices: list[list[int]] | None = None  # a choice call's every choice as token ids (None: free text)
    grammar: str | None = None  # the grammar the call was decoded under (wfc.constrain); None: unconstrained
    bitmask: torch.Tensor | None = None  # (R, W) the grammar's allowed tokens at each position (attach_masks)
    free: list[bool] | None = None  # per token: the grammar left a choice (False: forced, no weight); None: all free

    @property
    def free_tokens(self) -> int:
        """Completion tokens that carry weight in the loss (forced tokens do not)."""
        return len(self.completion_ids) if self.free is None else sum(self.free)


def rows_from_groups(groups: Sequence[Group], role_adapters: dict[str, str], *,
                     weights: Mapping[tuple, float] | None = None) -> list[Row]:
    """One row per member with a completion. ``weights`` (``compilers.guards.fanout_weights``) keyed by
    ``(example, role, invocation, rollout)``; members absent from it weigh 1."""
    rows = []
    for g in groups:
        if g.advantages is None:
            raise ValueError(f"group ({g.example}, {g.role!r}, {g.invocation}) has no advantages: score it first")
        if g.role not in role_adapters:
            raise ValueError(f"role {g.role!r} has no adapter; known roles: {sorted(role_adapters)}")
        for m, a in zip(g.members, g.advantages):
            if m.call.completion_ids:
                w = (weights or {}).get(member_key(g, m), 1.0)
                known = m.call.logprobs_known and len(m.call.logprobs) == len(m.call.completion_ids)
                lps = list(m.call.logprobs) if known else None
                rows.append(Row(role_adapters[g.role], g.role, tuple(m.call.prompt_ids), list(m.call.completion_ids),
                                float(a), w, lps, m.call.choice_ids, m.call.grammar))
    return rows


def attach_masks(rows: Sequence[Row], masks: GrammarMasks) -> None:
    """Give every row decoded under a grammar its bitmask and forced-token flags, replayed over its completion with
    the engine's own function (``wfc.constrain.GrammarMasks.replay``), so trainer and engine mask alike."""
    for r in rows:
        if r.grammar is not None and r.bitmask is None:
            r.bitmask = masks.replay(r.grammar, r.completion_ids)
            r.free = (~forced(r.bitmask)).tolist()


def adapter_parameters(model, adapter: str) -> list[torch.nn.Parameter]:
    """The LoRA parameters of ``adapter``: peft names them ``...lora_A.<adapter>.weight``, so the name segment right
    after a ``lora_*`` segment must be the adapter (a plain substring test would also match an adapter named like a
    module, e.g. ``mlp``)."""
    params = []
    for n, p in model.named_parameters():
        parts = n.split(".")
        if any(a.startswith("lora_") and b == adapter for a, b in zip(parts, parts[1:])):
            params.append(p)
    if not params:
        raise ValueError(f"no LoRA parameters for adapter {adapter!r}")
    return params


class AdapterOptimizers:
    """One AdamW state per adapter: an adapter's update never touches another's moments or learning rate."""

    def __init__(self, model, adapters: Sequence[str], *, lr: float | dict[str, float]):
        """``model``: a :class:`wfc.policy.Policy` (or its peft model)."""
        model = model.model if isinstance(model, Policy) else model
        self.optimizers = {}
        for a in adapters:
            rate = lr[a] if isinstance(lr, dict) else lr
            self.optimizers[a] = torch.optim.AdamW(adapter_parameters(model, a), lr=rate, weight_decay=0.0)
            # the rate before any schedule: kept in the param group so the optimizer's state_dict (a checkpoint)
            # carries it, cliff rollbacks included
            for group in self.optimizers[a].param_groups:
                group["base_lr"] = rate

    def lr(self, adapter: str) -> float:
        return self.optimizers[adapter].param_groups[0]["lr"]

    def base_lr(self, adapter: str) -> float:
        group = self.optimizers[adapter].param_groups[0]
        return group.get("base_lr", group["lr"])  # a checkpoint from before schedules: its rate is the base

    def scale_lr(self, adapter: str, factor: float) -> None:
        """Scale the base rate (and the current one) by ``factor``: a cliff rollback's lasting cut."""
        for group in self.optimizers[adapter].param_groups:
            group["base_lr"] = group.get("base_lr", group["lr"]) * factor
            group["lr"] *= factor

    def apply_schedule(self, multiplier: float) -> None:
        """Set every adapter's rate to its base rate x ``multiplier`` (compilers.schedule)."""
        for opt in self.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = group.get("base_lr", group["lr"]) * multiplier


def _pad(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(t.shape[0] for t in tensors)
    device = tensors[0].device  # the policy's device: the loss is computed where the log-probs are
    out = torch.zeros(len(tensors), width, dtype=tensors[0].dtype, device=device)
    mask = torch.zeros(len(tensors), width, dtype=torch.bool, device=device)
    for i, t in enumerate(tensors):
        out[i, : t.shape[0]] = t
        mask[i, : t.shape[0]] = True
    return out, mask


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _packs(rows: list[Row], *, min_shared: int = 16,
           attention_tokens: float | None = ATTENTION_TOKENS) -> list[tuple[tuple[int, ...], list[int]]]:
    """Rows -> packs ``(shared prefix ids, row indices)``.

    Rows with equal prompts share a pack (a GRPO group's members, a fan-out role's calls). Rows whose prompts differ
    only after a long common prefix share the pack of that prefix too: an aggregator's prompts within one example
    differ only in the candidates, so its rows would otherwise each pay the whole ~100-token question and system
    turn. Each row then keeps its own prompt *tail* (the tokens after the prefix) in front of its completion; the
    packed mask lets a segment see the prefix and its own past only, so its completion's log-probs are exactly those
    of its own full prompt (:func:`_completion_logprobs` drops the tail's positions). Prompts merge when they share
    at least ``min_shared`` tokens and the merged row costs less than the rows apart, a row of ``T`` tokens costing
    :func:`compilers.packing.row_cost` ``T + T^2 / attention_tokens`` (``None``: ``T``). The quadratic term stops a
    step's aggregator rows, which all share the system turn, from merging into one row of thousands of tokens that
    runs slower than the rows apart. Deterministic: packs follow the sorted order of the prompts."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(r.prompt_ids, []).append(i)

    def cost(prefix_len: int, idx: list[int]) -> float:  # of one pack's row
        tokens = prefix_len + sum(len(rows[i].prompt_ids) - prefix_len + len(rows[i].completion_ids) for i in idx)
        return row_cost(tokens, attention_tokens)

    packs: list[tuple[tuple[int, ...], list[int]]] = []
    for prompt in sorted(by_prompt):  # prompts with a common prefix sort next to each other
        idx = by_prompt[prompt]
        if packs:
            prefix, members = packs[-1]
            n = _common_prefix(prefix, prompt)
            if n >= min_shared and cost(n, members + idx) < cost(len(prefix), members) + cost(len(prompt), idx):
                packs[-1] = (prefix[:n], members + idx)
                continue
        packs.append((prompt, list(idx)))
    return packs


def _tail(row: Row, prefix: Sequence[int]) -> list[int]:
    """The prompt tokens of ``row`` after its pack's shared prefix (empty when the prompt is the prefix)."""
    return list(row.prompt_ids[len(prefix):])


def _alternatives(row: Row) -> list[list[int]]:
    """The choices a choice row did not draw (scored beside it for the normaliser); [] for a free-text row."""
    if not row.choices:
        return []
    if row.completion_ids not in row.choices:
        raise ValueError(f"a choice row of role {row.role!r} completed with {row.completion_ids}, which is none of its "
                         f"choices {row.choices}: the engine that sampled it broke the choice contract")
    return [c for c in row.choices if c != row.completion_ids]


def _completion_logprobs(part: "_Part", g: int, lps: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pack ``g``'s log-probs per row with the prompt tail's positions dropped: the completion's own log-probs.

    A choice row's (``Row.choices``) are among its choices: the log of all choices' total probability (its own and
    its alternatives', which the pack scores after it, see :func:`_part`) comes off its first token, so the row sums
    to log q(c) = log p(c) - log sum_c' p(c'), the distribution the engine drew it from (``wfc.engines.base``), and
    the gradient flows through every choice. Entropy columns (``(n, 2)`` tensors) are left as they are."""
    prefix, idx = part.packs[g]
    out = []
    for j, i in enumerate(idx):
        tail = len(part.rows[i].prompt_ids) - len(prefix)
        own = lps[j][tail:]
        start, count = part.alts[g][j]
        if count:
            scores = [_logprob_column(own).sum()]
            scores += [_logprob_column(lps[k][tail:]).sum() for k in range(start, start + count)]
            shift = torch.zeros_like(own)
            shift.view(own.shape[0], -1)[0, 0] = torch.logsumexp(torch.stack(scores), 0)
            own = own - shift
        out.append(own)
    return out


def _logprob_column(t: torch.Tensor) -> torch.Tensor:
    """The log-probs of a per-token tensor: ``t`` itself, or column 0 of an ``(n, 2)`` (log-prob, entropy) one."""
    return t[:, 0] if t.dim() == 2 else t


@dataclass
class _Part:
    """The rows of one role within one adapter's step, packed and planned into micro-batches."""

    rows: list[Row]
    packs: list[tuple[tuple[int, ...], list[int]]]
    groups: list[tuple[list[int], list[list[int]]]]
    plan: list[list[int]]
    old: dict[int, list[torch.Tensor]]
    alts: list[list[tuple[int, int]]]  # per pack, per row: (first, count) of its alternatives among the completions
    masks: list[list[tuple[int, torch.Tensor] | None]]  # per pack, per completion: (tail length, bitmask) or None


def _part(rows: list[Row], token_budget: int, distributed: Distributed) -> _Part:
    """``rows``' packs (this rank's contiguous shard of them), their packed groups and micro-batch plan. A pack's
    completions are its rows' (prompt tail + completion), then each choice row's alternatives after the same tail,
    scored for nothing but that row's normaliser (:func:`_completion_logprobs`)."""
    packs = distributed.shard(_packs(rows))
    groups, alts, masks = [], [], []
    for p, idx in packs:
        completions = [_tail(rows[i], p) + rows[i].completion_ids for i in idx]
        masked = [(len(_tail(rows[i], p)), rows[i].bitmask) if rows[i].bitmask is not None else None for i in idx]
        placed = []
        for i in idx:
            others = _alternatives(rows[i])
            placed.append((len(completions), len(others)))
            completions += [_tail(rows[i], p) + c for c in others]
            masked += [None] * len(others)
        groups.append((list(p), completions))
        alts.append(placed)
        masks.append(masked)
    plan = plan_microbatches([packed_length(g) for g in groups], token_budget, min_fill=MIN_FILL)
    return _Part(rows, packs, groups, plan, {}, alts, masks)


@dataclass(frozen=True)
class _Whole:
    """An adapter's whole step, of which each micro-batch's loss is a share (global over the ranks): its free
    completion tokens (at least 1: every token forced means no loss, and no 0 / 0), its rows, and its longest
    completion (the ``constant`` aggregation's budget)."""

    tokens: int
    rows: int
    max_tokens: int

    @classmethod
    def of(cls, rows: Sequence[Row]) -> _Whole:
        return cls(tokens=max(sum(r.free_tokens for r in rows), 1), rows=len(rows),
                   max_tokens=max(len(r.completion_ids) for r in rows))


@dataclass(frozen=True)
class _Batch:
    """One micro-batch's rows, padded to (B, T)."""

    logprobs: torch.Tensor  # (B, T) under the policy being trained (carries grad)
    mask: torch.Tensor  # (B, T) bool: completion tokens that carry weight (forced ones, wfc.constrain, do not)
    old: torch.Tensor  # (B, T) the trainer's old log-probs
    engine: torch.Tensor  # (B, T) the engine's sampling log-probs (the old ones where the engine reported none)
    advantages: torch.Tensor  # (B,)
    weights: torch.Tensor  # (B,) each row's own weight times its role's balance weight
    entropy: torch.Tensor | None  # (B, T) next-token entropy (carries grad), for the entropy bonus

    @property
    def rows(self) -> int:
        return self.logprobs.shape[0]


def _batch(part: _Part, mb: list[int], lps: list[list[torch.Tensor]], weight: Callable[[Row], float], *,
           entropy: bool) -> _Batch:
    """Micro-batch ``mb`` of ``part`` from its packs' log-probs ``lps`` (``(n, 2)`` with entropy when ``entropy``)."""
    flat, flat_old, flat_engine, adv, weights, flat_ent, flat_free = [], [], [], [], [], [], []
    for g, group_lps in zip(mb, lps):
        for j, (i, t) in enumerate(zip(part.packs[g][1], _completion_logprobs(part, g, group_lps))):
            row = part.rows[i]
            if entropy:  # (n, 2): log-prob, entropy
                t, h = t[:, 0], t[:, 1]
                flat_ent.append(h)
            flat.append(t)
            old_t = part.old[g][j] if part.old else t.detach()
            flat_old.append(old_t)
            # unknown engine log-probs: weight 1 (engine == trainer), and the row adds no mismatch
            flat_engine.append(torch.tensor(row.engine_logprobs, dtype=old_t.dtype, device=old_t.device)
                               if row.engine_logprobs is not None else old_t.detach())
            adv.append(row.advantage)
            weights.append(weight(row))
            flat_free.append(torch.tensor(row.free if row.free is not None else [True] * t.shape[0], device=t.device))
    logprobs, mask = _pad(flat)
    return _Batch(logprobs, mask & _pad(flat_free)[0], _pad(flat_old)[0], _pad(flat_engine)[0],
                  torch.tensor(adv, device=logprobs.device), torch.tensor(weights, device=logprobs.device),
                  _pad(flat_ent)[0] if flat_ent else None)


def _reference(model, part: _Part, mb: list[int], temperature: float) -> torch.Tensor:
    """(B, T) log-probs of micro-batch ``mb``'s rows under the reference: the base model, with the adapter off."""
    with torch.no_grad(), model.disable_adapter():
        lps = packed_logprobs(model, [part.groups[g] for g in mb], token_budget=1 << 30, temperature=temperature,
                              masks=[part.masks[g] for g in mb])
    return _pad([t for g, group in zip(mb, lps) for t in _completion_logprobs(part, g, group)])[0]


def _backward(model, part: _Part, *, config: UpdateConfig, temperature: float, weight: Callable[[Row], float],
              whole: _Whole, mismatch: list[dict[str, float]] | None = None,
              entropy_coef: float = 0.0) -> tuple[float, list[float]]:
    """Backward of one role's part of the adapter's loss (grads accumulate). Returns (loss part, clip fractions).

    Log-probs are under the rollouts' sampling ``temperature``, like the engine's. Rows whose engine log-probs are
    known get the config's importance correction; the engine/trainer mismatch of each micro-batch is appended to
    ``mismatch``. ``entropy_coef > 0`` adds the entropy bonus (``compilers.loss``) at that coefficient. Each
    micro-batch's loss counts by the aggregation's share of the whole step, so the parts of all roles sum to it."""
    loss_sum, clip_fracs = 0.0, []
    aggregation, correction = config.aggregation, config.correction
    for mb in part.plan:
        lps = packed_logprobs(model, [part.groups[g] for g in mb], token_budget=1 << 30, temperature=temperature,
                              entropy=entropy_coef > 0, masks=[part.masks[g] for g in mb])
        b = _batch(part, mb, lps, weight, entropy=entropy_coef > 0)
        if mismatch is not None:
            mismatch.append(mismatch_stats(b.old, b.engine, b.mask, cap=config.tis_cap))
        iw = correction.weights(b.old, b.engine, b.mask, cap=config.tis_cap)
        ref = _reference(model, part, mb, temperature) if config.beta > 0 else None
        loss, st = policy_loss(b.logprobs, b.old, b.advantages, b.mask, aggregation=aggregation,
                               clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high, ref_logprobs=ref,
                               beta=config.beta, importance_weights=iw, weights=b.weights,
                               max_tokens=whole.max_tokens, entropy=b.entropy, entropy_coef=entropy_coef)
        share = aggregation.share(tokens=int(b.mask.sum()), rows=b.rows, total_tokens=whole.tokens,
                                  total_rows=whole.rows)
        (loss * share).backward()
        loss_sum += float(loss.detach()) * share
        clip_fracs.append(st.get("clip_fraction", 0.0))
    return loss_sum, clip_fracs


def _adapter_stats(rows: list[Row], live: list[Row]) -> dict[str, Any]:
    """An adapter's stats before its backward: its rows and trained (``live``) rows, in all and per role."""
    stats: dict[str, Any] = {"rows": len(rows), "trained_rows": len(live), "loss": 0.0, "grad_norm": 0.0,
                             "clip_fraction": 0.0, "logprob_mismatch": merge_mismatch([]), "roles": {}}
    for r in rows:
        role = stats["roles"].setdefault(r.role, {"rows": 0, "trained_rows": 0, "grad_norm": 0.0, "clipped": False})
        role["rows"] += 1
    for r in live:
        stats["roles"][r.role]["trained_rows"] += 1
    return stats


def _role_parts(model, live: list[Row], *, config: UpdateConfig, temperature: float,
                distributed: Distributed) -> dict[str, _Part]:
    """The trained rows per role, packed and planned; with ``inner_epochs > 1`` their old log-probs too, from a
    no-grad pass before the first epoch (with one epoch they are the detached current ones)."""
    by_role: dict[str, list[Row]] = {}
    for r in live:
        by_role.setdefault(r.role, []).append(r)
    parts = {role: _part(rs, config.token_budget, distributed) for role, rs in by_role.items()}
    if config.inner_epochs > 1:
        with torch.no_grad():
            for part in parts.values():
                for mb in part.plan:
                    for g, lps in zip(mb, packed_logprobs(model, [part.groups[g] for g in mb], token_budget=1 << 30,
                                                          temperature=temperature,
                                                          masks=[part.masks[g] for g in mb])):
                        part.old[g] = [t.detach() for t in _completion_logprobs(part, g, lps)]
    return parts


def _over_ranks(params: list[torch.nn.Parameter], loss: float, fracs: list[float],
                distributed: Distributed) -> tuple[float, list[float]]:
    """One role's gradient contribution summed over the ranks before its norm and clip; its loss part summed and
    its clip fractions gathered."""
    if distributed.world <= 1:
        return loss, fracs
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    distributed.all_reduce_([p.grad for p in params])
    return distributed.sum(loss), distributed.gather(fracs)


def _step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], summed: list[torch.Tensor | None],
          max_norm: float) -> float:
    """The summed role contributions as the gradient, clipped to ``max_norm``, then one optimizer step (none on a
    non-finite norm). Returns the norm before the clip."""
    for p, g in zip(params, summed):
        p.grad = g
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def update_adapter(model, optimizer: torch.optim.Optimizer, rows: list[Row], *, config: UpdateConfig,
                   temperature: float, max_grad_norm: float | None = None,
                   role_max_grad_norm: Mapping[str, float] | None = None, row_weights: dict[str, float] | None = None,
                   distributed: Distributed | None = None,
                   entropy_coefs: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One optimizer step of one adapter (already active and trainable) on its rows, log-probs under the rollouts'
    sampling ``temperature``. Returns diagnostics.

    ``row_weights``: role -> multiplier on top of each row's own weight (role balancing). ``role_max_grad_norm``:
    role -> clip of that role's gradient contribution (roles absent: not clipped alone). ``max_grad_norm``: clip of
    the summed gradient (default ``config.max_grad_norm``). ``entropy_coefs``: role -> entropy-bonus coefficient
    (``compilers.guards.entropy_bonus``); a role with one > 0 trains on all its rows, flat groups' included, since
    the bonus has a gradient where the advantage is 0. Stats: ``rows``, ``trained_rows``, ``loss``,
    ``grad_norm`` (summed, before the final clip), ``clip_fraction``, and ``roles``: role -> ``grad_norm`` (its own
    contribution, before its clip, last epoch), ``clipped`` (its clip was active), ``rows``, ``trained_rows``;
    ``logprob_mismatch``: engine vs trainer log-probs of the trained rows (``compilers.offpolicy.mismatch_stats``).
    ``distributed``: the ranks sharing the backward (see the module docstring); every rank passes all ``rows``.
    """
    distributed = distributed or SingleProcess()
    coefs = entropy_coefs or {}
    live = [r for r in rows if r.advantage != 0.0 or config.beta > 0 or coefs.get(r.role, 0.0) > 0]
    stats = _adapter_stats(rows, live)
    if not live:
        return stats
    whole = _Whole.of(rows)
    parts = _role_parts(model, live, config=config, temperature=temperature, distributed=distributed)

    def weight(r: Row) -> float:
        return r.weight * (row_weights or {}).get(r.role, 1.0)

    params = [p for group in optimizer.param_groups for p in group["params"]]
    limits = role_max_grad_norm or {}
    clip_fracs, losses, norm, mismatch = [], [], 0.0, []
    for epoch in range(config.inner_epochs):
        summed: list[torch.Tensor | None] = [None] * len(params)
        for role, part in parts.items():  # each role's contribution, clipped alone, then summed
            optimizer.zero_grad(set_to_none=True)
            loss, fracs = _backward(model, part, config=config, temperature=temperature, weight=weight, whole=whole,
                                    mismatch=mismatch if epoch == 0 else None, entropy_coef=coefs.get(role, 0.0))
            loss, fracs = _over_ranks(params, loss, fracs, distributed)
            losses.append(loss)
            clip_fracs += fracs
            limit = limits.get(role, math.inf)
            role_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
            stats["roles"][role].update(grad_norm=role_norm, clipped=bool(role_norm > limit))
            for k, p in enumerate(params):
                if p.grad is not None:
                    summed[k] = p.grad if summed[k] is None else summed[k] + p.grad
        norm = _step(optimizer, params, summed, max_grad_norm or config.max_grad_norm)
    stats.update(loss=sum(losses) / config.inner_epochs, grad_norm=norm,
                 clip_fraction=sum(clip_fracs) / max(len(clip_fracs), 1),
                 logprob_mismatch=merge_mismatch(distributed.gather(mismatch)))
    return stats


def update(policy, optimizers: AdapterOptimizers, groups: Sequence[Group], role_adapters: dict[str, str], *,
           config: UpdateConfig, guards: GuardsConfig, temperature: float,
           weights: Mapping[tuple, float] | None = None, distributed: Distributed | None = None,
           entropy_coefs: Mapping[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """One step for every adapter in play on the groups' rows (:func:`rows_from_groups`; ``weights``: fan-out row
    weights, ``compilers.guards.fanout_weights``): :func:`update_rows`."""
    return update_rows(policy, optimizers, rows_from_groups(groups, role_adapters, weights=weights), config=config,
                       guards=guards, temperature=temperature, distributed=distributed, entropy_coefs=entropy_coefs)


def update_rows(policy, optimizers: AdapterOptimizers, rows: list[Row], *, config: UpdateConfig,
                guards: GuardsConfig, temperature: float, distributed: Distributed | None = None,
                entropy_coefs: Mapping[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """One step for every adapter in play; each adapter trains only on its own rows, with its own optimizer, its
    log-probs under the rollouts' sampling ``temperature``.

    Guards: with ``guards.role_balance``, adapters with rows of several roles are balanced
    (``compilers.guards.balance_weights``, each role's mass counted in the aggregation's unit); with
    ``guards.role_clip``, each role's contribution is clipped at ``guards.role_max_grad_norm.get(role,
    config.max_grad_norm)``.
    Per adapter, the stats add ``roles``: role -> ``mass_share`` (share of the adapter's gradient mass after all
    weights), ``mass_share_raw`` (before role balancing), ``balance_weight``, and the per-role gradient stats.
    Runs under ``policy.training()`` (its lock: no colocated generation sees a half-updated adapter; bf16 autocast
    on CUDA), and bumps the policy's revision of every adapter the optimizer stepped: hand those to the engine.
    ``distributed``: the ranks sharing the backward; every rank passes the same (whole step's) ``rows``.
    ``entropy_coefs``: role -> entropy-bonus coefficient (see :func:`update_adapter`).
    """
    if any(r.grammar is not None for r in rows):
        attach_masks(rows, policy.grammar_masks)
    out = {}
    with policy.training() as model:
        for adapter, optimizer in optimizers.optimizers.items():
            mine = [r for r in rows if r.adapter == adapter]
            mass = role_mass(mine, unit=config.aggregation.unit, beta=config.beta)
            balance = (balance_weights(mass, cap=guards.role_share_cap)
                       if guards.role_balance and sum(m > 0 for m in mass.values()) > 1 else {r: 1.0 for r in mass})
            limits = ({role: guards.role_max_grad_norm.get(role, config.max_grad_norm) for role in mass}
                      if guards.role_clip else {})
            model.set_adapter(adapter)  # only this adapter is active and trainable
            st = update_adapter(model, optimizer, mine, config=config, temperature=temperature,
                                role_max_grad_norm=limits, row_weights=balance, distributed=distributed,
                                entropy_coefs=entropy_coefs)
            total, raw_total = sum(mass[r] * balance[r] for r in mass), sum(mass.values())
            for role in mass:
                st["roles"].setdefault(role, {}).update(
                    mass_share=mass[role] * balance[role] / total if total else 0.0,
                    mass_share_raw=mass[role] / raw_total if raw_total else 0.0,
                    balance_weight=balance[role])
            out[adapter] = st
            if st["trained_rows"]:
                policy.mark_changed(adapter)
    release_freed_memory()  # the step's activations are freed: give their pages back (wfc.memory)
    return out


def completion_nll(policy, rows: list[Row], *, config: UpdateConfig, temperature: float) -> list[tuple[float, int]]:
    """Per row, in order: (the summed negative log-likelihood of its completion's free tokens, their count) under
    its adapter, at the rollouts' sampling ``temperature`` as the update computes log-probs (packed in
    ``config.token_budget``, grammar-masked; a choice row's among its choices). No gradient; every rank computes
    all rows."""
    if any(r.grammar is not None for r in rows):
        attach_masks(rows, policy.grammar_masks)
    out: list[tuple[float, int]] = [(0.0, 0)] * len(rows)
    with torch.no_grad(), policy.training() as model:
        for adapter in dict.fromkeys(r.adapter for r in rows):
            index = [i for i, r in enumerate(rows) if r.adapter == adapter]
            part = _part([rows[i] for i in index], config.token_budget, SingleProcess())
            model.set_adapter(adapter)
            for mb in part.plan:
                lps = packed_logprobs(model, [part.groups[g] for g in mb], token_budget=1 << 30,
                                      temperature=temperature, masks=[part.masks[g] for g in mb])
                for g, group_lps in zip(mb, lps):
                    for j, t in zip(part.packs[g][1], _completion_logprobs(part, g, group_lps)):
                        row = part.rows[j]
                        free = torch.tensor(row.free if row.free is not None else [True] * t.shape[0],
                                            device=t.device)
                        out[index[j]] = (float(-t.float()[free].sum()), int(free.sum()))
    return out
