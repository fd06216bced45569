"""Exact shared-prefix log-probs for GRPO groups (the "update" stage's forward pass).

Data model: a *group* is ``(prompt_ids, completions)``: one prompt (``P >= 1`` token ids) and ``N >= 1`` completions
(lists of token ids, lengths ``R_i >= 0`` that may differ). For every completion we want the per-token log-probs
``log p(c_t | prompt, c_<t)`` as a 1-D tensor of length ``R_i``; both entry points return
``list[list[Tensor]]`` in the order of the input (group, then completion), with the autograd graph attached when
grad is enabled.

- :func:`naive_logprobs` runs one right-padded row ``prompt + completion`` per completion (``N * (P + R)`` tokens):
  the reference.
- :func:`packed_logprobs` runs one row per group, ``prompt, c_0, c_1, ..., c_{N-1}`` (``P + sum R_i`` tokens), with
  a 4-D additive float mask and ``position_ids`` restarting at ``P`` for each completion. Invariant: a completion
  token attends to the whole prompt and to its own completion's causal past, nothing else, and sees the same
  positions as in its naive row, so the result equals the naive one up to float rounding (about 1e-6 in fp32).
  Token saving per group: :func:`rho` ``= N(P+R) / (P+NR)``.

Both compute the LM head only at the positions that predict a completion token (the last prompt token predicts
``c_0``; ``c_{t-1}`` predicts ``c_t``), on the hidden states gathered there, instead of a full-vocabulary
``log_softmax`` over all ``T`` positions. That path is used for model families whose head is a plain linear layer
(:data:`PLAIN_HEAD_MODEL_TYPES`); others fall back to full logits gathered afterwards.

The functions call exactly the model they are given: for a PEFT model the LoRA layers apply, and inside
``with peft_model.disable_adapter():`` they do not (the reference pass). Micro-batches are run one after another
and all their graphs stay alive until the caller's backward; to bound activation memory, split the groups with
:func:`plan_microbatches` and call backward per micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from wfc.attention import GQA_SDPA
from wfc.constrain import additive_mask

Group = tuple[Sequence[int], Sequence[Sequence[int]]]

DEFAULT_TOKEN_BUDGET = 8192
# Families whose CausalLM head is `lm_head(hidden)` with no scaling or soft-capping afterwards.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3"})
# Row length at which a packed row's attention costs as much as the rest of its forward + backward: fitted on the
# 2-core CPU with SmolLM2-135M + LoRA at 2,048 tokens a step in rows of 256 to 2,048 tokens (6.0 s to 12.1 s), three
# runs giving 1,512 to 1,596 (benchmarks/bench_pack_cost.py). Prices merging distinct prompts into one row
# (compilers.update._packs); it decides where packs end, so changing it changes a run's float rounding.
ATTENTION_TOKENS = 1600.0
# Attention implementations that take an arbitrary 4-D additive mask as given.
MASKABLE_ATTENTION = frozenset({"sdpa", "eager", GQA_SDPA})


def rho(P: int, R: float, N: int) -> float:
    """Token ratio naive / packed for one group: ``N(P+R) / (P+NR)`` (1 for N=1, -> N as P dominates)."""
    if P < 0 or R < 0 or N < 1:
        raise ValueError(f"rho needs P >= 0, R >= 0, N >= 1; got P={P}, R={R}, N={N}")
    if P + N * R == 0:
        return 1.0
    return N * (P + R) / (P + N * R)


def row_cost(tokens: int, attention_tokens: float | None = ATTENTION_TOKENS) -> float:
    """Relative forward + backward time of one packed row of ``tokens`` tokens: ``T + T^2 / attention_tokens``
    (``None``: ``T``). The linear term is the layers' per-token work, the quadratic one attention over the row under
    its 4-D mask. Only ratios matter: it ranks ways of packing the same rows."""
    if tokens < 0:
        raise ValueError(f"row_cost needs tokens >= 0, got {tokens}")
    if attention_tokens is None:
        return float(tokens)
    if attention_tokens <= 0:
        raise ValueError(f"attention_tokens must be > 0 (or None: attention free), got {attention_tokens}")
    return tokens + tokens * tokens / attention_tokens


def packed_length(group: Group) -> int:
    """Tokens in the packed row of ``group``: ``P + sum R_i``."""
    prompt, completions = group
    return len(prompt) + sum(len(c) for c in completions)


def plan_microbatches(lengths: Sequence[int], token_budget: int, *, min_fill: float = 0.0) -> list[list[int]]:
    """Split rows of the given lengths into micro-batches of at most ``token_budget`` padded tokens each.

    The cost of a micro-batch is ``rows * max_len`` (rows are padded to the longest). Rows are taken longest first,
    so rows of similar length share a batch; a row longer than the budget gets a micro-batch of its own. A row joins
    the current batch only if it is at least ``min_fill`` x that batch's longest row (0: any row that fits), which
    bounds each row's padding at ``1 - min_fill`` of its padded width. Returns lists of indices into ``lengths``;
    every index appears exactly once.
    """
    if not isinstance(token_budget, int) or token_budget < 1:
        raise ValueError(f"token_budget must be a positive int (tokens per micro-batch), got {token_budget!r}")
    if not 0.0 <= min_fill <= 1.0:
        raise ValueError(f"min_fill must be in [0, 1] (share of the longest row's width), got {min_fill!r}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        # Longest first: the first row of the current batch is its max length.
        if batches:
            longest = max(lengths[batches[-1][0]], 1)
            if (len(batches[-1]) + 1) * longest <= token_budget and lengths[i] >= min_fill * longest:
                batches[-1].append(i)
                continue
        batches.append([i])
    return batches


def _check_groups(groups: Sequence[Group]) -> None:
    for g, group in enumerate(groups):
        if not isinstance(group, (tuple, list)) or len(group) != 2:
            raise TypeError(f"group {g} must be a (prompt_ids, completions) pair, got {type(group).__name__}")
        prompt, completions = group
        if len(prompt) == 0:
            raise ValueError(f"group {g} has an empty prompt: the last prompt token predicts c_0, so P must be >= 1")
        if len(completions) == 0:
            raise ValueError(f"group {g} has no completions: drop it before computing log-probs")
        if isinstance(completions[0], int):
            raise TypeError(f"group {g}: completions must be a list of token-id lists, not one flat list")


# ---------------------------------------------------------------------------------------------------------------
# Forward pass with the head applied only where needed.


@dataclass
class _Batch:
    """One micro-batch: model inputs plus, for every predicted token, where its logits are and what it is."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T) 0/1 for naive, (B, 1, T, T) additive float for packed
    position_ids: torch.Tensor  # (B, T)
    rows: torch.Tensor  # (K,) row of each predicting position
    cols: torch.Tensor  # (K,) column of each predicting position
    targets: torch.Tensor  # (K,) the token it predicts
    lengths: list[int]  # completion lengths in output order; sum == K
    # grammar-constrained positions (wfc.constrain): their indices among the K, and each one's allowed-token bitmask
    mask_index: torch.Tensor | None = None  # (M,)
    bitmask: torch.Tensor | None = None  # (M, W) int32


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers CausalLM inside a PEFT wrapper (LoRA layers stay injected, so they still apply)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _check_attention(model: torch.nn.Module) -> None:
    impl = getattr(_unwrap(model).config, "_attn_implementation", None)
    if impl not in MASKABLE_ATTENTION:
        raise ValueError(
            f"packed log-probs need an attention implementation that honours a 4-D float mask "
            f"({sorted(MASKABLE_ATTENTION)}), but the model uses {impl!r}: call model.set_attn_implementation('sdpa')"
        )


def _token_logprobs(model: torch.nn.Module, batch: _Batch, *, fast: bool | None = None,
                    temperature: float = 1.0, entropy: bool = False) -> torch.Tensor:
    """Log-probs of ``batch.targets`` at ``(rows, cols)`` under ``softmax(logits / temperature)``; shape (K,).
    ``fast=None`` picks by model family. ``entropy=True``: shape (K, 2), column 1 the entropy of that distribution
    at each position (exact, over the whole vocabulary; it carries grad like the log-probs)."""
    base = _unwrap(model)
    if fast is None:
        fast = getattr(base.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    if fast:
        hidden = base.get_decoder()(**inputs, use_cache=False).last_hidden_state  # (B, T, H)
        logits = base.get_output_embeddings()(hidden[batch.rows, batch.cols])  # (K, V)
    else:
        logits = model(**inputs, use_cache=False).logits[batch.rows, batch.cols]  # (K, V)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if batch.mask_index is not None:  # the grammar's masked distribution at constrained positions (wfc.constrain)
        mask = additive_mask(batch.bitmask, logits.shape[-1]).to(logits.device)  # (M, V): 0 or -inf
        logits = logits.index_add(0, batch.mask_index.to(logits.device), mask)
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return picked
    # masked-out tokens have p = 0 and log p = -inf: they add 0 to the entropy (not 0 * -inf = nan)
    return torch.stack([picked, -(logp.exp() * logp.masked_fill(torch.isinf(logp), 0.0)).sum(-1)], dim=-1)


def _run(
    model: torch.nn.Module, batches: list[tuple[list[tuple[int, int]], _Batch]], n_out: list[int], fast: bool | None,
    temperature: float = 1.0, entropy: bool = False,
) -> list[list[torch.Tensor]]:
    """Run micro-batches (each with its ``(group, completion)`` keys) and scatter results to ``out[g][i]``
    (each (n,), or (n, 2) with ``entropy``)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (the sampling temperature of the rollouts), got {temperature}")
    out: list[list[torch.Tensor | None]] = [[None] * n for n in n_out]
    for keys, batch in batches:
        flat = _token_logprobs(model, batch, fast=fast, temperature=temperature, entropy=entropy)
        for (g, i), piece in zip(keys, torch.split(flat, batch.lengths), strict=True):
            out[g][i] = piece
    return out  # type: ignore[return-value]


def _device(model: torch.nn.Module) -> torch.device:
    return _unwrap(model).get_input_embeddings().weight.device


# ---------------------------------------------------------------------------------------------------------------
# Naive reference: one row per completion.


def _naive_batch(seqs: list[tuple[Sequence[int], Sequence[int]]], device) -> _Batch:
    T = max(len(p) + len(c) for p, c in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    rows, cols, targets, lengths = [], [], [], []
    for b, (prompt, comp) in enumerate(seqs):
        n = len(prompt) + len(comp)
        ids[b, :n] = torch.tensor([*prompt, *comp], dtype=torch.long)
        mask[b, :n] = 1  # right padding: real tokens keep positions 0..n-1
        P = len(prompt)
        rows += [b] * len(comp)
        cols += range(P - 1, P - 1 + len(comp))
        targets += comp
        lengths.append(len(comp))
    position_ids = torch.arange(T).expand(len(seqs), T)
    return _Batch(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=position_ids.to(device),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        cols=torch.tensor(cols, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        lengths=lengths,
    )


def naive_logprobs(
    model: torch.nn.Module, groups: Sequence[Group], *, token_budget: int | None = None, fast: bool | None = None,
    temperature: float = 1.0, entropy: bool = False,
) -> list[list[torch.Tensor]]:
    """Per-token completion log-probs from one ``prompt + completion`` row per completion (the reference).
    ``temperature``: log-probs under ``softmax(logits / temperature)``, the distribution the rollouts sampled from.
    ``entropy=True``: each completion's tensor is (n, 2), column 1 that distribution's entropy at each position.

    ``token_budget=None`` runs one micro-batch per group (N rows); an int packs rows of all groups into micro-batches
    of at most that many padded tokens. ``fast`` forces (True) or disables (False) the head-on-needed-positions path.
    """
    _check_groups(groups)
    device = _device(model)
    units = [((g, i), (prompt, comp)) for g, (prompt, comps) in enumerate(groups) for i, comp in enumerate(comps)]
    if token_budget is None:  # one micro-batch per group: units are listed group by group
        starts = [0]
        for _, comps in groups:
            starts.append(starts[-1] + len(comps))
        plan = [list(range(a, b)) for a, b in zip(starts, starts[1:])]
    else:
        plan = plan_microbatches([len(p) + len(c) for _, (p, c) in units], token_budget)
    batches = [([units[u][0] for u in mb], _naive_batch([units[u][1] for u in mb], device)) for mb in plan]
    return _run(model, batches, [len(c) for _, c in groups], fast, temperature, entropy)


# ---------------------------------------------------------------------------------------------------------------
# Packed: one row per group.


def packed_mask(segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask (B, 1, T, T) from segment ids (B, T): 0 = prompt, i+1 = completion i, -1 = padding.

    Query q may attend key k iff ``k <= q`` and k is prompt or in q's own segment, and neither is padding.
    Padding queries attend to themselves only, so no row is fully masked (a fully masked softmax row is NaN in
    some kernels, and NaN times a zero gradient is still NaN in the weight gradients).
    Blocked entries hold ``finfo(dtype).min`` rather than ``-inf`` for the same reason.
    """
    B, T = segments.shape
    idx = torch.arange(T, device=segments.device)
    causal = idx[None, :] <= idx[:, None]  # (T, T) [q, k]
    seg_q, seg_k = segments[:, :, None], segments[:, None, :]  # (B, T, 1), (B, 1, T)
    real_q, real_k = seg_q >= 0, seg_k >= 0
    allowed = causal & ((seg_k == 0) | (seg_k == seg_q)) & real_q & real_k  # (B, T, T)
    allowed |= torch.eye(T, dtype=torch.bool, device=segments.device)
    mask = torch.zeros(B, 1, T, T, dtype=dtype, device=segments.device)
    return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)


Masks = Sequence[Sequence["tuple[int, torch.Tensor] | None"]]  # per group, per completion: (offset, (R', W) bitmask)


def _packed_batch(groups: list[Group], device, dtype: torch.dtype, masks: Masks | None = None) -> _Batch:
    T = max(packed_length(g) for g in groups)
    ids = torch.zeros(len(groups), T, dtype=torch.long)  # pad id is irrelevant: padding is masked out
    seg = torch.full((len(groups), T), -1, dtype=torch.long)
    pos = torch.zeros(len(groups), T, dtype=torch.long)
    rows, cols, targets, lengths = [], [], [], []
    mask_index: list[int] = []
    bitmasks: list[torch.Tensor] = []
    for b, (prompt, comps) in enumerate(groups):
        P = len(prompt)
        ids[b, :P] = torch.tensor(list(prompt), dtype=torch.long)
        seg[b, :P] = 0
        pos[b, :P] = torch.arange(P)
        start = P
        for i, comp in enumerate(comps):
            R = len(comp)
            ids[b, start : start + R] = torch.tensor(list(comp), dtype=torch.long)
            seg[b, start : start + R] = i + 1
            pos[b, start : start + R] = torch.arange(P, P + R)  # as if the completion followed the prompt alone
            # c_0 is predicted by the last prompt token, c_t by c_{t-1} at column start + t - 1.
            rows += [b] * R
            cols += [P - 1, *range(start, start + R - 1)][:R]
            mask = masks[b][i] if masks is not None else None
            if mask is not None:  # positions offset.. of this completion are constrained
                offset, bits = mask
                mask_index += range(len(targets) + offset, len(targets) + offset + bits.shape[0])
                bitmasks.append(bits)
            targets += comp
            lengths.append(R)
            start += R
    return _Batch(
        input_ids=ids.to(device),
        attention_mask=packed_mask(seg.to(device), dtype),
        position_ids=pos.to(device),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        cols=torch.tensor(cols, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        lengths=lengths,
        mask_index=torch.tensor(mask_index, dtype=torch.long) if bitmasks else None,
        bitmask=torch.cat(bitmasks) if bitmasks else None,
    )


def packed_logprobs(
    model: torch.nn.Module,
    groups: Sequence[Group],
    *,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    fast: bool | None = None,
    temperature: float = 1.0,
    entropy: bool = False,
    masks: Masks | None = None,
) -> list[list[torch.Tensor]]:
    """Per-token completion log-probs with each group packed into one row (see the module doc).
    ``masks`` (parallel to each group's completions): ``(offset, bitmask)`` for a completion decoded under a grammar,
    whose positions ``offset..`` then take log-probs under the masked distribution (``wfc.constrain``); None: free.

    Groups are batched up to ``token_budget`` padded tokens per micro-batch (``rows * max_len``); a group longer
    than the budget runs alone. The result has the structure of :func:`naive_logprobs` and equals it to float
    rounding. ``fast``, ``temperature`` and ``entropy`` as in :func:`naive_logprobs`.
    """
    _check_groups(groups)
    _check_attention(model)
    base = _unwrap(model)
    device, dtype = _device(model), base.get_input_embeddings().weight.dtype
    plan = plan_microbatches([packed_length(g) for g in groups], token_budget)
    batches = []
    for mb in plan:
        keys = [(g, i) for g in mb for i in range(len(groups[g][1]))]
        batches.append((keys, _packed_batch([groups[g] for g in mb], device, dtype,
                                            [masks[g] for g in mb] if masks is not None else None)))
    return _run(model, batches, [len(c) for _, c in groups], fast, temperature, entropy)
