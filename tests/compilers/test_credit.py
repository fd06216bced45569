"""Per-role credit on hand-built rollouts: own_output scores answering roles on their own outputs."""

import pytest

from compilers.credit import get_credit
from compilers.group import build_groups
from wfc.rollout import CallNode, RolloutGraph


def exact(example, prediction, trace=None):
    return float(str(prediction.answer).strip() == example.answer)


def node(i, role, inv, outputs, status="ok"):
    return CallNode(id=i, role=role, invocation=inv, messages=[{"role": "user", "content": "q"}], text="t",
                    completion_ids=[1], prompt_ids=[2], logprobs=[0.0], outputs=outputs, status=status,
                    started=2 * i + 1, finished=2 * i + 2)


def voting_rollout(votes, final, status="ok"):
    calls = [node(i, "voter", i, {"answer": v}) for i, v in enumerate(votes)]
    calls.append(node(len(votes), "aggregator", 0, {"answer": final}))
    g = RolloutGraph(calls, example={"question": "2+3?", "answer": "5"}, outputs={"answer": final}, status=status)
    g.reward = exact(type("E", (), {"answer": "5"})(), type("P", (), {"answer": final})())
    return g


def test_own_output_scores_voters_on_their_answers():
    g = voting_rollout(["5", "4"], "4")
    get_credit("own_output")(exact, g, metric_failure_score=None)
    assert [c.reward for c in g.calls] == [1.0, 0.0, 0.0]  # the right voter is credited though the rollout failed
    groups = build_groups([[g, voting_rollout(["4", "4"], "4")]])
    voter0 = [x for x in groups if x.role == "voter" and x.invocation == 0][0]
    assert voter0.rewards == [1.0, 0.0]  # second rollout was not credited: it inherits its reward (0)


def test_inherit_changes_nothing_and_roles_without_task_fields_inherit():
    g = voting_rollout(["5", "5"], "4")
    get_credit("inherit")(exact, g, metric_failure_score=None)
    assert all(c.reward is None for c in g.calls)
    calls = [node(0, "planner", 0, {"subtasks": ["a"]}), node(1, "solver", 0, {"answer": "5"})]
    g2 = RolloutGraph(calls, example={"answer": "5"}, outputs={"answer": "5"})
    g2.reward = 1.0
    get_credit("own_output")(exact, g2, metric_failure_score=None)
    assert [c.reward for c in g2.calls] == [None, 1.0]


def test_failed_rollouts_and_bad_calls_keep_failure_scores():
    g = voting_rollout(["5", "4"], "4", status="crash")
    get_credit("own_output")(exact, g, metric_failure_score=None)
    assert all(c.reward is None for c in g.calls)
    groups = build_groups([[g]], failure_score=-0.1, format_failure_score=-0.5)
    assert all(r == -0.1 for x in groups for r in x.rewards)


def test_unknown_credit_is_an_error():
    with pytest.raises(ValueError, match="own_output"):
        get_credit("blame")
