"""Token-level clipped policy-gradient loss (PPO/GRPO family), as pure tensor functions.

Data model (B sequences in a batch, T token positions after padding):

- ``logprobs``      (B, T)  log-prob of each sampled token under the policy being trained (carries grad).
- ``old_logprobs``  (B, T)  the same tokens under the sampling-time policy. Treated as a constant (detached).
- ``advantages``    (B,)    one advantage per sequence, broadcast to its tokens. Constant.
- ``mask``          (B, T)  bool, or float holding only 0/1: True where the token is a completion token to train on.
- ``ref_logprobs``  (B, T)  optional reference-policy log-probs for the KL penalty. Constant.
- ``importance_weights`` (B, T) optional per-token multiplier of the *policy* term only (e.g. truncated importance
  sampling between the sampling engine and the trainer, ``min(pi_train_old / pi_engine, C)``). Constant.
- ``weights``       (B,)    optional per-sequence multiplier of the whole token loss (role balancing, fan-out).
- ``entropy``       (B, T)  optional entropy of the policy's whole next-token distribution at each position (carries
  grad; ``compilers.packing`` with ``entropy=True``), for the entropy bonus.

Per token (``r = exp(logprobs - old_logprobs)``, ``A`` the row's advantage)::

    loss_t = -min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps_high) * A) * importance_weight_t
             + beta * kl_k3(logprobs_t, ref_t)
             - entropy_coef * entropy_t

then multiplied by the row's ``weights`` and reduced by an aggregation from :data:`AGGREGATIONS` (an
:class:`Aggregation` also says what a step's loss divides by, which the update splits by micro-batch and role).

Invariants (tested):

- Values at masked-out positions never reach the loss, the stats or the gradient, whatever they are (-inf, NaN).
- The gradient w.r.t. ``logprobs`` flows only through ``r`` and the KL term: the policy term's
  ``d loss_t / d logprobs_t`` is ``-r * A`` (times the token's importance weight) where unclipped and 0 where the clip
  is active; then scaled by the row weight and the aggregation's divisor.
- Arithmetic is done in at least float32 (bf16 inputs are upcast), so ``exp`` of small differences is not rounded away.
- Mistakes in shapes or options raise ``ValueError`` saying what to pass instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import Tensor


# --------------------------------------------------------------------------------------------------------------------
# Elementwise pieces


def masked_mean(x: Tensor, mask: Tensor, *, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is true (``x`` and ``mask`` broadcastable to one shape).

    With ``dim=None`` the mean is over all selected positions; with ``dim`` it is per slice, and a slice with no
    selected position gets 0 (not NaN). Masked-out values never enter, even if they are NaN or inf.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=dim)
    count = m.sum(dim=dim)
    if dim is None:
        if int(count) == 0:
            raise ValueError("masked_mean over an all-false mask; there is nothing to average")
        return total / count
    return total / count.clamp(min=1).to(total.dtype)


def kl_k3(new_logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(new || ref): ``exp(ref - new) - (ref - new) - 1``.

    Non-negative, exactly 0 where ``ref == new``, unbiased for the KL when tokens are sampled from ``new``.
    Gradient w.r.t. ``new``: ``1 - exp(ref - new)``.
    """
    delta = ref_logprobs - new_logprobs
    return torch.exp(delta) - delta - 1.0


@dataclass(frozen=True)
class Surrogate:
    """Output of :func:`clipped_surrogate`, all (B, T)."""

    loss: Tensor  # -min(r * A, clip(r) * A)
    ratio: Tensor  # r = exp(new - old)
    clipped_low: Tensor  # bool: A < 0 and r < 1 - eps_lo (clip active, no gradient)
    clipped_high: Tensor  # bool: A > 0 and r > 1 + eps_hi (clip active, no gradient)


def clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> Surrogate:
    """PPO clipped objective per token, negated to a loss. ``advantages`` is (B,) and broadcast over T.

    ``clip_eps_high`` defaults to ``clip_eps`` (symmetric PPO); a larger value is DAPO's "clip-higher".
    No masking here: :func:`policy_loss` zeroes padded positions before calling.
    """
    _check_clip(clip_eps, clip_eps_high)
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    adv = advantages.unsqueeze(-1)  # (B, 1)
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_hi) * adv
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        clipped_low = (adv < 0) & (ratio < 1.0 - clip_eps)
        clipped_high = (adv > 0) & (ratio > 1.0 + eps_hi)
    return Surrogate(loss=loss, ratio=ratio, clipped_low=clipped_low, clipped_high=clipped_high)


def _check_clip(clip_eps: float, clip_eps_high: float | None) -> None:
    if not 0.0 <= clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in [0, 1) so that 1 - clip_eps > 0, got {clip_eps}; 0.2 is usual")
    if clip_eps_high is not None and clip_eps_high < 0.0:
        raise ValueError(f"clip_eps_high must be >= 0 (or None to use clip_eps), got {clip_eps_high}; DAPO uses 0.28")


# --------------------------------------------------------------------------------------------------------------------
# Aggregations: (B, T) token losses, already zero at masked positions -> scalar


def aggregate_token(token_losses: Tensor, mask: Tensor, *, max_tokens: int | None = None) -> Tensor:
    """Sum over every completion token in the batch / number of those tokens. Long sequences weigh more."""
    return token_losses.sum() / mask.sum()


def aggregate_sequence(token_losses: Tensor, mask: Tensor, *, max_tokens: int | None = None) -> Tensor:
    """Mean over each sequence's tokens, then mean over the B sequences (original GRPO).

    A row with no completion tokens contributes 0 and still counts in B.
    """
    per_row = token_losses.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (B,)
    return per_row.mean()


def aggregate_constant(token_losses: Tensor, mask: Tensor, *, max_tokens: int | None = None) -> Tensor:
    """Sum over every completion token / (B * max_tokens), a constant (Dr. GRPO): no length bias in either direction.

    ``max_tokens`` is the generation budget (e.g. ``max_new_tokens``), not the padded width T, which varies per batch.
    """
    if max_tokens is None or isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(
            f"aggregation 'constant' needs max_tokens, a positive int (the generation budget, e.g. max_new_tokens); "
            f"got {max_tokens!r}"
        )
    longest = int(mask.sum(dim=-1).max())
    if longest > max_tokens:
        raise ValueError(
            f"a sequence has {longest} completion tokens but max_tokens={max_tokens}; pass the generation budget "
            "that bounds every completion"
        )
    batch = token_losses.shape[0]
    return token_losses.sum() / (batch * max_tokens)


Unit = Literal["tokens", "rows"]


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation: how a batch's (B, T) token losses become one scalar (``reduce``, called as the object),
    and what the whole step's loss is made of, which the update needs to split a step into micro-batches and roles.

    - ``unit``: what one row weighs in the numerator: its completion tokens or 1. A role's gradient mass counts in it
      (``compilers.guards.role_mass``: role balancing).
    - ``per``: what the step's loss divides by: its completion tokens, or its rows (``constant``: rows x
      ``max_tokens``). A micro-batch's aggregated loss is :meth:`share` of the step's, so the parts sum to it.

    With per-row ``weights`` (``policy_loss``), ``n_i`` row i's completion tokens:

    - ``token``:    ``sum_i w_i * sum_t l_it / sum_i n_i``   (the token count is not weighted)
    - ``sequence``: ``(1 / B) * sum_i w_i * (sum_t l_it / n_i)``
    - ``constant``: ``sum_i w_i * sum_t l_it / (B * max_tokens)``
    """

    name: str
    unit: Unit
    per: Unit
    reduce: Callable[..., Tensor]

    def __call__(self, token_losses: Tensor, mask: Tensor, *, max_tokens: int | None = None) -> Tensor:
        return self.reduce(token_losses, mask, max_tokens=max_tokens)

    def share(self, *, tokens: int, rows: int, total_tokens: int, total_rows: int) -> float:
        """A micro-batch's part of the step's loss: its tokens (or rows) over the step's."""
        return tokens / total_tokens if self.per == "tokens" else rows / total_rows


AGGREGATIONS: dict[str, Aggregation] = {a.name: a for a in (
    Aggregation("token", unit="tokens", per="tokens", reduce=aggregate_token),
    Aggregation("sequence", unit="rows", per="rows", reduce=aggregate_sequence),
    Aggregation("constant", unit="tokens", per="rows", reduce=aggregate_constant),
)}


def get_aggregation(name: str) -> Aggregation:
    """The aggregation registered under ``name``; ``ValueError`` naming the valid choices otherwise."""
    try:
        return AGGREGATIONS[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(AGGREGATIONS))
        raise ValueError(f"unknown loss aggregation {name!r}; choose one of: {valid}") from None


# --------------------------------------------------------------------------------------------------------------------
# The loss


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                aggregation: str | Callable[..., Tensor] = "token", clip_eps: float = 0.2,
                clip_eps_high: float | None = None, ref_logprobs: Tensor | None = None, beta: float = 0.0,
                importance_weights: Tensor | None = None, weights: Tensor | None = None, max_tokens: int | None = None,
                entropy: Tensor | None = None, entropy_coef: float = 0.0) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over a batch; returns ``(loss scalar, stats)``.

    ``aggregation``: a name in :data:`AGGREGATIONS`, or any callable ``(token_losses, mask, *, max_tokens)``.
    Per-row ``weights`` (B,) multiply each sequence's token losses (policy, KL and entropy terms alike) *before*
    aggregation, and are never renormalized, so the loss is linear in them and all-ones weights change nothing
    (:class:`Aggregation` gives the formulas). ``importance_weights`` (B, T) multiply only the clipped policy term.
    ``ref_logprobs`` enables the k3 KL penalty with coefficient ``beta`` (``beta > 0`` without them is an error; with
    ``beta == 0`` the KL is still measured for the stats). ``max_tokens`` is used only by the ``constant``
    aggregation. ``entropy`` with ``entropy_coef > 0`` adds the bonus ``-entropy_coef * entropy_t`` per token: its
    gradient raises the policy's entropy at the positions trained on (``entropy_coef > 0`` needs ``entropy``).

    Stats (plain floats, over completion tokens, unweighted): ``token_count``, ``clip_fraction`` (clip active, so no
    gradient), ``clip_low_fraction``, ``clip_high_fraction``, ``ratio_mean``, ``kl_mean`` (0.0 without a reference),
    ``entropy_mean`` (0.0 without ``entropy``).
    """
    aggregate = get_aggregation(aggregation) if isinstance(aggregation, str) else aggregation
    _check_options(clip_eps, clip_eps_high, beta=beta, has_ref=ref_logprobs is not None, entropy_coef=entropy_coef,
                   has_entropy=entropy is not None)
    shape = _check_bt("logprobs", logprobs, None)
    _check_bt("old_logprobs", old_logprobs, shape)
    m = _as_mask(mask, shape)  # (B, T) bool
    token_count = int(m.sum())
    if token_count == 0:
        raise ValueError("mask selects no completion tokens; there is nothing to train on (check the mask)")
    at = _Completion(m, torch.promote_types(logprobs.dtype, torch.float32), logprobs.device)
    adv = _check_rows("advantages", advantages, shape[0]).detach().to(at.dtype)  # (B,)

    new = at.take("logprobs", logprobs, grad=True)  # (B, T)
    sur = clipped_surrogate(new, at.take("old_logprobs", old_logprobs), adv, clip_eps=clip_eps,
                            clip_eps_high=clip_eps_high)
    token_losses = sur.loss  # (B, T)
    if importance_weights is not None:
        token_losses = token_losses * _importance(at, importance_weights)
    kl_mean = entropy_mean = 0.0
    if ref_logprobs is not None:
        kl = kl_k3(new, at.take("ref_logprobs", ref_logprobs))  # (B, T), 0 at padding since new == ref == 0 there
        token_losses = token_losses + beta * kl
        kl_mean = float(masked_mean(kl.detach(), m))
    if entropy is not None:
        ent = at.take("entropy", entropy, grad=True)
        if entropy_coef > 0:
            token_losses = token_losses - entropy_coef * ent
        entropy_mean = float(masked_mean(ent.detach(), m))
    if weights is not None:
        token_losses = token_losses * _row_weights(weights, shape[0], at.dtype).unsqueeze(-1)

    loss = aggregate(torch.where(m, token_losses, at.zero), m.to(at.dtype), max_tokens=max_tokens)
    return loss, _stats(sur, m, token_count, kl_mean=kl_mean, entropy_mean=entropy_mean)


@dataclass(frozen=True)
class _Completion:
    """The batch's completion positions (``mask``, (B, T) bool) and the loss's dtype (at least float32)."""

    mask: Tensor
    dtype: torch.dtype
    device: torch.device

    @property
    def zero(self) -> Tensor:
        return torch.zeros((), dtype=self.dtype, device=self.device)

    def take(self, name: str, x: Tensor, *, grad: bool = False) -> Tensor:
        """``x`` (B, T) checked, in the loss's dtype, zero at padding before any arithmetic, so that -inf/NaN there
        cannot leak into values or gradients; detached unless ``grad``."""
        _check_bt(name, x, self.mask.shape)
        return torch.where(self.mask, (x if grad else x.detach()).to(self.dtype), self.zero)


def _importance(at: _Completion, importance_weights: Tensor) -> Tensor:
    iw = at.take("importance_weights", importance_weights)
    if not bool(torch.isfinite(iw).all()) or bool((iw < 0).any()):
        raise ValueError("importance_weights must be finite and >= 0 on completion tokens (truncate them first)")
    return iw


def _row_weights(weights: Tensor, batch: int, dtype: torch.dtype) -> Tensor:
    w = _check_rows("weights", weights, batch).detach().to(dtype)
    if bool((w < 0).any()):
        raise ValueError("weights must be >= 0; a negative weight would reverse that sequence's update")
    return w


def _stats(sur: Surrogate, m: Tensor, token_count: int, *, kl_mean: float, entropy_mean: float) -> dict[str, float]:
    with torch.no_grad():
        return {
            "token_count": float(token_count),
            "clip_fraction": float((sur.clipped_low | sur.clipped_high)[m].float().mean()),
            "clip_low_fraction": float(sur.clipped_low[m].float().mean()),
            "clip_high_fraction": float(sur.clipped_high[m].float().mean()),
            "ratio_mean": float(sur.ratio[m].mean()),
            "kl_mean": kl_mean,
            "entropy_mean": entropy_mean,
        }


# --------------------------------------------------------------------------------------------------------------------
# Input checks


def _check_options(clip_eps: float, clip_eps_high: float | None, *, beta: float, has_ref: bool,
                   entropy_coef: float, has_entropy: bool) -> None:
    _check_clip(clip_eps, clip_eps_high)
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and not has_ref:
        raise ValueError(f"beta={beta} needs ref_logprobs (B, T); pass them or set beta=0.0")
    if not entropy_coef >= 0:
        raise ValueError(f"entropy_coef must be >= 0 (a bonus for entropy), got {entropy_coef}")
    if entropy_coef > 0 and not has_entropy:
        raise ValueError(f"entropy_coef={entropy_coef} needs entropy (B, T); pass it or set entropy_coef=0.0")


def _check_bt(name: str, x: Tensor, shape: torch.Size | None) -> torch.Size:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be (B, T), got shape {tuple(x.shape)}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but logprobs is {tuple(shape)}; align them (B, T)")
    return x.shape


def _check_rows(name: str, x: Tensor, batch: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({batch},), got {type(x).__name__}")
    if x.shape != (batch,):
        raise ValueError(f"{name} must be one value per sequence, shape ({batch},), got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf: {x.tolist()}; resolve failures upstream")
    return x


def _as_mask(mask: Tensor, shape: torch.Size) -> Tensor:
    _check_bt("mask", mask, shape)
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("a float mask must hold only 0 and 1; use weights (B,) or importance_weights (B, T) to weight")
    return mask.bool()
