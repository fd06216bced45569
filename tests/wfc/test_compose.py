"""wfc.compose: a trained role moved into another program carries its demos, its retriever and its adapter, and the
artifact it came from is left as it was; which role to carry is picked from the artifact's roles."""

from __future__ import annotations

import dspy
import pytest

from programs import EvalOpt, Retry, Single
from wfc.artifact import CompiledProgram, Manifest
from wfc.compose import carry_role, pick_role
from wfc.retrieve import DemoRetriever, retrievers

SIG = dspy.Signature("question -> answer", "Answer the question.")


def _artifact(fake_engine, *, retriever: bool) -> CompiledProgram:
    """A compiled Single whose solver has one static demo (and a retriever), on adapter ``shared``."""
    program = Single(SIG)
    program.solver.demos = [dspy.Example(question="1 + 1?", answer="2")]
    if retriever:
        program.solver.wfc_retriever = DemoRetriever(k=1, query=["question"],
                                                     pool=[{"question": "2 + 2?", "answer": "4"}])
    manifest = Manifest(name="Single", base_model="fake", base_model_checksum="0", program_class="programs:Single",
                        roles={"solver": "shared"})
    return CompiledProgram(program, fake_engine("2"), manifest)


@pytest.mark.parametrize("retriever", [False, True])
def test_the_carried_role_is_prompted_as_trained_and_runs_on_its_adapter(fake_engine, retriever):
    compiled = _artifact(fake_engine, retriever=retriever)
    target = Retry(SIG, check=lambda inputs, proposal: (True, ""), attempts=1)
    assert carry_role(compiled, "solver", target, "solver") == "shared"
    assert [dict(d) for d in target.solver.demos] == [{"question": "1 + 1?", "answer": "2"}]
    assert retrievers(target) == ({"solver": retrievers(compiled.program)["solver"]} if retriever else {})
    # the demos are a copy: changing the target's leaves the artifact's alone
    target.solver.demos.clear()
    assert len(compiled.program.solver.demos) == 1


def test_a_role_carried_onto_another_path_leaves_the_other_roles_alone(fake_engine):
    compiled = _artifact(fake_engine, retriever=True)
    target = EvalOpt(SIG, rounds=1)
    assert carry_role(compiled, "solver", target, "generator") == "shared"
    assert len(target.generator.demos) == 1 and not target.optimizer.demos and not target.evaluator.demos
    assert set(retrievers(target)) == {"generator"}


def test_unknown_roles_are_refused_naming_the_roles_there_are(fake_engine):
    compiled = _artifact(fake_engine, retriever=False)
    with pytest.raises(ValueError, match=r"artifact has no role 'critic'; its roles are \['solver'\]"):
        carry_role(compiled, "critic", Single(SIG), "solver")
    with pytest.raises(ValueError, match=r"program has no role 'writer'; its roles are \['solver'\]"):
        carry_role(compiled, "solver", Single(SIG), "writer")


def test_the_role_to_carry_is_the_named_one_else_the_only_one_else_the_generator():
    assert pick_role({"solver": "shared"}) == "solver"
    assert pick_role({"generator": "a", "optimizer": None}) == "generator"
    assert pick_role({"generator": "a", "optimizer": None}, "optimizer") == "optimizer"
    assert pick_role({"writer": "a", "fixer": "b"}, default="writer") == "writer"
    with pytest.raises(ValueError, match=r"no role 'critic'; its roles are \['solver'\]"):
        pick_role({"solver": "shared"}, "critic")
    with pytest.raises(ValueError, match="no role 'generator'"):
        pick_role({"voter": "a", "aggregator": "b"})
