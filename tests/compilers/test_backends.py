"""Backends: resolving shared / isolated / grouped plans, and training them on the tiny model."""

import json

import dspy
import pytest
import torch

from compilers import MMGRPO
from compilers.advantages import group_advantages
from compilers.backends import BackendPlan, adapter_name, resolve_backend
from compilers.config import GuardsConfig, MMGRPOConfig, UpdateConfig
from compilers.group import build_groups
from compilers.score import score_rollout
from compilers.update import AdapterOptimizers, adapter_parameters, update
from wfc.artifact import adapter_state
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.lower import run_rollouts
from tiny_setup import SIG, TRAIN, length_metric, tiny_config


class SameSig(dspy.Module):
    """``n`` roles built from one Signature class, called one after another on the same question."""

    def __init__(self, n: int = 2):
        super().__init__()
        self.names = ["first", "second", "third"][:n]
        for name in self.names:
            setattr(self, name, dspy.Predict(SIG))

    def forward(self, question):
        out = None
        for name in self.names:
            out = getattr(self, name)(question=question)
        return out


def small(**kw):
    return tiny_config(**{"eval_every": 0, **kw})


# ----- resolving -------------------------------------------------------------------------------------------------

def test_resolve_named_backends():
    roles = ["solver", "team.judge", "team__judge"]
    assert resolve_backend("shared", roles).role_adapters == {r: "shared" for r in roles}
    iso = resolve_backend("isolated", roles)
    assert iso.role_adapters == {"solver": "solver", "team.judge": "team__judge", "team__judge": "team__judge_2"}
    assert len(iso.adapters) == 3 and iso.kind == "isolated"


def test_resolve_grouped():
    plan = resolve_backend({"solver": "a", "judge": "b", "reviser": "a"}, ["solver", "judge", "reviser"])
    assert plan.role_adapters == {"solver": "a", "judge": "b", "reviser": "a"}
    assert plan.adapters == ["a", "b"] and plan.kind == "grouped"
    assert "solver   -> a" in plan.describe()  # roles padded to the longest path
    assert resolve_backend(plan, ["solver", "judge", "reviser"]) is plan


@pytest.mark.parametrize("backend, match", [
    ({"solver": "a"}, r"missing \['judge'\]"),
    ({"solver": "a", "judge": "b", "critic": "c"}, r"unknown \['critic'\]"),
    ({"solver": "a", "judge": ""}, "non-empty strings"),
    ({"solver": "a", "judge": 3}, "non-empty strings"),
    ({"solver": "x.y", "judge": "x__y"}, "would both become adapter"),
    ("isolate", "must be one of"),
    ("auto", "traced rollouts"),
    (BackendPlan("shared", {"solver": "shared"}), "covers roles"),
])
def test_bad_backends(backend, match):
    with pytest.raises(ValueError, match=match):
        resolve_backend(backend, ["solver", "judge"])


def test_adapter_parameters_match_the_adapter_segment_only(engine):
    from peft import LoraConfig

    for name in ("mlp", "shared"):  # "mlp" is also a module name in every layer's parameter path
        engine.policy.add_adapter(name, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    mlp, shared = adapter_parameters(engine.policy.model, "mlp"), adapter_parameters(engine.policy.model, "shared")
    assert len(mlp) == len(shared) == 8 and not {id(p) for p in mlp} & {id(p) for p in shared}
    assert adapter_name("team.judge") == "team__judge" and adapter_name("1st") == "a_1st"


# ----- training --------------------------------------------------------------------------------------------------

def test_update_trains_only_the_roles_adapter(engine):
    cfg = MMGRPOConfig(**small())
    roles = {"first": "first", "second": "second"}
    for a in roles.values():
        engine.policy.add_adapter(a, cfg.lora.peft_config())
    optimizers = AdapterOptimizers(engine.policy.model, list(roles.values()), lr={"first": 5e-3, "second": 1e-3})
    assert optimizers.lr("second") == 1e-3
    torch.manual_seed(0)
    rollouts = run_rollouts(SameSig(), TRAIN[:2], engine, repeats=3, adapters=roles,
                            sampling=SamplingParams(temperature=1.0, max_tokens=6))
    for graphs in rollouts:
        for g in graphs:
            score_rollout(length_metric, g, failure_score=0.0, metric_failure_score=0.0)
            assert {c.role: c.adapter for c in g.calls} == roles  # each role's requests routed to its adapter
    groups = [g for g in build_groups(rollouts) if g.role == "first"]
    for g in groups:
        g.advantages = group_advantages(g.rewards, "dr_grpo").advantages
    assert any(a != 0 for g in groups for a in g.advantages), "the metric must spread the rewards"
    before = {a: adapter_state(engine.policy.model, a) for a in roles.values()}
    stats = update(engine.policy, optimizers, groups, roles, config=cfg.section(UpdateConfig),
                   guards=cfg.section(GuardsConfig), temperature=cfg.temperature)
    after = {a: adapter_state(engine.policy.model, a) for a in roles.values()}
    assert stats["second"]["rows"] == 0 and stats["first"]["trained_rows"] > 0
    assert all(torch.equal(before["second"][k], after["second"][k]) for k in before["second"])
    assert any(not torch.equal(before["first"][k], after["first"][k]) for k in before["first"])


def test_same_signature_roles_get_distinct_adapters_that_train_apart(engine, tmp_path):
    base = {k: v.clone() for k, v in engine.policy.base_model.state_dict().items() if "lora_" not in k}
    compiled = MMGRPO(length_metric, **small()).compile(SameSig(), trainset=TRAIN, engine=engine, backend="isolated",
                                                        run_dir=tmp_path / "run", progress=False)
    assert compiled.roles == {"first": "first", "second": "second"}
    states = {a: adapter_state(engine.policy.model, a) for a in ("first", "second")}
    assert states["first"].keys() == states["second"].keys()
    for a, state in states.items():
        assert any(v.abs().sum() > 0 for k, v in state.items() if "lora_B" in k), f"adapter {a} did not train"
    assert any(not torch.equal(states["first"][k], states["second"][k]) for k in states["first"] if "lora_B" in k)
    for k, v in engine.policy.base_model.state_dict().items():
        if "lora_" not in k:
            key = k.replace(".base_layer", "")
            assert torch.equal(v, base[key]), f"base weight {key} changed"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    for r in steps:  # each adapter's update saw only its own role
        assert {a: set(st["roles"]) for a, st in r["adapters"].items()} == {"first": {"first"}, "second": {"second"}}
    assert records[0]["kind"] == "plan" and records[0]["backend"] == "isolated"
    # a mixed-adapter batch routes row by row: same greedy text as each adapter alone
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    req = [GenerationRequest(messages=({"role": "user", "content": "What is 2 plus 2?"},), adapter=a, sampling=greedy)
           for a in ("first", "second", None)]
    calls = engine.stats["generate_calls"]
    mixed = engine.generate(req)
    assert engine.stats["generate_calls"] == calls + 1
    alone = [engine.generate([r])[0] for r in req]
    assert [m.completion_ids for m in mixed] == [a.completion_ids for a in alone]


def test_grouped_partition_trains_and_balances(engine, tmp_path):
    partition = {"first": "g1", "second": "g1", "third": "g2"}
    compiled = MMGRPO(length_metric, **small(steps=1)).compile(
        SameSig(3), trainset=TRAIN, engine=engine, backend=partition, run_dir=tmp_path / "run", progress=False)
    assert compiled.roles == partition and compiled.manifest.backend == partition
    assert set(engine.adapters) == {"g1", "g2"}
    step = next(r for r in compiled.manifest.history if r["kind"] == "step")
    assert step["guards"]["role_balance"] is True
    assert sum(step["roles"][r]["mass_share"] for r in ("first", "second")) == pytest.approx(1.0)  # shares of g1
    assert step["roles"]["third"]["balance_weight"] == 1.0  # alone in g2: nothing to balance
    for role in partition:
        for key in ("grad_norm", "token_share", "reward_mean", "reward_std", "no_signal_rate", "entropy",
                    "format_error_rate", "mass_share", "fanout_weight", "lr", "adapter"):
            assert key in step["roles"][role], key
