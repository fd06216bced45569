"""A training step's diagnostics per role, for its ``metrics.jsonl`` record (``roles``): what the rollouts showed
(calls, tokens, rewards, no-signal, format errors, truncation, entropy) and what the guards did in the update (fan-out
weights, gradient norms and clipping, role balancing)."""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from compilers.group import Group
from compilers.guards import cohort_sizes, member_key
from wfc.rollout import RolloutGraph


def role_stats(graphs: list[RolloutGraph], groups: list[Group]) -> dict[str, dict[str, float]]:
    """Per role: calls, tokens, token share, reward mean/spread, no-signal group rate, format-error rate, truncated
    rate, entropy (and whether it was measured: the engine reported log-probs)."""
    out: dict[str, dict[str, float]] = {}
    calls = [c for g in graphs for c in g.calls]
    total_tokens = sum(len(c.completion_ids) for c in calls) or 1
    for role in dict.fromkeys(c.role for c in calls):
        mine = [c for c in calls if c.role == role]
        role_groups = [g for g in groups if g.role == role]
        rewards = [r for g in role_groups for r in g.rewards]
        known = [c for c in mine if c.logprobs_known and c.logprobs]
        if known and all(c.choice_ids is not None for c in known):
            # a choice role: its calls' log-probs sum to log q(c), the choice's probability among the choices, so
            # the estimate is per choice (nats per decision), not per token of the choice's spelling
            sampled = [sum(c.logprobs) for c in known]
        else:
            sampled = [lp for c in known for lp in c.logprobs]
        out[role] = {
            "calls": len(mine),
            "tokens": sum(len(c.completion_ids) for c in mine),
            "token_share": sum(len(c.completion_ids) for c in mine) / total_tokens,
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "no_signal_rate": sum(bool(g.no_signal) for g in role_groups) / max(len(role_groups), 1),
            "format_error_rate": sum(c.status == "format_error" for c in mine) / max(len(mine), 1),
            # calls cut at max_tokens: a rising rate means answers are being cut off (overlong_penalty acts on it)
            "truncated_rate": sum(c.finish_reason == "length" for c in mine) / max(len(mine), 1),
            # Monte-Carlo estimate of the sampling entropy: mean negative log-prob of the sampled tokens (of the
            # sampled choices, for a choice role: the entropy of its distribution over the choices)
            "entropy": -statistics.fmean(sampled) if sampled else 0.0,
            "entropy_measured": bool(sampled),  # False: the engine reported no log-probs (entropy 0.0 says nothing)
        }
    return out


def add_guard_stats(per_role: dict[str, dict[str, Any]], groups: list[Group], weights: Mapping[tuple, float],
                     upd: dict[str, dict[str, Any]], role_adapters: Mapping[str, str], optimizers) -> None:
    """Adds per role: adapter, lr, fan_out (largest cohort), fanout_weight (mean row weight), grad_norm (the role's
    own gradient contribution, before its clip), grad_clipped, adapter_grad_norm (the summed gradient of its adapter),
    mass_share / mass_share_raw (share of its adapter's gradient mass after / before role balancing),
    balance_weight."""
    fan = cohort_sizes(groups)
    for role, adapter in role_adapters.items():
        if role not in per_role:
            continue
        mine = [weights.get(member_key(g, m), 1.0)
                for g in groups if g.role == role for m in g.members]
        st = upd.get(adapter, {}).get("roles", {}).get(role, {})
        per_role[role].update(
            adapter=adapter, lr=optimizers.lr(adapter), fan_out=fan.get(role, 1),
            fanout_weight=statistics.fmean(mine) if mine else 1.0,
            grad_norm=st.get("grad_norm", 0.0), grad_clipped=st.get("clipped", False),
            adapter_grad_norm=upd.get(adapter, {}).get("grad_norm", 0.0),
            mass_share=st.get("mass_share", 0.0), mass_share_raw=st.get("mass_share_raw", 0.0),
            balance_weight=st.get("balance_weight", 1.0))
