"""Truncated importance correction for the gap between the rollout engine and the trainer (pure functions).

The rollout engine samples token ``y_t`` from its own numerics ``mu`` (vLLM kernels, possibly bf16; batched, padded
HF generate) and reports ``log mu(y_t)``. The trainer recomputes ``log pi_old(y_t)`` with its own numerics (fp32,
packed). GRPO's ratio ``pi / pi_old`` assumes the samples came from ``pi_old``; they came from ``mu``. Truncated
importance sampling (TIS) re-weights each token's policy term by

    w_t = min(exp(log pi_old(y_t) - log mu(y_t)), cap)

so the gradient estimates the on-policy one where the two agree (``w = 1``) and is bounded where the engine drew an
unlikely token (the cap keeps one token from dominating the step's variance). Both log-probs are under the sampling
temperature. With the HF engine and fp32 the gap is float rounding (``w`` within ~1e-5 of 1); with vLLM in bf16 it
is real. The corrections are a registry (:data:`CORRECTIONS`, the config's ``importance_correction``): ``tis`` weights
the policy term as above, ``none`` leaves it as it is; the mismatch is logged either way.

Invariants: ``w_t >= 0`` and ``w_t <= cap`` on completion tokens; padding gets weight 0; weights carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor


def truncated_importance_weights(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, *,
                                 cap: float) -> Tensor:
    """``min(exp(trainer - engine), cap)`` on completion tokens (``mask`` True), 0 elsewhere; detached. (B, T)."""
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    if trainer_logprobs.shape != engine_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError(f"shapes differ: trainer {tuple(trainer_logprobs.shape)}, engine "
                         f"{tuple(engine_logprobs.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()
    delta = torch.where(m, trainer_logprobs.detach() - engine_logprobs.detach(), torch.zeros_like(trainer_logprobs))
    w = torch.exp(delta).clamp(max=cap)
    return torch.where(m, w, torch.zeros_like(w))


@dataclass(frozen=True)
class ImportanceCorrection:
    """How the update re-weights the policy term for the engine/trainer gap: :meth:`weights` gives the per-token
    weights (B, T) of a micro-batch, or None for none."""

    name: str
    rule: Callable[..., Tensor] | None  # (trainer, engine, mask, *, cap) -> (B, T) weights; None: no correction

    def weights(self, trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, *, cap: float) -> Tensor | None:
        if self.rule is None:
            return None
        return self.rule(trainer_logprobs, engine_logprobs, mask, cap=cap)


CORRECTIONS: dict[str, ImportanceCorrection] = {c.name: c for c in (
    ImportanceCorrection("tis", truncated_importance_weights),
    ImportanceCorrection("none", None),
)}


def mismatch_stats(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, *, cap: float) -> dict[str, float]:
    """Per-token engine/trainer disagreement over completion tokens (plain floats):

    - ``mean_abs`` / ``max_abs``: ``|log pi_old - log mu|``;
    - ``kl``: ``mean(log mu - log pi_old)``, the sample estimate of KL(mu || pi_old) (>= 0 in expectation);
    - ``weight_mean``: mean truncated importance weight; ``truncated_fraction``: share of tokens at the cap;
    - ``tokens``: tokens compared.
    """
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0, "weight_mean": 1.0, "truncated_fraction": 0.0, "tokens": 0}
    delta = (trainer_logprobs.detach() - engine_logprobs.detach())[m]
    raw = torch.exp(delta)
    return {
        "mean_abs": float(delta.abs().mean()),
        "max_abs": float(delta.abs().max()),
        "kl": float((-delta).mean()),
        "weight_mean": float(raw.clamp(max=cap).mean()),
        "truncated_fraction": float((raw > cap).float().mean()),
        "tokens": n,
    }


def merge_mismatch(parts: list[dict[str, float]]) -> dict[str, float]:
    """Token-weighted merge of :func:`mismatch_stats` results (max for ``max_abs``)."""
    parts = [p for p in parts if p.get("tokens")]
    n = sum(p["tokens"] for p in parts)
    if not n:
        return {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0, "weight_mean": 1.0, "truncated_fraction": 0.0, "tokens": 0}
    out = {k: sum(p[k] * p["tokens"] for p in parts) / n
           for k in ("mean_abs", "kl", "weight_mean", "truncated_fraction")}
    out.update(max_abs=max(p["max_abs"] for p in parts), tokens=n)
    return out
