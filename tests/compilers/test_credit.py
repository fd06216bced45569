"""Per-role credit on hand-built rollouts: own_output scores answering roles on their own outputs."""

import dspy
import pytest

from compilers.credit import get_credit
from compilers.group import build_groups
from programs import EvalOpt
from wfc.lower import trace
from wfc.rollout import CallNode, RolloutGraph
from wfc.verdict import read_verdict


def exact(example, prediction, trace=None):
    return float(str(prediction.answer).strip() == example.answer)


def node(i, role, inv, outputs, status="ok"):
    return CallNode(id=i, role=role, invocation=inv, messages=[{"role": "user", "content": "q"}], text="t",
                    completion_ids=[1], prompt_ids=[2], logprobs=[0.0], outputs=outputs, status=status,
                    started=2 * i + 1, finished=2 * i + 2)


def voting_rollout(votes, final, status="ok"):
    calls = [node(i, "voter", i, {"answer": v}) for i, v in enumerate(votes)]
    calls.append(node(len(votes), "aggregator", 0, {"answer": final}))
    calls[-1].messages = [{"role": "user", "content": "2+3?\nCandidates: " + ", ".join(votes)}]  # fed by the voters
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


def nan_metric(example, prediction, trace=None):
    return float("nan") if prediction.answer == "4" else 1.0


def test_own_output_nan_metric_scores_the_failure_or_names_the_example():
    from compilers.score import MetricError

    g = voting_rollout(["5", "4"], "5")
    get_credit("own_output")(nan_metric, g, metric_failure_score=-0.25)
    assert [c.reward for c in g.calls] == [1.0, -0.25, 1.0]
    build_groups([[g]])  # finite rewards: grouping no longer fails with "non-finite reward nan"
    with pytest.raises(MetricError, match="metric_failure_score"):
        get_credit("own_output")(nan_metric, voting_rollout(["5", "4"], "5"), metric_failure_score=None)


def test_verified_selector_without_a_right_candidate_gets_no_credit():
    # hand-worked: votes 4,4 -> aggregator had nothing right to pick, left out; votes 5,4 -> scored on its own answer
    flat = voting_rollout(["4", "4"], "4")
    get_credit("verified")(exact, flat, metric_failure_score=None)
    assert [c.reward for c in flat.calls] == [0.0, 0.0, 0.0] and [c.no_credit for c in flat.calls] == [False] * 2 + [True]
    picked_wrong = voting_rollout(["5", "4"], "4")
    get_credit("verified")(exact, picked_wrong, metric_failure_score=None)
    assert [c.reward for c in picked_wrong.calls] == [1.0, 0.0, 0.0] and not picked_wrong.calls[2].no_credit
    groups = build_groups([[flat, picked_wrong]])
    agg = [x for x in groups if x.role == "aggregator"][0]
    assert [m.rollout for m in agg.members] == [1] and agg.rewards == [0.0]


def judge_rollout(answer, verdict):
    calls = [node(0, "generator", 0, {"answer": answer}),
             CallNode(id=1, role="evaluator", invocation=0, messages=[{"role": "user", "content": f"A: {answer}"}],
                      text=verdict, outputs={"verdict": verdict}, started=3, finished=4)]
    g = RolloutGraph(calls, example={"question": "2+3?", "answer": "5"}, outputs={"answer": answer})
    g.reward = float(answer == "5")
    return g


@pytest.mark.parametrize("answer,verdict,reward", [
    ("5", "correct", 1.0), ("5", "incorrect: off by one", 0.0), ("4", "incorrect, 2+3 is 5", 1.0),
    ("4", "Yes", 0.0), ("4", "hmm", None),
])
def test_verified_judge_is_scored_on_agreeing_with_the_gold_answer(answer, verdict, reward):
    g = judge_rollout(answer, verdict)
    get_credit("verified")(exact, g, metric_failure_score=None)
    assert g.calls[0].reward == float(answer == "5")
    assert g.calls[1].reward == reward  # None: unreadable verdict inherits the rollout's reward


@pytest.mark.parametrize("answer,verdict,reward", [
    ("5", "correct", 1.0), ("4", "incorrect, 2+3 is 5", 1.0), ("4", "Yes", 0.0),
    # hand-worked: unreadable reads as the reject EvalOpt acted on: right after a wrong answer, wrong after a right one
    ("4", "hmm", 1.0), ("5", "The sum is correct.", 0.0), ("5", "", 0.0),
])
def test_verified_strict_scores_an_unreadable_verdict_as_a_reject(answer, verdict, reward):
    g = judge_rollout(answer, verdict)
    get_credit("verified-strict")(exact, g, metric_failure_score=None)
    assert [c.reward for c in g.calls] == [float(answer == "5"), reward]


def evalopt_rollout(first, verdict, revised):
    """EvalOpt, one round: generator -> evaluator (shown the answer) -> optimizer (shown the answer and verdict)."""
    calls = [node(0, "generator", 0, {"answer": first}), node(1, "evaluator", 0, {"verdict": verdict}),
             node(2, "optimizer", 0, {"answer": revised})]
    calls[1].messages = [{"role": "user", "content": f"2+3?\nproposed: {first}"}]
    calls[2].messages = [{"role": "user", "content": f"2+3?\nprevious: {first}\nfeedback: {verdict}"}]
    g = RolloutGraph(calls, example={"question": "2+3?", "answer": "5"}, outputs={"answer": revised})
    g.reward = float(revised == "5")
    return g


@pytest.mark.parametrize("first,revised,rewards", [
    ("4", "5", [0.0, 1.0, 1.0]),  # fixed: the optimizer learns "right" although nothing right was shown to it
    ("4", "6", [0.0, 1.0, 0.0]),  # not fixed: scored wrong, not left out
    ("5", "4", [1.0, 0.0, 0.0]),  # broke a right answer (the evaluator wrongly rejected it)
    ("5", "5", [1.0, 0.0, 1.0]),
])
def test_verified_reviser_fed_by_one_answer_is_always_scored_on_its_own(first, revised, rewards):
    # hand-worked: the optimizer is fed by one answer (the generator's), so it is a reviser, not a selector
    g = evalopt_rollout(first, "incorrect", revised)
    get_credit("verified")(exact, g, metric_failure_score=None)
    assert g.graph.has_edge(0, 2)  # the optimizer's prompt holds the generator's answer
    assert [c.reward for c in g.calls] == rewards
    assert [c.no_credit for c in g.calls] == [False, False, False]
    groups = build_groups([[g]])
    assert [x.rewards for x in groups if x.role == "optimizer"] == [[rewards[2]]]


@pytest.mark.parametrize("verdict", ["Right, but check the carry", "correctly adds", "yes", "no: it is 5",
                                     "The sum is correct."])
def test_verified_judge_is_scored_on_the_decision_the_program_acted_on(verdict, fake_engine):
    """EvalOpt stops exactly when credit reads its evaluator's verdict as accept, so the judge learns from what it
    did: wrong answer "4" accepted scores 0, rejected (the optimizer then runs) scores 1, unreadable inherits."""
    engine = fake_engine(by_system={"Check the proposed solution": verdict, "A reviewer found": "5", "Solve": "4"})
    example = dspy.Example(question="2+3?", answer="5").with_inputs("question")
    g = trace(EvalOpt(dspy.Signature("question -> answer", "Solve the arithmetic problem."), rounds=1), example, engine)
    g.reward = exact(example, type("P", (), g.outputs)())
    get_credit("verified")(exact, g, metric_failure_score=0.0)
    judge = g.calls_of("evaluator")[0]
    stopped = not g.calls_of("optimizer")
    assert stopped is (read_verdict(verdict) is True)
    assert judge.reward == {True: 0.0, False: 1.0, None: None}[read_verdict(verdict)]  # None: inherits the rollout's
    get_credit("verified-strict")(exact, g, metric_failure_score=0.0)
    assert judge.reward == (0.0 if stopped else 1.0)  # strict: whatever did not stop the loop was a reject
