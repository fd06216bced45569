"""Counterfactual credit (compilers.counterfactual) on scripted Voting runs, against hand-worked tables."""

import threading

import dspy
import pytest

from compilers.counterfactual import ReplayEngine, counterfactual_credit
from compilers.score import score_rollout
from programs import Single, Voting
from wfc.engines import ScriptedEngine
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.lower import run_rollouts

SIG = dspy.Signature("question -> answer", "Answer with a number.")
EX = dspy.Example(question="2+3?", answer="5").with_inputs("question")


def exact(example, prediction, trace=None):
    return float(str(prediction.answer).strip() == example.answer)


class Script:
    """Voters answer from a queue (first the actual run's answers, then what a resample draws); the aggregator says
    "5" only when every candidate says 5, else "4"."""

    def __init__(self, voter_answers):
        self.voters = list(voter_answers)
        self.lock = threading.Lock()
        self.aggregator_calls = 0

    def __call__(self, request: GenerationRequest) -> str:
        last = request.messages[-1]["content"]
        if "Candidates" in last or "candidates" in last:
            with self.lock:
                self.aggregator_calls += 1
            numbers = [line.split(". ", 1)[-1].strip() for line in last.splitlines() if line[:1].isdigit()]
            return "5" if numbers and all(n == "5" for n in numbers) else "4"
        with self.lock:
            return self.voters.pop(0)


def scored_runs(program, script):
    engine = ScriptedEngine(script)
    rollouts = run_rollouts(program, [EX], engine, sampling=SamplingParams(temperature=1.0, max_tokens=4))
    for g in rollouts[0]:
        score_rollout(exact, g, failure_score=0.0, metric_failure_score=None)
    return engine, rollouts


@pytest.mark.parametrize("actual, resampled, voter_credit", [
    (["5", "5"], ["4", "4"], [1.0, 1.0]),  # each right vote was needed: resampled wrong, the answer turns wrong
    (["5", "5"], ["5", "5"], [0.0, 0.0]),  # resampled the same: the vote changed nothing
    (["5", "4"], ["5", "5"], [0.0, -1.0]),  # voter 1's wrong vote cost the right answer; voter 0 made no difference
])
def test_voter_credit_is_the_outcome_difference(actual, resampled, voter_credit):
    script = Script(actual + resampled)
    engine, rollouts = scored_runs(Voting(SIG, n=2), script)
    [g] = rollouts[0]
    stats = counterfactual_credit(Voting(SIG, n=2), [EX], rollouts, engine, metric=exact, roles=["voter"],
                                  adapters=None, sampling=SamplingParams(temperature=1.0, max_tokens=4),
                                  failure_score=0.0, metric_failure_score=None)
    voters = sorted(g.calls_of("voter"), key=lambda c: c.invocation)
    by_answer = {}
    for c in voters:
        by_answer.setdefault(c.outputs["answer"], []).append(c.reward)
    # identical prompts are interchangeable: check credit per answer given, in the table's order
    expected = {}
    for a, credit in zip(actual, voter_credit):
        expected.setdefault(a, []).append(credit)
    assert {a: sorted(v) for a, v in by_answer.items()} == {a: sorted(v) for a, v in expected.items()}
    assert stats["runs"] == 2
    # each run resampled one voter (1 token + EOS-less bytes) and re-ran the aggregator only if its prompt changed
    assert stats["completion_tokens"] >= 2
    assert g.calls_of("aggregator")[0].reward is None  # not credited: not in roles


def test_aggregator_counterfactual_replays_the_voters():
    script = Script(["5", "5"])
    engine, rollouts = scored_runs(Voting(SIG, n=2), script)
    calls_before = len(engine.calls)
    stats = counterfactual_credit(Voting(SIG, n=2), [EX], rollouts, engine, metric=exact, roles=["aggregator"],
                                  adapters=None, sampling=SamplingParams(temperature=1.0, max_tokens=4),
                                  failure_score=0.0, metric_failure_score=None)
    [g] = rollouts[0]
    assert g.calls_of("aggregator")[0].reward == 0.0  # the deterministic aggregator says 5 again
    assert len(engine.calls) - calls_before == 1  # only the aggregator was generated; both voters replayed
    assert stats == {"runs": 1, "completion_tokens": 1}


def test_single_role_and_failed_rollouts():
    engine = ScriptedEngine(["5", "4"])
    rollouts = run_rollouts(Single(SIG), [EX], engine, sampling=SamplingParams(temperature=1.0, max_tokens=4))
    [g] = rollouts[0]
    score_rollout(exact, g, failure_score=0.0, metric_failure_score=None)
    counterfactual_credit(Single(SIG), [EX], rollouts, engine, metric=exact, roles=["*"], adapters=None,
                          sampling=SamplingParams(temperature=1.0, max_tokens=4), failure_score=0.0,
                          metric_failure_score=None)
    assert g.calls[0].reward == 1.0  # 1 (actual "5") - 0 (resampled "4")
    g.status = "crash"
    g.calls[0].reward = None
    stats = counterfactual_credit(Single(SIG), [EX], rollouts, engine, metric=exact, roles=["*"], adapters=None,
                                  sampling=SamplingParams(), failure_score=0.0, metric_failure_score=None)
    assert stats["runs"] == 0 and g.calls[0].reward is None
    with pytest.raises(ValueError, match="one example per list"):
        counterfactual_credit(Single(SIG), [], rollouts, engine, metric=exact, roles=["*"], adapters=None,
                              sampling=SamplingParams(), failure_score=0.0, metric_failure_score=None)


def test_replay_engine_hands_out_recorded_generations_then_samples():
    engine = ScriptedEngine(["fresh"])
    _, rollouts = scored_runs(Voting(SIG, n=2), Script(["5", "5"]))
    [g] = rollouts[0]
    voter0, voter1 = sorted(g.calls_of("voter"), key=lambda c: c.id)
    replay = ReplayEngine(engine, g.calls, voter1)
    req = GenerationRequest(messages=tuple(voter0.messages), adapter=voter0.adapter)
    assert replay.submit(req).result().text == "5"  # voter 0's recorded generation
    assert replay.submit(req).result().text == "fresh"  # the resampled call reaches the engine
    assert [x.text for x in replay.generated] == ["fresh"]


def test_compile_with_counterfactual_credit_on_the_tiny_model(engine, tmp_path):
    """The real path: tiny HF model, Voting, counterfactual credit for the aggregator; its cost is in the step log
    and in the token budget, and the adapters train."""
    from tiny_setup import SIG as TSIG, TRAIN, length_metric, tiny_config  # tests/compilers is on the path

    from compilers import MMGRPO

    compiled = MMGRPO(length_metric, **tiny_config(steps=1, counterfactual_roles=["aggregator"])).compile(
        Voting(TSIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine, run_dir=tmp_path / "run",
        progress=False)
    [step] = [r for r in compiled.manifest.history if r["kind"] == "step"]
    cf = step["drawing"]["counterfactual"]
    assert cf["runs"] == step["rollouts"]  # one rerun per aggregator call (one per rollout)
    assert cf["completion_tokens"] > 0
    assert step["drawing"]["completion_tokens"] >= cf["completion_tokens"]
    with pytest.raises(ValueError, match="counterfactual_roles names unknown"):
        MMGRPO(length_metric, **tiny_config(steps=1, counterfactual_roles=["judge"])).compile(
            Voting(TSIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "bad", progress=False)
