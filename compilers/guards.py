"""Guards against the two ways multi-role GRPO fails: amplified parallel roles and captured shared adapters.

Every guard is a pure function over plain data (groups, role masses, accuracy histories), tested against tables
worked out by hand in ``tests/compilers/test_guards.py``; ``compilers.update`` and ``compilers.mmgrpo`` apply them.

**Fan-out scaling** (:func:`fanout_weights`). A *cohort* is a set of calls of one role in one rollout that are run
on one input: the connected components of the relation "in flight at the same time (their ``[started, finished)``
ticks overlap) or given identical prompt ids". Voting's ``n`` voters form one cohort of ``n``; OrchWorkers' workers
(different subtasks, run in parallel) form one cohort per rollout; EvalOpt's evaluator, called once per round on a
new proposal, forms a cohort of 1 per call. Rule: every training row (group member) of a cohort gets weight ``1/k``,
where ``k`` is the number of rows of that cohort in the step (its calls, plus any ``fill`` copies of them), so the
rows of each cohort sum to weight 1.
Why: the ``k`` calls of a cohort share one outcome (every call inherits the rollout's reward), so they carry one
outcome's worth of credit; unscaled, the role's share of its adapter's per-step gradient mass grows linearly in
``k`` (a role with 4 voters outweighs a role called once 4:1 in a shared adapter, and a rollout with 3 workers
outweighs one with 1 worker 3:1 in the worker's own adapter). With ``1/k`` every cohort weighs what one call weighs,
whatever ``k`` is. (With Adam, a uniform rescale of an adapter's whole loss changes little; what the rule fixes is
the *relative* weight: between roles sharing an adapter, and between rollouts of different fan-out.)

**Role-balanced loss** (:func:`role_mass`, :func:`balance_weights`). For an adapter trained by several roles, the
gradient mass of role ``r`` in a step is ``M_r = sum over its rows that carry gradient of (row weight x completion
tokens)``, or of row weights where the loss aggregation's unit is rows (``compilers.loss.Aggregation.unit``:
``sequence`` weighs rows, not tokens); its share is ``p_r = M_r / M``.
Rule (water-filling under a cap ``c``): roles are given target shares ``s_r`` equal to ``p_r`` rescaled so that no
``s_r`` exceeds ``c``: repeatedly fix every role whose share would exceed ``c`` at exactly ``c`` and split what is
left among the other roles in proportion to their mass. Each row of role ``r`` is then multiplied by
``b_r = s_r * M / M_r``; the total mass ``M`` (and so the loss scale) is unchanged. ``c = None`` means ``1/m`` for
``m`` roles with mass (equal shares: the default); a cap below ``1/m`` cannot be met and also means equal shares.
A role with no mass keeps ``b_r = 1``.

**Per-role learning rates** (:func:`adapter_learning_rates`): an adapter's rate is the rate of its roles; roles
that share an adapter must agree (one Adam state cannot step at two rates).

**Cliff detection** (:func:`detect_cliff`): over validation accuracies ``(step, acc)`` in order, with ``best`` the
highest accuracy so far (the earliest step on ties), a cliff is ``patience`` consecutive evaluations, all after the
last rollback, each more than ``drop`` below ``best``. The loop then restores the adapters to the best revision,
multiplies their learning rates by ``cliff_lr_factor`` and records the event.

**Entropy floor** (:func:`entropy_bonus`). A role whose sampled entropy in a step (the mean negative log-prob of its
sampled completion tokens, nats per token: the step log's ``entropy``; for a choice role, per sampled choice: the
entropy of its distribution over the choices) is below ``floor`` gets an entropy bonus with
coefficient ``coef`` in that step's loss (``compilers.loss``: ``-coef * H_t`` per token, ``H_t`` the exact entropy of
the policy's next-token distribution), on all its rows, those of flat groups included; a role at or above the floor
gets none. Why: on the demo a weak draw's voters lost their entropy by step 6 (0.07-0.14 nats against 0.2-0.4 on
good draws) while still wrong on most problems, so most groups turned flat and the step had nothing left to learn
from; the bonus acts only once a role has collapsed, so it costs nothing while the role still explores. The bonus
is the next-token entropy over the whole vocabulary, so for a choice role (whose floor reading is over its choices)
it would spread mass off the choices, which decoding ignores: keep choice roles off the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from compilers.group import Group
from wfc.rollout import CallNode

MemberKey = tuple[int, str, int, int]  # (example, role, invocation, rollout): one member of one group


def member_key(group: Group, member) -> MemberKey:
    """A member's key: its own invocation (a pooled member keeps the one it was called as), else its group's."""
    own = member.invocation if member.invocation is not None else group.invocation
    return (group.example, group.role, own, member.rollout)


# ----------------------------------------------------------------------------------------------------------------
# Fan-out scaling


def _overlap(a: CallNode, b: CallNode) -> bool:
    """True when both calls have a span and the spans ``[started, finished)`` intersect."""
    if a.finished <= a.started or b.finished <= b.started:
        return False
    return a.started < b.finished and b.started < a.finished


def fanout_cohorts(calls: Sequence[CallNode]) -> list[list[int]]:
    """Partition the calls of one role in one rollout into cohorts (see module doc); returns lists of call ids.

    Cohorts are in order of their first call's id; ids in a cohort are ascending.
    """
    ids = sorted({c.id for c in calls})
    by_id = {c.id: c for c in calls}
    parent = {i: i for i in ids}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for x, i in enumerate(ids):
        for j in ids[x + 1:]:
            a, b = by_id[i], by_id[j]
            same_prompt = bool(a.prompt_ids) and a.prompt_ids == b.prompt_ids
            if same_prompt or _overlap(a, b):
                parent[find(j)] = find(i)
    cohorts: dict[int, list[int]] = {}
    for i in ids:
        cohorts.setdefault(find(i), []).append(i)
    return sorted(cohorts.values(), key=lambda c: c[0])


def fanout_weights(groups: Sequence[Group]) -> dict[MemberKey, float]:
    """Weight ``1/k`` for every member of every group, ``k`` the rows of its cohort in these groups (module doc).

    Keys are ``member_key``s ``(example, role, invocation, rollout)``, unique per member. A role called
    once per rollout gets 1.0 everywhere. Invariant: for every (example, rollout, role), the weights of the members
    whose calls form one cohort sum to 1.
    """
    # (example, rollout, role) -> call id -> call, and -> the member keys (rows) of each call
    calls: dict[tuple[int, int, str], dict[int, CallNode]] = {}
    rows: dict[tuple[int, int, str], dict[int, list[MemberKey]]] = {}
    for g in groups:
        for m in g.members:
            where = (g.example, m.rollout, g.role)
            calls.setdefault(where, {})[m.call.id] = m.call
            rows.setdefault(where, {}).setdefault(m.call.id, []).append(member_key(g, m))
    out: dict[MemberKey, float] = {}
    for where, by_id in calls.items():
        for cohort in fanout_cohorts(list(by_id.values())):
            keys = [k for i in cohort for k in rows[where][i]]
            for k in keys:
                out[k] = 1.0 / len(keys)
    return out


def cohort_sizes(groups: Sequence[Group]) -> dict[str, int]:
    """Per role, the largest cohort (in calls) seen in these groups: the fan-out the scaling corrected for."""
    best: dict[str, int] = {}
    seen: dict[tuple[int, int, str], dict[int, CallNode]] = {}
    for g in groups:
        for m in g.members:
            seen.setdefault((g.example, m.rollout, g.role), {})[m.call.id] = m.call
    for (_, _, role), by_id in seen.items():
        size = max(len(c) for c in fanout_cohorts(list(by_id.values())))
        best[role] = max(best.get(role, 0), size)
    return best


# ----------------------------------------------------------------------------------------------------------------
# Role-balanced loss


def role_mass(rows: Sequence, *, unit: str = "tokens", beta: float = 0.0) -> dict[str, float]:
    """Gradient mass per role of one adapter's rows: sum of ``weight x completion tokens`` (``unit="tokens"``) or of
    ``weight`` (``unit="rows"``) over the rows that carry gradient (advantage != 0, or every row when ``beta > 0``).

    Rows are anything with ``role``, ``weight``, ``advantage`` and ``completion_ids`` (``compilers.update.Row``).
    Roles whose rows carry no gradient are present with mass 0.
    """
    if unit not in ("tokens", "rows"):
        raise ValueError(f"unit must be 'tokens' or 'rows', got {unit!r}")
    out: dict[str, float] = {}
    for r in rows:
        out.setdefault(r.role, 0.0)
        if beta > 0 or r.advantage != 0.0:
            out[r.role] += r.weight * (len(r.completion_ids) if unit == "tokens" else 1.0)
    return out


def capped_shares(mass: Mapping[str, float], *, cap: float | None = None) -> dict[str, float]:
    """Target shares by water-filling (module doc): proportional to mass, none above ``cap``; sum 1 over roles with
    mass; roles with no mass get 0."""
    if cap is not None and not 0.0 < cap <= 1.0:
        raise ValueError(f"role share cap must be in (0, 1], got {cap}; None means equal shares")
    for role, m in mass.items():
        if not math.isfinite(m) or m < 0:
            raise ValueError(f"role {role!r} has mass {m}; masses must be finite and >= 0")
    live = [r for r, m in mass.items() if m > 0]
    shares = {r: 0.0 for r in mass}
    if not live:
        return shares
    c = max(cap if cap is not None else 0.0, 1.0 / len(live))  # a cap below 1/m cannot be met: equal shares
    fixed: set[str] = set()
    while True:
        free = [r for r in live if r not in fixed]
        left = 1.0 - c * len(fixed)
        free_mass = sum(mass[r] for r in free)
        trial = {r: left * mass[r] / free_mass for r in free}
        over = [r for r in free if trial[r] > c + 1e-12]
        if not over:
            shares.update({r: c for r in fixed})
            shares.update(trial)
            return shares
        fixed.update(over)


def balance_weights(mass: Mapping[str, float], *, cap: float | None = None) -> dict[str, float]:
    """Per-role row multipliers ``b_r = s_r * M / M_r`` (module doc): after them no role holds more than ``cap`` of
    the mass (``None``: equal shares) and the total mass is unchanged. Roles with no mass get 1.0."""
    shares = capped_shares(mass, cap=cap)
    total = sum(mass.values())
    return {r: (shares[r] * total / m if m > 0 else 1.0) for r, m in mass.items()}


# ----------------------------------------------------------------------------------------------------------------
# Per-role learning rates


def adapter_learning_rates(role_adapters: Mapping[str, str], base_lr: float,
                           role_lrs: Mapping[str, float] | None = None) -> dict[str, float]:
    """Adapter -> learning rate: the rate of its roles (``role_lrs``, else ``base_lr``).

    Raises ``ValueError`` for a rate keyed by an unknown role, and for roles sharing an adapter with different rates.
    """
    role_lrs = dict(role_lrs or {})
    unknown = sorted(set(role_lrs) - set(role_adapters))
    if unknown:
        raise ValueError(f"role_learning_rates names unknown role(s) {unknown}; roles are {sorted(role_adapters)}")
    rates: dict[str, dict[str, float]] = {}
    for role, adapter in role_adapters.items():
        rates.setdefault(adapter, {})[role] = float(role_lrs.get(role, base_lr))
    out = {}
    for adapter, by_role in rates.items():
        if len(set(by_role.values())) > 1:
            raise ValueError(f"roles {sorted(by_role)} share adapter {adapter!r} but have learning rates {by_role}: "
                             "give them one rate, or put them in separate adapters (backend='isolated' or a dict)")
        out[adapter] = next(iter(by_role.values()))
    return out


def check_role_keys(name: str, mapping: Mapping[str, object], roles: Sequence[str]) -> None:
    """``ValueError`` when a per-role config dict names a role the program does not have."""
    unknown = sorted(set(mapping) - set(roles))
    if unknown:
        raise ValueError(f"{name} names unknown role(s) {unknown}; the program's roles are {list(roles)}")


# ----------------------------------------------------------------------------------------------------------------
# Cliff detection


@dataclass(frozen=True)
class Cliff:
    """A detected cliff: the best revision to return to and the evaluations that fell off."""

    best_step: int
    best_accuracy: float
    steps: tuple[int, ...]
    accuracies: tuple[float, ...]


def detect_cliff(evals: Sequence[tuple[int, float]], *, drop: float, patience: int,
                 after_step: int | None = None) -> Cliff | None:
    """The cliff ending at the last evaluation, or ``None`` (rule in the module doc).

    ``evals``: ``(step, accuracy)`` in step order; ``best`` is taken over all of them (before and after a rollback),
    but only evaluations with ``step > after_step`` (the step of the last rollback) count towards ``patience``.
    "More than ``drop`` below" is ``best - acc > drop`` (with a 1e-9 tolerance, so 0.5 vs 0.4 at drop 0.1 is not a
    cliff).
    """
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    if drop < 0:
        raise ValueError(f"drop must be >= 0, got {drop}")
    if not evals:
        return None
    best_step, best = evals[0]
    for step, acc in evals:
        if acc > best:
            best_step, best = step, acc
    tail = []
    for step, acc in reversed(evals):
        if after_step is not None and step <= after_step:
            break
        if best - acc > drop + 1e-9:
            tail.append((step, acc))
        else:
            break
    if len(tail) < patience:
        return None
    tail = tail[:patience][::-1]
    return Cliff(best_step, best, tuple(s for s, _ in tail), tuple(a for _, a in tail))


# ----------------------------------------------------------------------------------------------------------------
# Entropy floor


def entropy_bonus(entropy: Mapping[str, float], *, floor: float | None, coef: float) -> dict[str, float]:
    """Role -> entropy-bonus coefficient of this step: ``coef`` where the role's sampled entropy is below ``floor``,
    else 0.0 (rule in the module doc). ``floor=None`` turns the guard off (every role 0.0)."""
    if not coef >= 0:
        raise ValueError(f"coef must be >= 0 (a bonus, not a penalty), got {coef}")
    if floor is not None and not floor >= 0:
        raise ValueError(f"floor must be >= 0 nats per token (or None: off), got {floor}")
    return {role: coef if floor is not None and h < floor else 0.0 for role, h in entropy.items()}
