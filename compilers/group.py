"""Grouping: LM calls of the rollouts of a step -> mmGRPO groups, one per (example, role path, invocation index).

Members of a group come from the ``group_size`` rollouts of one example: the k-th call of role R in each of them.
Each call inherits its rollout's reward unless a credit rule (``compilers.credit``) gave it its own, except:
- a call whose output failed to parse scores ``format_failure_score`` (it stays in its group: nothing is dropped);
- every call of a crashed rollout scores ``failure_score`` (the calls made before the crash are kept);
- a call cut at its token budget (``finish_reason == "length"``) scores its reward less ``overlong_penalty`` (DAPO's
  overlong shaping, as a flat penalty: a right answer that ran out of tokens still beats a wrong one, and a finished
  one beats both; without it a model drifting into restating the question gets its answers cut off);
- a call credit marked ``no_credit`` (nothing it could have changed, e.g. a selector shown no correct candidate) joins
  no group.

Roles called a variable number of times per rollout follow a mode (a small registry):
- ``truncate``: keep invocation indices every rollout reached (the fewest calls);
- ``fill``: rollouts with fewer calls repeat their last call so every group has all ``group_size`` members;
- ``ragged``: a group holds whichever rollouts made that call (uneven groups; size-1 groups carry no signal).

``pool_fanout``: the groups of one (example, role) whose members all saw one same prompt are merged into one
group (keyed by the lowest invocation). Voting's voters are k exchangeable samples of one prompt per rollout: pooled,
the k x group_size answers share one baseline instead of k baselines of group_size each (fewer flat groups, less
noise). Groups of calls that saw different prompts (a generator's second round, a worker's own subtask) never merge.

Invariant: groups are keyed by role path, never by signature; members keep a reference to their CallNode; a member's
key (``compilers.guards.member_key``) is (example, role, its own invocation, rollout), unique in a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from wfc.rollout import CallNode, RolloutGraph


@dataclass(frozen=True)
class Member:
    call: CallNode
    reward: float
    rollout: int  # index of the rollout within its example's rollouts
    repeated: bool = False  # a `fill` copy
    invocation: int | None = None  # its own invocation index when pooled into another's group (see pool_fanout)


@dataclass
class Group:
    example: int
    role: str
    invocation: int
    members: list[Member] = field(default_factory=list)
    advantages: list[float] | None = None  # None: not scored yet (not the same as zeros)
    no_signal: bool | None = None

    @property
    def rewards(self) -> list[float]:
        return [m.reward for m in self.members]


def call_reward(graph: RolloutGraph, call: CallNode, *, failure_score: float, format_failure_score: float,
                overlong_penalty: float = 0.0) -> float:
    """The reward a call inherits from its rollout (see module doc), less ``overlong_penalty`` when the call was cut
    at its token budget (``finish_reason == "length"``)."""
    if call.status == "format_error":
        return format_failure_score
    if graph.status == "crash" or call.status == "crash":
        return failure_score
    if graph.reward is None:
        raise ValueError("rollout is not scored: score every rollout before grouping")
    if graph.status == "format_error":
        return failure_score
    reward = call.reward if call.reward is not None else graph.reward
    return reward - overlong_penalty if call.finish_reason == "length" else reward


def _truncate(per_rollout: list[list[Member]]) -> list[list[Member]]:
    depth = min(len(calls) for calls in per_rollout)
    return [[calls[k] for calls in per_rollout] for k in range(depth)]


def _fill(per_rollout: list[list[Member]]) -> list[list[Member]]:
    depth = max(len(calls) for calls in per_rollout)
    groups = []
    for k in range(depth):
        members = []
        for calls in per_rollout:
            if not calls:
                continue  # a rollout that never called this role has nothing to repeat
            if k < len(calls):
                members.append(calls[k])
            else:
                last = calls[-1]
                members.append(Member(last.call, last.reward, last.rollout, repeated=True))
        groups.append(members)
    return groups


def _ragged(per_rollout: list[list[Member]]) -> list[list[Member]]:
    depth = max(len(calls) for calls in per_rollout)
    return [[calls[k] for calls in per_rollout if k < len(calls)] for k in range(depth)]


GROUPING: dict[str, Callable[[list[list[Member]]], list[list[Member]]]] = {
    "truncate": _truncate,
    "fill": _fill,
    "ragged": _ragged,
}


def build_groups(rollouts: Sequence[Sequence[RolloutGraph]], *, mode: str = "ragged", failure_score: float = 0.0,
                 format_failure_score: float = -0.5, pool_fanout: bool = False,
                 overlong_penalty: float = 0.0) -> list[Group]:
    """Groups for one step. ``rollouts[e]`` are the rollouts of example ``e``; every one must be scored."""
    if mode not in GROUPING:
        raise ValueError(f"grouping mode {mode!r} is unknown: use one of {sorted(GROUPING)}")
    groups: list[Group] = []
    for e, graphs in enumerate(rollouts):
        role_order: dict[str, None] = {}
        for g in graphs:
            for r in g.roles:
                role_order.setdefault(r, None)
        for role in role_order:
            per_rollout = []
            for i, g in enumerate(graphs):
                calls = []
                for c in g.calls_of(role):
                    if c.no_credit and c.status == "ok":
                        continue  # credit left it out (compilers.credit): it joins no group
                    reward = call_reward(g, c, failure_score=failure_score, format_failure_score=format_failure_score,
                                         overlong_penalty=overlong_penalty)
                    if not math.isfinite(reward):
                        raise ValueError(f"non-finite reward {reward} for example {e}, role {role!r}")
                    calls.append(Member(c, reward, i))
                per_rollout.append(calls)
            mine = [Group(example=e, role=role, invocation=k, members=members)
                    for k, members in enumerate(GROUPING[mode](per_rollout)) if members]
            groups.extend(_pool(mine) if pool_fanout else mine)
    return groups


def _pool(groups: list[Group]) -> list[Group]:
    """Merge the groups (of one example and role) whose members all saw one same prompt; others stay as they are."""
    out: list[Group] = []
    by_prompt: dict[tuple, Group] = {}
    for g in groups:
        prompts = {tuple(m.call.prompt_ids) for m in g.members}
        if len(prompts) != 1:
            out.append(g)
            continue
        (prompt,) = prompts
        members = [Member(m.call, m.reward, m.rollout, m.repeated, g.invocation) for m in g.members]
        if prompt in by_prompt:
            by_prompt[prompt].members.extend(members)
        else:
            by_prompt[prompt] = Group(example=g.example, role=g.role, invocation=g.invocation, members=members)
            out.append(by_prompt[prompt])
    return out
