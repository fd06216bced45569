"""A training step's diagnostics, for its ``metrics.jsonl`` record: per role (``roles``), what the rollouts showed
(calls, tokens, rewards, no-signal, format errors, truncation, entropy) and what the guards did in the update (fan-out
weights, gradient norms and clipping, role balancing); and for the step (``starvation``), whether it was starved of
signal: most drawn examples flat (every rollout scored the same), with the pass rate and the remedies in force."""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from compilers.config import MMGRPOConfig
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


# ----------------------------------------------------------------------------------------------------------------
# Starvation: a step whose drawn examples are mostly flat trains on (almost) nothing

STARVED_ABOVE = 0.5  # "most": more than half of the drawn examples flat


def remedies_in_force(cfg: MMGRPOConfig) -> list[str]:
    """The remedies for a weak signal that ``cfg`` switches on, by config field name (sampling's first); a strategy
    that bootstraps demos before training weights counts as ``strategy=<its name>``."""
    on = {"dynamic_sampling": cfg.dynamic_sampling, "pass_band": cfg.pass_band is not None,
          "curriculum_steps": cfg.curriculum_steps > 0, "pass_rate_probe": cfg.pass_rate_probe > 0,
          "adaptive_rollouts": cfg.adaptive_rollouts, "warm_start_runs": cfg.warm_start_runs > 0,
          f"strategy={cfg.strategy}": cfg.optimizes.demos and cfg.optimizes.weights,
          "retrieved_demos": cfg.retrieved_demos > 0, "auto_remedies": cfg.auto_remedies}
    return [name for name, flag in on.items() if flag]


def starvation(flat: int, drawn: int, *, pass_rate: float | None, step_pass_rate: float | None,
               remedies: Sequence[str], above: float = STARVED_ABOVE) -> dict[str, Any]:
    """A step's ``starvation`` record: ``flat`` of the ``drawn`` examples had no signal (no trained group of theirs
    held two different rewards); ``starved`` when their share is over ``above`` (never with nothing drawn).
    ``pass_rate`` is the running one (the sampler's mean over the examples seen, None before any), ``step_pass_rate``
    this step's (mean reward of the drawn rollouts, clipped to [0, 1]); ``remedies`` those in force."""
    fraction = flat / drawn if drawn else 0.0
    return {"flat": flat, "drawn": drawn, "flat_fraction": fraction, "starved": drawn > 0 and fraction > above,
            "pass_rate": pass_rate, "step_pass_rate": step_pass_rate, "remedies": list(remedies)}


def starvation_postfix(record: Mapping[str, Any]) -> dict[str, str]:
    """The progress bar's postfix fields for a ``starvation`` record: flat examples, running pass rate, and on a
    starved step the remedies in force."""
    rate = record["pass_rate"]
    out = {"flat": f"{record['flat']}/{record['drawn']}", "pass": "-" if rate is None else f"{rate:.2f}"}
    if record["starved"]:
        out["starved"] = "+".join(record["remedies"]) or "no remedy"
    return out


def starvation_note(step: int, record: Mapping[str, Any]) -> str:
    """The sentence a starved step prints: what was flat, the pass rate, the remedies in force (or which to try)."""
    rate = record["pass_rate"]
    remedies = ", ".join(record["remedies"]) or ("none (try adaptive_rollouts, pass_rate_probe with "
                                                 "curriculum_steps, dynamic_sampling)")
    return (f"step {step} starved of signal: {record['flat']} of {record['drawn']} drawn examples were flat (every "
            f"rollout scored the same); running pass rate {'unknown' if rate is None else f'{rate:.3f}'}; "
            f"remedies in force: {remedies}")
