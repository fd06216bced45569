"""Grouping per (example, role path, invocation) on hand-built rollouts: modes and failure handling."""

import pytest

from compilers.advantages import group_advantages
from compilers.group import build_groups, call_reward
from compilers.guards import fanout_weights
from compilers.sampling import signal_examples
from wfc.rollout import CallNode, RolloutGraph


def call(i, role, inv, status="ok", text="x"):
    return CallNode(id=i, role=role, invocation=inv, messages=[{"role": "user", "content": "q"}], text=text,
                    completion_ids=[1, 2], prompt_ids=[5], logprobs=[0.0, 0.0], status=status,
                    outputs={"answer": text} if status == "ok" else None, started=2 * i + 1, finished=2 * i + 2)


def rollout(calls, reward, status="ok"):
    g = RolloutGraph(calls, example={"question": "q"}, outputs={"answer": "a"}, status=status)
    g.reward = reward
    return g


def worker_rollouts():
    # example 0: three rollouts; role `worker` called 1, 3 and 2 times; `synth` once each.
    r0 = rollout([call(0, "worker", 0), call(1, "synth", 0)], 1.0)
    r1 = rollout([call(0, "worker", 0), call(1, "worker", 1), call(2, "worker", 2), call(3, "synth", 0)], 0.0)
    r2 = rollout([call(0, "worker", 0), call(1, "worker", 1), call(2, "synth", 0)], 0.5)
    return [[r0, r1, r2]]


def sizes(groups, role):
    return [len(g.members) for g in groups if g.role == role]


def test_modes_on_variable_call_counts():
    # worker calls per rollout: 1, 3, 2
    assert sizes(build_groups(worker_rollouts(), mode="truncate"), "worker") == [3]
    assert sizes(build_groups(worker_rollouts(), mode="ragged"), "worker") == [3, 2, 1]
    filled = build_groups(worker_rollouts(), mode="fill")
    assert sizes(filled, "worker") == [3, 3, 3]
    # invocation 2 in fill mode: r0 repeats its only call, r2 repeats its second call
    g2 = [g for g in filled if g.role == "worker" and g.invocation == 2][0]
    assert [m.repeated for m in g2.members] == [True, False, True]
    assert g2.rewards == [1.0, 0.0, 0.5]
    assert sizes(filled, "synth") == [3]


def test_groups_keyed_by_role_path_and_invocation():
    groups = build_groups(worker_rollouts(), mode="ragged")
    keys = [(g.example, g.role, g.invocation) for g in groups]
    assert keys == [(0, "worker", 0), (0, "worker", 1), (0, "worker", 2), (0, "synth", 0)]
    assert all(g.advantages is None for g in groups)  # not scored yet is None, not zeros


def test_format_error_call_stays_with_format_failure_score():
    r0 = rollout([call(0, "voter", 0, status="format_error", text="garbage"), call(1, "voter", 1)], 1.0)
    r1 = rollout([call(0, "voter", 0), call(1, "voter", 1)], 0.0)
    groups = build_groups([[r0, r1]], mode="ragged", failure_score=0.0, format_failure_score=-0.5)
    g0 = groups[0]
    assert g0.rewards == [-0.5, 0.0]
    assert g0.members[0].call.text == "garbage"


def test_crashed_rollout_keeps_calls_with_failure_score():
    crashed = rollout([call(0, "gen", 0), call(1, "eval", 0, status="crash")], None, status="crash")
    ok = rollout([call(0, "gen", 0), call(1, "eval", 0)], 1.0)
    groups = build_groups([[crashed, ok]], failure_score=-0.1, format_failure_score=-0.5)
    assert [g.rewards for g in groups] == [[-0.1, 1.0], [-0.1, 1.0]]


def test_unscored_rollout_and_bad_mode_are_errors():
    with pytest.raises(ValueError, match="score every rollout"):
        build_groups([[rollout([call(0, "a", 0)], None)]])
    with pytest.raises(ValueError, match="truncate"):
        build_groups(worker_rollouts(), mode="bogus")


def test_call_reward_inherits_rollout_reward():
    g = rollout([call(0, "a", 0)], 0.75)
    assert call_reward(g, g.calls[0], failure_score=0.0, format_failure_score=-1.0) == 0.75


def voting_rollouts():
    """Two rollouts of one example: three voters on one prompt (own rewards [1, 0, 0] and [0, 0, 0]) and an
    aggregator whose prompt differs per rollout."""
    def voter(i, reward):
        c = call(i, "voter", i)
        c.prompt_ids, c.reward = [7, 7], reward
        return c

    def agg(prompt):
        c = call(3, "aggregator", 0)
        c.prompt_ids = prompt
        return c

    r0 = rollout([voter(0, 1.0), voter(1, 0.0), voter(2, 0.0), agg([8, 1])], 1.0)
    r1 = rollout([voter(0, 0.0), voter(1, 0.0), voter(2, 0.0), agg([8, 2])], 0.0)
    return [[r0, r1]]


def test_pooled_fanout_groups_by_hand():
    """Unpooled the voters form three groups of two ([1, 0], [0, 0], [0, 0]: two flat); pooled, one group of six
    ([1, 0, 0, 0, 0, 0]: mean 1/6, Dr. GRPO advantages 5/6 and -1/6). Each pooled member keeps its own invocation,
    so member keys stay unique and fan-out weights (1/3 per voter row) still sum to 1 per rollout. The aggregator's
    prompts differ, so its group is never pooled."""
    from compilers.advantages import group_advantages
    from compilers.guards import fanout_weights, member_key

    plain = build_groups(voting_rollouts())
    assert [(g.role, g.invocation, g.rewards) for g in plain if g.role == "voter"] == [
        ("voter", 0, [1.0, 0.0]), ("voter", 1, [0.0, 0.0]), ("voter", 2, [0.0, 0.0])]
    pooled = build_groups(voting_rollouts(), pool_fanout=True)
    (voters,) = [g for g in pooled if g.role == "voter"]
    assert voters.invocation == 0 and voters.rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [m.invocation for m in voters.members] == [0, 0, 1, 1, 2, 2]
    assert group_advantages(voters.rewards, "dr_grpo").advantages == pytest.approx([5 / 6] + [-1 / 6] * 5)
    assert [g.rewards for g in pooled if g.role == "aggregator"] == [[1.0, 0.0]]
    keys = [member_key(voters, m) for m in voters.members]
    assert len(set(keys)) == 6
    weights = fanout_weights(pooled)
    for rollout_index in (0, 1):
        assert sum(w for k, w in weights.items() if k[1] == "voter" and k[3] == rollout_index) == pytest.approx(1.0)
        assert all(w == pytest.approx(1 / 3) for k, w in weights.items() if k[1] == "voter")


def test_pooling_leaves_groups_of_differing_prompts_alone():
    """Workers of one rollout get different subtasks (prompts): nothing merges, pooled or not."""
    rollouts = worker_rollouts()
    for graphs in rollouts:
        for g in graphs:
            for c in g.calls:
                c.prompt_ids = [c.id, c.invocation, 9]
    plain = [(g.role, g.invocation, g.rewards) for g in build_groups(rollouts)]
    assert [(g.role, g.invocation, g.rewards) for g in build_groups(rollouts, pool_fanout=True)] == plain


def test_overlong_penalty_by_hand():
    # four voters' calls, one group: (right, finished) 1.0; (right, cut) 1 - 0.3; (wrong, cut) 0 - 0.3;
    # (format error, cut) stays -0.5: a call that broke the format is not also charged for its length
    calls = [call(0, "voter", 0), call(0, "voter", 0), call(0, "voter", 0), call(0, "voter", 0, status="format_error")]
    for c, reason in zip(calls, ["stop", "length", "length", "length"]):
        c.finish_reason = reason
    rollouts = [rollout([c], r) for c, r in zip(calls, [1.0, 1.0, 0.0, 1.0])]
    (group,) = build_groups([rollouts], overlong_penalty=0.3)
    assert group.rewards == pytest.approx([1.0, 0.7, -0.3, -0.5])
    (plain,) = build_groups([rollouts])  # off by default: the length of a call does not count
    assert plain.rewards == [1.0, 1.0, 0.0, -0.5]


def test_groups_of_unequal_sizes_across_examples():
    # adaptive rollouts: 5 rollouts of a hard example, 2 of an easy one, 2 of a flat one; each group is one example's
    rollouts = [[rollout([call(0, "r", 0)], x) for x in rewards] for rewards in ([0, 0, 0, 0, 1], [1, 0], [1, 1])]
    groups = build_groups(rollouts)
    assert [(g.example, len(g.members)) for g in groups] == [(0, 5), (1, 2), (2, 2)]
    assert [[m.rollout for m in g.members] for g in groups] == [[0, 1, 2, 3, 4], [0, 1], [0, 1]]
    scored = [group_advantages(g.rewards, "dr_grpo") for g in groups]
    assert scored[0].advantages == pytest.approx([-0.2, -0.2, -0.2, -0.2, 0.8])  # mean 0.2 of its own five
    assert scored[1].advantages == pytest.approx([0.5, -0.5])
    assert scored[2].advantages == [0.0, 0.0] and scored[2].no_signal
    assert signal_examples(groups, 3) == [True, True, False]
    assert set(fanout_weights(groups).values()) == {1.0}  # one call per rollout: no fan-out weights
