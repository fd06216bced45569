"""The tracer (wfc.lower): rollout-graph invariants on the tiny real model, and failure/attribution cases on a
scripted engine."""

from __future__ import annotations

import math

import dspy
import pytest

from programs import EvalOpt, OrchWorkers, Single, Voting
from wfc.engines.base import SamplingParams
from wfc.lower import derive_seed, roles, run_rollouts, trace
from wfc.models import ModelNotFoundError
from wfc.rolegraph import RoleGraph

QA = dspy.Signature("question -> answer", "Solve the arithmetic problem.")
SHORT = SamplingParams(temperature=1.0, max_tokens=6)


# ----- invariants on the tiny real model ----------------------------------------------------------------------------
@pytest.mark.parametrize("program", [Single(QA), Voting(QA, n=2), EvalOpt(QA, rounds=1), OrchWorkers(QA)],
                         ids=["single", "voting", "evalopt", "orchworkers"])
def test_nodes_hold_exactly_what_the_engine_saw(program, tiny_engine):
    g = trace(program, {"question": "What is 2 + 3?"}, tiny_engine, sampling=SHORT)
    assert g.calls, "every program makes at least one call"
    assert [c.id for c in g.calls] == list(range(len(g.calls)))  # ids follow submission order
    tok = tiny_engine.tokenizer
    for node in g.calls:
        assert node.status != "crash", node.error
        assert node.prompt_ids == tiny_engine.encode_prompt(node.messages)
        assert 1 <= len(node.completion_ids) <= SHORT.max_tokens
        assert len(node.logprobs) == len(node.completion_ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in node.logprobs)
        assert tok.decode(node.completion_ids, skip_special_tokens=True) == node.text
        assert node.temperature == SHORT.temperature and node.started < node.finished
    assert set(g.roles) <= set(roles(program))


def test_voting_batches_its_voters_into_one_generate_call(tiny_handle):
    from wfc.engines.hf import HFEngine

    engine = HFEngine(tiny_handle, batch_wait_s=0.5)  # own engine: exact stats; slack for a busy machine
    try:
        g = trace(Voting(QA, n=4), {"question": "What is 2 + 3?"}, engine, sampling=SHORT)
    finally:
        engine.close()
    assert g.status != "crash", g.error
    assert engine.stats["generate_calls"] == 2  # 4 voters in one batch, then the aggregator
    assert engine.stats["batch_sizes"] == [4, 1]
    assert g.fan_out("voter") == 4 and g.fan_out("aggregator") == 1
    assert [c.invocation for c in g.calls_of("voter")] == [0, 1, 2, 3]


def test_unknown_model_name():
    from wfc.engines.hf import HFEngine

    with pytest.raises(ModelNotFoundError, match="unknown model 'no-such-model'"):
        HFEngine("no-such-model")


# ----- scripted: attribution, variable calls, failures --------------------------------------------------------------
def test_orchworkers_variable_worker_counts(fake_engine):
    plans = iter(["add the numbers", "read\nadd\ncheck"])
    engine = fake_engine(by_system={
        "Break the task": lambda r: next(plans),
        "Solve this one subtask": "partial",  # echoes nothing of the plan, so no orchestrator -> synthesizer edge
        "Use the results": "5",
    })
    graphs = [trace(OrchWorkers(QA), {"question": "2 + 3?"}, engine) for _ in range(2)]
    assert [len(g.calls_of("worker")) for g in graphs] == [1, 3]
    assert all(g.status == "ok" and g.outputs == {"answer": "5"} for g in graphs)
    subtasks = sorted(c.messages[-1]["content"].split("Subtask: ")[-1].splitlines()[0] for c in graphs[1].calls_of("worker"))
    assert subtasks == ["add", "check", "read"]  # one worker call per subtask (submission order is the threads')
    rg = RoleGraph.from_rollouts(graphs)
    worker = rg.stats("worker")
    assert (worker.calls_min, worker.calls_max, worker.calls_mean) == (1, 3, 2.0)
    assert rg.stats("orchestrator").calls_min == rg.stats("orchestrator").calls_max == 1
    assert {(e.src, e.dst) for e in rg.edges} == {("orchestrator", "worker"), ("worker", "synthesizer")}


class _Typed(dspy.Module):
    def __init__(self, signature):
        super().__init__()
        self.judge = dspy.Predict(signature)

    def forward(self, question):
        return self.judge(question=question)


@pytest.mark.parametrize("signature, text", [("question -> count: int", "many"), ("question -> ok: bool", "maybe")])
def test_unparseable_output_is_a_format_error_node_with_raw_text(signature, text, fake_engine):
    g = trace(_Typed(dspy.Signature(signature)), {"question": "how many?"}, fake_engine([text]))
    (node,) = g.calls
    assert node.status == "format_error" and node.text == text and node.outputs is None
    assert node.error and node.completion_ids  # the raw completion is kept for the format penalty
    assert g.status == "format_error" and g.outputs is None and g.error


def test_empty_completion_is_a_format_error_node(fake_engine):
    g = trace(_Typed(dspy.Signature("question -> answer")), {"question": "?"}, fake_engine([""]))
    assert g.status == "format_error"  # DSPy's verdict
    assert g.calls[0].status == "format_error" and g.calls[0].outputs is None  # the node agrees


def test_parseable_typed_output_is_ok(fake_engine):
    g = trace(_Typed(dspy.Signature("question -> ok: bool")), {"question": "?"}, fake_engine(["Yes."]))
    assert g.status == "ok" and g.calls[0].outputs == {"ok": True} and g.outputs == {"ok": True}


def test_engine_failure_in_one_role_is_a_crash_node_and_earlier_nodes_are_kept(fake_engine):
    def down(request):
        raise RuntimeError("engine down")

    engine = fake_engine(by_system={"Check the proposed solution": down, "Solve": "5"})
    g = trace(EvalOpt(QA, rounds=2), {"question": "2 + 3?"}, engine)
    assert [(c.role, c.status) for c in g.calls] == [("generator", "ok"), ("evaluator", "crash")]
    assert g.calls[0].text == "5" and "engine down" in g.calls[1].error
    assert g.status == "crash" and "engine down" in g.error


class _Raises(dspy.Module):
    def __init__(self):
        super().__init__()
        self.planner = dspy.Predict(QA)

    def forward(self, question):
        self.planner(question=question)
        raise RuntimeError("bad plan")


def test_program_that_raises_is_a_crashed_rollout_with_its_calls(fake_engine):
    g = trace(_Raises(), {"question": "?"}, fake_engine(["a plan"]))
    assert g.status == "crash" and "RuntimeError: bad plan" in g.error
    assert [(c.role, c.status, c.text) for c in g.calls] == [("planner", "ok", "a plan")]


class _SameSignatureTwice(dspy.Module):
    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict(QA)
        self.check = dspy.Predict(QA)  # the very same Signature class: still a second role

    def forward(self, question):
        drafted = self.draft(question=question).answer
        return self.check(question=f"{question} Draft: {drafted}")


def test_roles_from_the_same_signature_class_stay_distinct(fake_engine):
    program = _SameSignatureTwice()
    assert list(roles(program)) == ["draft", "check"]
    engine = fake_engine(lambda r: "checked" if "Draft:" in r.messages[-1]["content"] else "drafted")
    g = trace(program, {"question": "2 + 3?"}, engine, adapters={"draft": "A", "check": "B"})
    assert [(c.role, c.adapter, c.text) for c in g.calls] == [("draft", "A", "drafted"), ("check", "B", "checked")]
    assert [r.adapter for r in engine.calls] == ["A", "B"]  # routed to each role's own adapter
    assert list(g.graph.edges) == [(0, 1)]
    assert g.outputs == {"answer": "checked"}


def test_program_without_predictors_is_rejected(fake_engine):
    class Empty(dspy.Module):
        def forward(self, question):
            return question

    with pytest.raises(ValueError, match="no predictors"):
        roles(Empty())
    with pytest.raises(ValueError, match="no predictors"):
        run_rollouts(Empty(), [{"question": "?"}], fake_engine(["x"]))
    with pytest.raises(TypeError, match="dspy.Module"):
        roles(lambda question: question)


def test_run_rollouts_groups_by_example_in_input_order(fake_engine):
    engine = fake_engine(lambda r: r.messages[-1]["content"].splitlines()[0].upper())
    out = run_rollouts(Single(QA), [{"question": "a"}, {"question": "b"}], engine, repeats=3)
    assert [[g.outputs["answer"] for g in gs] for gs in out] == [["A"] * 3, ["B"] * 3]
    assert all(g.example == {"question": q} for q, gs in zip("ab", out) for g in gs)


def test_derive_seed_is_stable_distinct_and_31_bits():
    # a fixed value: the derivation must not change between runs or processes (hash() would)
    assert derive_seed(0, "rollout", 1, 7) == 1001212228
    seeds = {derive_seed(s, "vote", i) for s in range(20) for i in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**31 for s in seeds)
    assert derive_seed(1, 23) != derive_seed(12, 3)  # parts are separated, not concatenated


def test_seeded_rollouts_give_each_call_its_own_seed(fake_engine):
    """run_rollouts(seeds=...): rollout r of example i traces with derive_seed(seeds[i], r), and each call asks the
    engine for derive_seed(rollout seed, role, branch path, count in the branch); unseeded runs send no seed."""
    seen = []

    def answer(request):
        seen.append((request.messages[-1]["content"].splitlines()[0], request.seed))
        return "4"

    program = Voting(QA, n=2)
    run_rollouts(program, [{"question": "a"}, {"question": "b"}], fake_engine(answer), repeats=2, seeds=[10, 20],
                 sampling=SamplingParams(temperature=0.7))
    want = {(q, derive_seed(derive_seed(s, r), "voter", (k,), 0)) for q, s in (("a", 10), ("b", 20))
            for r in range(2) for k in range(2)}
    assert {x for x in seen if x in want} == want
    seen.clear()
    run_rollouts(program, [{"question": "a"}], fake_engine(answer), sampling=SamplingParams(temperature=0.7))
    assert seen and all(seed is None for _, seed in seen)
    with pytest.raises(ValueError, match="one per example"):
        run_rollouts(program, [{"question": "a"}], fake_engine(answer), seeds=[1, 2])


def test_fan_out_calls_are_numbered_by_branch_not_by_arrival(fake_engine):
    """Branches reach the recorder in a shuffled order; branch i's call is still invocation i, and its seed is that
    of branch i, so a seeded rollout is numbered and sampled alike every run."""
    import random
    import time

    from wfc.lower import parallel_map

    rng = random.Random(0)

    class Shuffled(dspy.Module):
        def __init__(self):
            super().__init__()
            self.voter = dspy.Predict(QA)

        def forward(self, question):
            def vote(i):
                time.sleep(rng.random() * 0.03)  # branches start their calls in a random order
                return self.voter(question=question)

            return parallel_map(vote, range(4))[0]

    orders = set()
    for _ in range(4):
        graph = trace(Shuffled(), {"question": "a"}, fake_engine(lambda r: str(r.seed % 1000)), seed=7,
                      sampling=SamplingParams(temperature=0.7))
        voters = graph.calls_of("voter")
        orders.add(tuple(c.id for c in voters))  # ids follow arrival
        assert [c.invocation for c in voters] == [0, 1, 2, 3]
        assert [c.text for c in voters] == [str(derive_seed(7, "voter", (k,), 0) % 1000) for k in range(4)]
    assert len(orders) > 1, "the branches never arrived out of order: the test did not test anything"


def test_a_stop_role_ends_the_run_at_its_first_call_with_the_latest_answer(fake_engine):
    """stop_roles: the stopping role's call is never generated (no node), the run is ok, and its outputs are the
    latest answer made before it; without the stop the same program runs to the end."""
    qa = dspy.Signature("question -> answer", "Solve the arithmetic problem.")
    check = lambda inputs, proposal: (proposal["answer"] == "5", "not 5")  # noqa: E731
    engine = fake_engine(by_system={"failed a check": "5", "Solve": "4"})
    full = trace(EvalOpt(qa, rounds=2, check=check), {"question": "2 + 3?"}, engine)
    assert [c.role for c in full.calls] == ["generator", "optimizer"] and full.outputs == {"answer": "5"}
    assert full.stopped_at is None
    stopped = trace(EvalOpt(qa, rounds=2, check=check), {"question": "2 + 3?"}, engine, stop_roles={"optimizer"})
    assert stopped.status == "ok" and stopped.stopped_at == "optimizer"
    assert [c.role for c in stopped.calls] == ["generator"] and stopped.outputs == {"answer": "4"}
    assert stopped.to_dict()["stopped_at"] == "optimizer"
    # an accepted first answer never reaches the stopping role: an ordinary run
    accepted = trace(EvalOpt(qa, rounds=2, check=lambda i, p: (True, "")), {"question": "2 + 3?"}, engine,
                     stop_roles={"optimizer"})
    assert accepted.stopped_at is None and accepted.outputs == {"answer": "4"}


def test_a_stop_is_not_swallowed_by_a_program_that_catches_its_roles_errors(fake_engine):
    """Voting drops a voter that raises; a stop in the voters must still end the run (it is no Exception), and
    with nothing answered before it the stopped run has no outputs. Stopping at the aggregator keeps every vote."""
    qa = dspy.Signature("question -> answer", "Solve the arithmetic problem.")
    engine = fake_engine(by_system={"Several solvers": "5", "Solve": lambda r: "4"})
    at_voters = trace(Voting(qa, n=3), {"question": "2 + 3?"}, engine, stop_roles={"voter"})
    assert at_voters.status == "ok" and at_voters.stopped_at == "voter" and at_voters.calls == []
    assert at_voters.outputs is None
    at_aggregator = trace(Voting(qa, n=3), {"question": "2 + 3?"}, engine, stop_roles={"aggregator"})
    assert [c.role for c in at_aggregator.calls] == ["voter"] * 3 and at_aggregator.outputs == {"answer": "4"}
    graphs = run_rollouts(Voting(qa, n=3), [{"question": "1?"}], engine, repeats=2, stop_roles={"aggregator"})
    assert [g.stopped_at for g in graphs[0]] == ["aggregator", "aggregator"]
