"""backend="auto": the rules on hand-built role statistics, and the traced front end on a scripted engine."""

from dataclasses import dataclass

import dspy
import pytest

from compilers import MMGRPOConfig
from compilers.auto import choose_backend, plan
from programs import Voting


@dataclass
class S:
    """Stand-in for wfc.rolegraph.RoleStats: only what the rules read."""

    role: str
    completion_share: float
    fan_out: int = 1
    calls_mean: float = 1.0
    token_share: float = 0.0


def roles_of(stats):
    return [s.role for s in stats]


@pytest.mark.parametrize("name, stats, spec", [
    ("single role", [S("solver", 1.0)], "shared"),
    # Voting n=4: voters hold 80% >= 1.5/2 = 75%: isolated; the aggregator alone gets the other adapter
    ("voting", [S("voter", 0.8, fan_out=4, calls_mean=4), S("aggregator", 0.2)], "isolated"),
    ("two balanced", [S("a", 0.7), S("b", 0.3)], "shared"),  # 70% < 75%
    ("exactly at threshold", [S("a", 0.75), S("b", 0.25)], "isolated"),
    ("evalopt balanced", [S("generator", 0.4), S("evaluator", 0.35), S("optimizer", 0.25)], "shared"),  # < 50%
    ("orchworkers", [S("orchestrator", 0.15), S("worker", 0.6, fan_out=3), S("synthesizer", 0.25)],
     {"orchestrator": "shared", "worker": "worker", "synthesizer": "shared"}),
    ("four roles", [S("a", 0.45), S("b", 0.15), S("c", 0.2), S("d", 0.2)],  # 45% >= 1.5/4 = 37.5%
     {"a": "a", "b": "shared", "c": "shared", "d": "shared"}),
    ("two dominant of four", [S("a", 0.4), S("b", 0.4), S("c", 0.1), S("d", 0.1)],
     {"a": "a", "b": "b", "c": "shared", "d": "shared"}),
])
def test_rules_table(name, stats, spec):
    p = choose_backend(stats, roles_of(stats))
    assert p.spec == spec, p.describe()
    assert p.reasons[0].startswith("backend=auto")
    assert set(p.role_adapters) == set(roles_of(stats))


def test_fanout_without_scaling_keeps_the_parallel_role_shared():
    stats = [S("voter", 0.8, fan_out=4), S("aggregator", 0.2)]
    p = choose_backend(stats, roles_of(stats), fanout_scaling=False)
    assert p.spec == "shared" and any("cliff-prone" in r for r in p.reasons)
    p = choose_backend(stats, roles_of(stats), fanout_scaling=False, role_balance=False)
    assert p.spec == "shared" and any(r.startswith("warning") for r in p.reasons)
    # a dominant role without fan-out is isolated whatever the fan-out setting
    stats = [S("writer", 0.8), S("critic", 0.2)]
    assert choose_backend(stats, roles_of(stats), fanout_scaling=False).spec == "isolated"


def test_reasons_name_the_numbers():
    stats = [S("voter", 0.8, fan_out=4), S("aggregator", 0.2)]
    text = choose_backend(stats, roles_of(stats)).describe()
    assert "voter is dominant: 80% of completion tokens >= 1.5/2 = 75%" in text
    assert "fans out 4x" in text and "backend: isolated (2 adapters)" in text


def test_unseen_roles_join_the_shared_adapter():
    stats = [S("generator", 0.8), S("evaluator", 0.2)]
    p = choose_backend(stats, ["generator", "evaluator", "optimizer"])
    assert p.spec == {"generator": "generator", "evaluator": "shared", "optimizer": "shared"}
    assert any("not called" in r for r in p.reasons)
    assert choose_backend([], ["a", "b"]).spec == "shared"


def test_token_share_when_no_completion_tokens_and_bad_input():
    stats = [S("a", 0.0, token_share=0.9), S("b", 0.0, token_share=0.1)]
    assert choose_backend(stats, ["a", "b"]).spec == "isolated"
    with pytest.raises(ValueError, match="not roles of the program"):
        choose_backend([S("ghost", 1.0)], ["a", "b"])
    with pytest.raises(ValueError, match="dominance"):
        choose_backend(stats, ["a", "b"], dominance=1.0)
    with pytest.raises(ValueError, match="role paths"):
        choose_backend(stats, [])


def test_role_named_shared_keeps_its_own_group():
    stats = [S("shared", 0.6), S("b", 0.2), S("c", 0.2)]
    p = choose_backend(stats, roles_of(stats))
    assert p.role_adapters["shared"] != p.role_adapters["b"] == p.role_adapters["c"]


def test_plan_traces_with_the_base_model(fake_engine):
    sig = dspy.Signature("question -> answer", "Answer the question.")
    engine = fake_engine(by_system={"Several solvers": "4", "Answer the question": "four, I think"})
    examples = [dspy.Example(question=f"What is {i} plus 2?", answer=str(i + 2)).with_inputs("question")
                for i in range(6)]
    p = plan(Voting(sig, n=3), examples, engine, config=MMGRPOConfig(auto_trace_examples=2, auto_trace_repeats=2))
    assert p.spec == "isolated" and p.role_graph.num_rollouts == 4
    assert all(r.adapter is None for r in engine.calls)  # traced on the base model
    assert "traced 4 rollouts (2 examples x 2)" in p.describe() and "role graph over 4" in p.describe()
    with pytest.raises(ValueError, match="examples to trace"):
        plan(Voting(sig), [], engine)


def test_compile_with_auto_stores_the_decision(tiny_handle, tmp_path):
    from compilers import MMGRPO
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    sig = dspy.Signature("question -> answer", "Answer the question.")
    train = [dspy.Example(question=f"What is {a} plus 1?", answer=str(a + 1)).with_inputs("question") for a in range(4)]
    engine = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    try:
        compiled = MMGRPO(lambda ex, pred, trace=None: len(pred.answer) % 2, steps=1, examples_per_step=1,
                          group_size=2, max_tokens=6, eval_every=0, auto_trace_examples=2, auto_trace_repeats=1,
                          lora={"r": 2, "alpha": 4, "target_modules": ["q_proj"]}).compile(
            Voting(sig, n=4), trainset=train, engine=engine, backend="auto", run_dir=tmp_path / "run", progress=False)
    finally:
        engine.close()
    m = compiled.manifest
    assert m.backend_reasons[0].startswith("backend=auto") and any("traced 2 rollouts" in r for r in m.backend_reasons)
    assert m.backend in ("shared", "isolated") and set(m.roles) == {"voter", "aggregator"}
    assert (m.backend == "isolated") == (m.roles["voter"] != m.roles["aggregator"])
