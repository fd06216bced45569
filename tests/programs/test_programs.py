"""The four topologies on a scripted engine: their roles, how often each role is called, and their data flow.

Each role is scripted by its instructions (the system message); specific instructions come before the task's own
("Solve the arithmetic problem."), which every derived role repeats.
"""

from __future__ import annotations

import dspy
import pytest

from programs import TOPOLOGIES, EvalOpt, OrchWorkers, Retry, Single, Voting
from programs.eval_opt import accepted
from wfc.engines.base import SamplingParams
from wfc.lower import roles, trace
from wfc.rolegraph import RoleGraph

QA = dspy.Signature("question -> answer", "Solve the arithmetic problem.")
CODE = dspy.Signature("prompt -> code", "Write the Python function.")
EXAMPLE = {"question": "What is 2 + 3?"}

EVALUATOR = "Check the proposed solution"
OPTIMIZER = "A reviewer found a problem"
AGGREGATOR = "Several solvers proposed answers"


def calls_per_role(graph) -> dict[str, int]:
    return {role: len(graph.calls_of(role)) for role in graph.roles}


@pytest.mark.parametrize("name, expected", [
    ("single", ["solver"]),
    ("voting", ["voter", "aggregator"]),
    ("evalopt", ["generator", "evaluator", "optimizer"]),
    ("orchworkers", ["orchestrator", "worker", "synthesizer"]),
    ("retry", ["solver"]),
])
def test_declared_roles(name, expected):
    options = {"check": is_five} if name == "retry" else {}
    assert list(roles(TOPOLOGIES[name](QA, **options))) == expected


def is_five(inputs, proposal):
    """A check: accepts the answer "5"."""
    return proposal["answer"].strip() == "5", "it should be 5"


def test_single(fake_engine):
    g = trace(Single(QA), EXAMPLE, fake_engine(by_system={"Solve": "5"}))
    assert g.status == "ok" and calls_per_role(g) == {"solver": 1} and g.outputs == {"answer": "5"}


def test_voting_voters_are_one_role_feeding_the_aggregator(fake_engine):
    votes = iter(["5", "5", "6"])
    engine = fake_engine(by_system={AGGREGATOR: "5", "Solve": lambda r: next(votes)})
    g = trace(Voting(QA, n=3), EXAMPLE, engine)
    assert g.status == "ok" and g.roles == ["voter", "aggregator"]
    assert [c.invocation for c in g.calls_of("voter")] == [0, 1, 2]
    assert sorted(c.text for c in g.calls_of("voter")) == ["5", "5", "6"]
    (aggregator,) = g.calls_of("aggregator")
    assert "1. " in aggregator.messages[-1]["content"] and "6" in aggregator.messages[-1]["content"]
    assert sorted(g.graph.predecessors(aggregator.id)) == [c.id for c in g.calls_of("voter")]
    assert g.outputs == {"answer": "5"}


def test_voting_leaves_a_failed_voter_out_of_the_vote(fake_engine):
    votes = iter(["5", "not a number", "7"])

    def voter(request):
        answer = next(votes)
        if answer == "not a number":
            raise RuntimeError("voter engine down")
        return answer

    g = trace(Voting(QA, n=3), EXAMPLE, fake_engine(by_system={AGGREGATOR: "5", "Solve": voter}))
    statuses = sorted(c.status for c in g.calls_of("voter"))
    assert statuses == ["crash", "ok", "ok"]
    (aggregator,) = g.calls_of("aggregator")
    assert "2. " in aggregator.messages[-1]["content"] and "3. " not in aggregator.messages[-1]["content"]
    assert g.status == "crash"  # the tracer marks a rollout with a crashed call, even one the program swallowed


@pytest.mark.parametrize("votes, aggregated", [(["5", " 5", "5\n"], False), (["5", "5", "6"], True)])
def test_voting_skips_the_aggregator_only_when_the_voters_agree(votes, aggregated, fake_engine):
    """skip_unanimous: voters giving one answer (up to whitespace) end the run with it, no aggregator call; any
    disagreement calls the aggregator as usual. Off by default."""
    for skip in (True, False):
        queue = iter(votes)
        engine = fake_engine(by_system={AGGREGATOR: "9", "Solve": lambda r: next(queue)})
        g = trace(Voting(QA, n=3, skip_unanimous=skip), EXAMPLE, engine)
        called = not skip or aggregated
        assert g.status == "ok" and len(g.calls_of("aggregator")) == int(called)
        assert g.outputs["answer"].strip() == ("9" if called else "5")


@pytest.mark.parametrize("run_temperature, voter_temperature", [(0.0, 0.9), (0.7, 0.7)])
def test_voting_samples_its_voters_only_in_greedy_runs(run_temperature, voter_temperature, fake_engine):
    """sample_voters=0.9: a greedy run's voters sample at 0.9 (the aggregator stays greedy); a sampled run (training)
    keeps its own temperature on every call, so the trainer's log-probs match what was sampled."""
    seen = []

    def voter(request):
        seen.append(request.sampling.temperature)
        return str(len(seen))  # distinct answers: the aggregator decides

    engine = fake_engine(by_system={AGGREGATOR: "9", "Solve": voter})
    g = trace(Voting(QA, n=3, skip_unanimous=True, sample_voters=0.9), EXAMPLE, engine,
              sampling=SamplingParams(temperature=run_temperature, max_tokens=8))
    assert seen == [voter_temperature] * 3
    assert [c.temperature for c in g.calls_of("voter")] == [voter_temperature] * 3
    assert [c.temperature for c in g.calls_of("aggregator")] == [run_temperature]
    assert g.outputs["answer"].strip() == "9"
    seen.clear()
    trace(Voting(QA, n=3), EXAMPLE, engine, sampling=SamplingParams(temperature=0.0, max_tokens=8))
    assert seen == [0.0] * 3  # off by default: greedy voters


@pytest.mark.parametrize("bad", [0, -0.5, "hot"])
def test_voting_sample_voters_must_be_a_positive_temperature(bad):
    with pytest.raises(ValueError, match="sample_voters"):
        Voting(QA, sample_voters=bad)


@pytest.mark.parametrize("answers, calls, final", [
    (["5"], 1, "5"),  # accepted first time: no retry
    (["4", "6", "5", "7"], 3, "5"),  # retried until the check accepts
    (["4", "6", "3", "2", "9"], 4, "2"),  # out of attempts: the last answer stands, unchecked
])
def test_retry_answers_again_until_the_check_accepts(answers, calls, final, fake_engine):
    queue = iter(answers)
    checked = []

    def check(inputs, proposal):
        checked.append(proposal["answer"].strip())
        return is_five(inputs, proposal)

    g = trace(Retry(QA, check=check, attempts=3), EXAMPLE, fake_engine(by_system={"Solve": lambda r: next(queue)}))
    assert g.status == "ok" and calls_per_role(g) == {"solver": calls}
    assert g.outputs == {"answer": final}
    assert checked == answers[:min(calls, 3)]  # once per answer, never the last attempt's
    first = g.calls_of("solver")[0].messages
    assert all(c.messages == first for c in g.calls_of("solver"))  # a fresh draw of the same prompt


@pytest.mark.parametrize("run_temperature, retry_temperature", [(0.0, 0.8), (0.7, 0.7)])
def test_retry_samples_its_retries_only_in_greedy_runs(run_temperature, retry_temperature, fake_engine):
    """A greedy run's first answer is greedy and its retries sample at sample_retries; a sampled run (training)
    keeps its own temperature on every call."""
    g = trace(Retry(QA, check=is_five, attempts=2, sample_retries=0.8), EXAMPLE, fake_engine(by_system={"Solve": "4"}),
              sampling=SamplingParams(temperature=run_temperature, max_tokens=8))
    assert [c.temperature for c in g.calls_of("solver")] == [run_temperature] + [retry_temperature] * 2


@pytest.mark.parametrize("run_temperature, calls", [(0.7, 1), (0.0, 3)])
def test_retry_without_training_retries_answers_once_in_sampled_runs(run_temperature, calls, fake_engine):
    """train_retries=False: a training rollout (sampled) is the first answer alone; a greedy run still retries."""
    g = trace(Retry(QA, check=is_five, attempts=2, train_retries=False), EXAMPLE,
              fake_engine(by_system={"Solve": "4"}), sampling=SamplingParams(temperature=run_temperature, max_tokens=8))
    assert calls_per_role(g) == {"solver": calls} and g.outputs == {"answer": "4"}


def test_retry_counts_an_attempt_that_fails_as_failed_and_keeps_the_last_parsed_answer(fake_engine):
    answers = iter(["4", None, "6"])
    checked = []

    def solver(request):
        answer = next(answers)
        if answer is None:
            raise RuntimeError("engine down")
        return answer

    def check(inputs, proposal):
        checked.append(proposal["answer"].strip())
        return False, "no"

    g = trace(Retry(QA, check=check, attempts=2), EXAMPLE, fake_engine(by_system={"Solve": solver}))
    assert [c.status for c in g.calls_of("solver")] == ["ok", "crash", "ok"]
    assert checked == ["4"]  # the crash left "4" standing, already rejected: not checked again
    assert g.outputs == {"answer": "6"}
    answers = iter(["4", None])
    g = trace(Retry(QA, check=check, attempts=1), EXAMPLE, fake_engine(by_system={"Solve": solver}))
    assert g.outputs == {"answer": "4"}  # the last parsed answer


@pytest.mark.parametrize("options, match", [
    ({"check": None}, "check is a function"), ({"attempts": -1}, "attempts >= 0"), ({"attempts": True}, "attempts"),
    ({"sample_retries": 0}, "sample_retries"), ({"sample_retries": None}, "repeat a greedy answer"),
    ({"vary_demos": 1}, "vary_demos is True or False"), ({"train_retries": None}, "train_retries is True or False"),
])
def test_retry_refuses_bad_options(options, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Retry(QA, **{"check": is_five, **options})
    Retry(QA, check=is_five, attempts=0, sample_retries=None)  # no retries: no temperature needed
    Retry(QA, check=is_five, sample_retries=None, vary_demos=True)  # greedy retries differ by their demos


def _sums_retriever():
    from wfc.retrieve import DemoRetriever

    pool = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((2, 4), (1, 1), (9, 9), (3, 3))]
    return DemoRetriever(k=1, query=["question"], pool=pool)


def test_retry_with_vary_demos_shows_each_retry_another_answer(fake_engine):
    """Each retry shows the static demo and the nearest retrieved one whose answer no demo shown before had. For
    "What is 2 + 3?" (TF-IDF over 4 entries: idf 1 for "what"/"is", 1.916 for a number in one entry): "3 + 3"
    (cosine 0.748, "3" twice) then "2 + 4" (0.607), then "1 + 1" and "9 + 9" tie (0.160), the earlier first. "2 + 4"
    answers 6 as "3 + 3" did, so it is passed over; once no other answer is left a retry shows the static demo
    alone. Greedy retries (no sample_retries) keep the run's temperature. The held program's demos never change."""
    from wfc.retrieve import install

    program = Retry(QA, check=lambda inputs, proposal: (False, "no"), attempts=3, sample_retries=None,
                    vary_demos=True)
    static = dspy.Example(question="What is 10 - 1?", answer="9").with_inputs("question")
    program.solver.demos = [static]
    install(program, {"solver": _sums_retriever()})
    g = trace(program, EXAMPLE, fake_engine(by_system={"Solve": "4"}))
    shown = ["\n".join(m["content"] for m in c.messages) for c in g.calls_of("solver")]
    assert len(shown) == 4 and all("What is 10 - 1?" in text for text in shown)
    demos = [[q for q in ("2 + 4", "1 + 1", "9 + 9", "3 + 3") if f"What is {q}?" in text] for text in shown]
    assert demos == [["3 + 3"], ["1 + 1"], ["9 + 9"], []]
    assert [c.temperature for c in g.calls_of("solver")] == [0.0] * 4
    assert program.solver.demos == [static]


def test_retry_with_vary_demos_and_no_retrieved_demos(fake_engine):
    """No retriever: retries repeat the prompt, sampled at sample_retries; with greedy retries the run answers once
    (they would repeat it), as the uncompiled program must before compile installs its retrieved demos."""
    g = trace(Retry(QA, check=is_five, attempts=2, sample_retries=0.8, vary_demos=True), EXAMPLE,
              fake_engine(by_system={"Solve": "4"}))
    first = g.calls_of("solver")[0].messages
    assert len(g.calls_of("solver")) == 3 and all(c.messages == first for c in g.calls_of("solver"))
    g = trace(Retry(QA, check=is_five, attempts=2, sample_retries=None, vary_demos=True), EXAMPLE,
              fake_engine(by_system={"Solve": "4"}))
    assert g.status == "ok" and calls_per_role(g) == {"solver": 1} and g.outputs == {"answer": "4"}


@pytest.mark.parametrize("verdicts, expected", [
    (["correct"], {"generator": 1, "evaluator": 1}),
    (["incorrect: off by one", "Correct."], {"generator": 1, "evaluator": 2, "optimizer": 1}),
    (["incorrect", "incorrect"], {"generator": 1, "evaluator": 2, "optimizer": 2}),
])
def test_evalopt_stops_when_the_evaluator_accepts(verdicts, expected, fake_engine):
    queue = iter(verdicts)
    revisions = iter(["6", "7"])
    engine = fake_engine(by_system={EVALUATOR: lambda r: next(queue), OPTIMIZER: lambda r: next(revisions),
                                    "Solve": "4"})
    g = trace(EvalOpt(QA, rounds=2), EXAMPLE, engine)
    assert g.status == "ok" and calls_per_role(g) == expected
    final = {1: "4", 2: "6", 3: "7"}[1 + expected.get("optimizer", 0)]  # the last revision is the answer
    assert g.outputs == {"answer": final}


def test_evalopt_roles_are_called_a_variable_number_of_times(fake_engine):
    graphs = []
    for verdicts in (["correct"], ["no", "correct"], ["no", "no"]):
        queue = iter(verdicts)
        engine = fake_engine(by_system={EVALUATOR: lambda r: next(queue), OPTIMIZER: "5", "Solve": "4"})
        graphs.append(trace(EvalOpt(QA, rounds=2), EXAMPLE, engine))
    rg = RoleGraph.from_rollouts(graphs)
    assert rg.role_names == ["generator", "evaluator", "optimizer"]
    assert (rg.stats("evaluator").calls_min, rg.stats("evaluator").calls_max) == (1, 2)
    assert (rg.stats("optimizer").calls_min, rg.stats("optimizer").calls_max) == (0, 2)
    assert rg.edge("generator", "evaluator") and rg.edge("evaluator", "optimizer")


def test_evalopt_rounds_zero_is_the_generator_alone(fake_engine):
    g = trace(EvalOpt(QA, rounds=0), EXAMPLE, fake_engine(by_system={"Solve": "4"}))
    assert calls_per_role(g) == {"generator": 1}


FIXER = "The previous solution failed a check"


def test_evalopt_with_a_check_judges_by_it_and_tells_the_optimizer_what_it_found(fake_engine):
    """check=: no evaluator role; a rejected proposal goes to the optimizer with the check's feedback in its prompt,
    each revision is checked again, and an accepted one ends the run."""
    seen = []

    def check(inputs, proposal):
        seen.append((dict(inputs), dict(proposal)))
        return proposal["answer"] == "5", f"{proposal['answer']} is not 5"

    revisions = iter(["6", "5"])
    engine = fake_engine(by_system={FIXER: lambda r: next(revisions), "Solve": "4"})
    program = EvalOpt(QA, rounds=3, check=check)
    assert list(roles(program)) == ["generator", "optimizer"]
    g = trace(program, EXAMPLE, engine)
    assert g.status == "ok" and calls_per_role(g) == {"generator": 1, "optimizer": 2} and g.outputs == {"answer": "5"}
    assert seen == [(EXAMPLE, {"answer": a}) for a in ("4", "6", "5")]
    first, second = (c.messages[-1]["content"] for c in g.calls_of("optimizer"))
    assert "4 is not 5" in first and "6 is not 5" in second
    accepted_at_once = trace(EvalOpt(QA, rounds=3, check=lambda i, p: (True, "")), EXAMPLE,
                             fake_engine(by_system={"Solve": "4"}))
    assert calls_per_role(accepted_at_once) == {"generator": 1}


@pytest.mark.parametrize("kwargs, error", [({"check": "run the tests"}, TypeError),
                                           ({"check": lambda i, p: (True, ""), "choose_verdict": True}, ValueError)])
def test_evalopt_check_must_be_a_function_and_replaces_the_evaluator(kwargs, error):
    with pytest.raises(error, match="check"):
        EvalOpt(QA, **kwargs)


@pytest.mark.parametrize("verdict, ok", [("correct", True), ("Correct, well done", True), ("yes", True),
                                         ("incorrect", False), ("not correct", False), ("", False)])
def test_accepted(verdict, ok):
    assert accepted(verdict) is ok


@pytest.mark.parametrize("plan, workers", [("one\ntwo", 2), ("- a\n- b\n- c\n- d\n- e", 3), ("-", 1)])
def test_orchworkers_one_worker_call_per_subtask(plan, workers, fake_engine):
    engine = fake_engine(by_system={"Break the task": plan, "Solve this one subtask": "r", "Use the results": "5"})
    g = trace(OrchWorkers(QA, max_subtasks=3), EXAMPLE, engine)
    assert g.status == "ok" and calls_per_role(g) == {"orchestrator": 1, "worker": workers, "synthesizer": 1}
    if plan == "-":  # a plan with no subtask in it: one worker gets the whole task
        assert "Solve the whole task." in g.calls_of("worker")[0].messages[-1]["content"]


def test_topologies_keep_the_task_field_names(fake_engine):
    """One topology serves code (prompt -> code) as well as math: derived roles keep the task's fields."""
    program = EvalOpt(CODE, rounds=1)
    assert list(program.evaluator.signature.input_fields) == ["prompt", "code"]
    assert list(program.optimizer.signature.input_fields) == ["prompt", "previous_code", "feedback"]
    engine = fake_engine(by_system={EVALUATOR: "correct", "Write the Python function": "def f(): pass"})
    g = trace(program, {"prompt": "Write f."}, engine)
    assert g.outputs == {"code": "def f(): pass"}


@pytest.mark.parametrize("make", [lambda: Voting(QA, n=0), lambda: EvalOpt(QA, rounds=-1),
                                  lambda: OrchWorkers(QA, max_subtasks=0)])
def test_bad_parameters_are_value_errors(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("check", [lambda inputs, proposal: (False, "it printed nothing"), None])
def test_evalopt_without_the_previous_proposal_asks_for_a_new_answer_from_the_task_and_feedback(check, fake_engine):
    """show_previous=False: the optimizer's inputs are the task's and the feedback, never the proposal it replaces
    (with a check or a reviewer); the default shows it."""
    engine = fake_engine(by_system={"An earlier solution failed": "5", "found a problem with an earlier": "5",
                                    EVALUATOR: "incorrect: it printed nothing", "Solve": "41"})
    program = EvalOpt(QA, rounds=1, check=check, show_previous=False)
    assert list(program.optimizer.signature.input_fields) == ["question", "feedback"]
    g = trace(program, EXAMPLE, engine)
    (fix,) = g.calls_of("optimizer")
    assert "it printed nothing" in fix.messages[-1]["content"] and "41" not in fix.messages[-1]["content"]
    assert g.outputs == {"answer": "5"}
    shown = EvalOpt(QA, rounds=1, check=check)
    assert "previous_answer" in shown.optimizer.signature.input_fields


def test_evalopt_without_the_previous_proposal_runs_on_the_tiny_model(tiny_engine):
    from wfc.tasks.codegen import make_codegen
    from wfc.tasks.visible import example_check

    task = make_codegen(1, seed=1)[0]
    g = trace(EvalOpt(CODE, rounds=1, check=example_check, show_previous=False), task, tiny_engine,
              sampling=SamplingParams(temperature=0.0, max_tokens=8))
    (written,), (fix,) = g.calls_of("generator"), g.calls_of("optimizer")  # tiny code never passes the example
    assert fix.status == "ok" and "Previous code" not in fix.messages[-1]["content"]  # the field shown by default
    assert example_check(task, written.outputs)[1] in fix.messages[-1]["content"]
    shown = trace(EvalOpt(CODE, rounds=1, check=example_check), task, tiny_engine,
                  sampling=SamplingParams(temperature=0.0, max_tokens=8))
    assert "Previous code" in shown.calls_of("optimizer")[0].messages[-1]["content"]
