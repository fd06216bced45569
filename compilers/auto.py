"""``backend="auto"``: trace a few rollouts with the base model, fold them into a role graph, choose the backend.

The choice (:func:`choose_backend`) is a pure function of per-role statistics, so it is tested on hand-built stats;
:func:`plan` is the traced front end (``wfc plan PROGRAM`` prints its ``describe()``; ``MMGRPO.compile(...,
backend="auto")`` trains with it and stores its spec and reasons in the manifest).

Findings the rules act on (issue 4): isolated policies reach higher peaks but fall off accuracy cliffs more often,
driven by parallel same-role calls on shared prompts amplifying that role's gradient; a shared policy is captured by
the dominant role (most tokens and calls); the right choice depends on the program.

Rules, over the ``m`` roles seen in the trace, with ``share`` = the role's share of completion tokens (what a
policy-gradient loss sums over; the share of all tokens if no completion token was seen):

1. A program with one role: ``shared`` (isolation has nothing to separate).
2. Roles never called in the trace train in the ``shared`` adapter (no evidence that they need their own).
3. Dominant role: ``share >= dominance / m`` (default ``dominance`` 1.5: half again its equal share; 0.75 for two
   roles, 0.5 for three, 0.375 for four). A dominant role argues against one shared adapter: it gets its own.
4. Fan-out (a role with parallel same-role calls, ``fan_out > 1``) argues for fan-out scaling and against unguarded
   isolation: a dominant fan-out role is isolated only when ``fanout_scaling`` is on; otherwise it stays shared,
   where role balancing caps its share (a warning is added if that is off too).
5. The non-isolated roles share one adapter, ``shared``. If every role ends up alone, the spec is ``"isolated"``;
   if none is isolated, ``"shared"``; otherwise a grouped dict.
6. No dominant role: ``shared`` (role balancing keeps the roles' gradient mass equal; fan-out scaling keeps any
   parallel role at one call's weight per cohort).
"""

from __future__ import annotations

import random
from typing import Any, Protocol, Sequence

from compilers.backends import BackendPlan, resolve_backend
from compilers.config import MMGRPOConfig
from wfc.engines.base import SamplingParams
from wfc.lower import roles, run_rollouts
from wfc.rolegraph import RoleGraph

SHARED = "shared"


class RoleStatsLike(Protocol):
    """What the rules read of ``wfc.rolegraph.RoleStats``."""

    role: str
    calls_mean: float
    fan_out: int
    token_share: float
    completion_share: float


def choose_backend(stats: Sequence[RoleStatsLike], role_paths: Sequence[str], *, fanout_scaling: bool = True,
                   role_balance: bool = True, dominance: float = 1.5) -> BackendPlan:
    """The backend for a program with ``role_paths``, from the traced ``stats`` (rules in the module doc)."""
    if dominance <= 1.0:
        raise ValueError(f"dominance must be > 1 (a multiple of the equal share 1/m), got {dominance}")
    role_paths = list(role_paths)
    if not role_paths:
        raise ValueError("choose_backend needs the program's role paths; a program without roles has nothing to train")
    seen = [s for s in stats if s.role in role_paths]
    unknown = [s.role for s in stats if s.role not in role_paths]
    if unknown:
        raise ValueError(f"traced roles {unknown} are not roles of the program {role_paths}")
    if len(role_paths) == 1:
        return _finish(role_paths, set(), ["one role: shared (isolation has nothing to separate)"])
    reasons = []
    unseen = [r for r in role_paths if r not in {s.role for s in seen}]
    if unseen:
        reasons.append(f"roles {unseen} were not called in the trace: they train in the shared adapter")
    if not seen:
        return _finish(role_paths, set(), reasons + ["no calls traced: shared"])
    use_completion = sum(s.completion_share for s in seen) > 0
    share = {s.role: (s.completion_share if use_completion else s.token_share) for s in seen}
    what = "completion tokens" if use_completion else "tokens"
    m = len(seen)
    threshold = dominance / m
    fan = {s.role: s.fan_out for s in seen if s.fan_out > 1}
    isolate: set[str] = set()
    for s in seen:
        r = s.role
        if share[r] < threshold:
            continue
        why = f"{r} is dominant: {share[r]:.0%} of {what} >= {dominance:g}/{m} = {threshold:.0%}"
        if r in fan and not fanout_scaling:
            reasons.append(f"{why}, but it fans out {fan[r]}x and fanout_scaling is off: isolating it unguarded is the "
                           "cliff-prone setup, so it stays shared" + (" under role balancing" if role_balance else ""))
            if not role_balance:
                reasons.append(f"warning: with role_balance off too, {r} can capture the shared adapter; "
                               "turn on fanout_scaling or role_balance")
            continue
        isolate.add(r)
        reasons.append(f"{why}: it gets its own adapter (a dominant role captures a shared one)"
                       + (f"; it fans out {fan[r]}x, so fan-out scaling weighs each cohort as one call" if r in fan
                          else ""))
    if not isolate:
        reasons.append(f"no role holds >= {threshold:.0%} of {what} (max {max(share.values()):.0%}): one shared adapter"
                       + (", role-balanced" if role_balance else ""))
    for r, k in fan.items():
        if r not in isolate:
            reasons.append(f"{r} fans out {k}x: " + ("fan-out scaling weighs each cohort as one call" if fanout_scaling
                                                     else "warning: fanout_scaling is off, its gradient grows with k"))
    rest = [r for r in role_paths if r not in isolate]
    if isolate and len(rest) == 1:
        reasons.append(f"{rest[0]} is the only other role: it gets an adapter of its own (every role is alone)")
    return _finish(role_paths, isolate, reasons)


def _finish(role_paths: list[str], isolate: set[str], reasons: list[str]) -> BackendPlan:
    if not isolate:
        spec: Any = "shared"
    elif len(role_paths) - len(isolate) <= 1:
        spec = "isolated"
    else:
        spec = {r: (r if r in isolate else SHARED) for r in role_paths}
        if any(r == SHARED for r in isolate):  # a role literally named "shared" keeps its own group name distinct
            spec = {r: (f"role_{r}" if r in isolate else SHARED) for r in role_paths}
    resolved = resolve_backend(spec, role_paths)
    return BackendPlan(spec, resolved.role_adapters, [f"backend=auto -> {resolved.kind}", *reasons])


def plan(program, examples: Sequence, engine, *, config=None, seed: int = 0) -> BackendPlan:
    """Trace ``config.auto_trace_examples`` examples x ``config.auto_trace_repeats`` rollouts of ``program`` with the
    base model (no adapters) at the training sampling settings, and choose the backend. Does not train.

    The returned plan's ``role_graph`` holds the traced statistics; ``describe()`` prints decision, reasons and graph.
    """
    cfg = config or MMGRPOConfig()
    role_paths = list(roles(program))
    examples = list(examples)
    if not examples:
        raise ValueError("plan needs a few examples to trace (e.g. the first trainset examples); got none")
    sample = random.Random(seed).sample(examples, min(cfg.auto_trace_examples, len(examples)))
    rollouts = run_rollouts(program, sample, engine, repeats=cfg.auto_trace_repeats, adapters=None,
                            sampling=SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens))
    graphs = [g for gs in rollouts for g in gs]
    graph = RoleGraph.from_rollouts(graphs)
    decided = choose_backend(graph.roles, role_paths, fanout_scaling=cfg.fanout_scaling,
                             role_balance=cfg.role_balance, dominance=cfg.auto_dominance)
    traced = (f"traced {len(graphs)} rollouts ({len(sample)} examples x {cfg.auto_trace_repeats}) with the base model "
              f"at temperature {cfg.temperature:g}, max_tokens {cfg.max_tokens}")
    decided.reasons.insert(1, traced)
    decided.role_graph = graph
    return decided
