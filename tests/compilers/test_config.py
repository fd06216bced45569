"""The config in sections (compilers.config): one table says which field belongs to which section, every field is in
exactly one, the flat config is every section at once, and a variant's name is checked against its own registry
(so a new variant is registered in one place and nothing else changes)."""

import copy
import inspect

import pytest
import torch
from peft import LoraConfig, get_peft_model
from pydantic import ValidationError

from compilers import advantages, credit, group, loss, offpolicy, prompts, schedule, update
from compilers.config import (SECTIONS, CreditConfig, GuardsConfig, MMGRPOConfig, RunConfig, Section, Sections,
                              UpdateConfig)
from compilers.recipes import RECIPES
from compilers.update import Row, update_adapter


def test_every_field_is_in_exactly_one_section():
    owners: dict[str, list[str]] = {}
    for name, kind in SECTIONS.items():
        for field in kind.model_fields:
            owners.setdefault(field, []).append(name)
    assert {f: o for f, o in owners.items() if len(o) > 1} == {}
    assert set(owners) == set(MMGRPOConfig.model_fields)
    assert list(SECTIONS) == ["run", "engine", "plan", "prompts", "warm_start", "sampling", "credit", "update",
                              "guards", "evaluation"]


def test_the_flat_config_is_every_section_in_table_order():
    assert MMGRPOConfig.__bases__ == tuple(reversed(SECTIONS.values()))  # pydantic lists the last base's first
    assert list(MMGRPOConfig.model_fields) == [f for kind in SECTIONS.values() for f in kind.model_fields]
    cfg = MMGRPOConfig(group_size=4, loss_aggregation="sequence", lora={"r": 8}, role_share_cap=0.6, seed=3)
    sections = cfg.sections()
    assert isinstance(sections, Sections)
    for name, kind in SECTIONS.items():
        part = getattr(sections, name)
        assert type(part) is kind and part == cfg.section(kind)
        assert part.model_dump() == {f: v for f, v in cfg.model_dump().items() if f in kind.model_fields}
    assert (sections.sampling.group_size, sections.update.loss_aggregation, sections.plan.lora.r,
            sections.guards.role_share_cap, sections.run.seed) == (4, "sequence", 8, 0.6, 3)
    with pytest.raises(ValidationError, match="frozen"):
        sections.update.beta = 0.1  # a stage cannot change its section
    cfg.beta = 0.1  # the flat config stays as mutable as it was
    assert cfg.section(UpdateConfig).beta == 0.1


def test_a_section_validates_its_own_fields_alone():
    assert UpdateConfig().aggregation is loss.AGGREGATIONS["token"]
    with pytest.raises(ValidationError, match="format_failure_score"):
        CreditConfig(format_failure_score=0.0, failure_score=0.0)
    with pytest.raises(ValidationError, match="role_max_grad_norm"):
        GuardsConfig(role_max_grad_norm={"a": 0.0})
    with pytest.raises(ValidationError, match="extra"):
        UpdateConfig(group_size=4)  # another section's field


REGISTRIES = [("strategy", prompts.STRATEGIES), ("credit", credit.CREDIT), ("grouping", group.GROUPING),
              ("advantage", advantages.ADVANTAGES), ("loss_aggregation", loss.AGGREGATIONS),
              ("importance_correction", offpolicy.CORRECTIONS), ("lr_schedule", schedule.SCHEDULES)]


@pytest.mark.parametrize("field, registry", REGISTRIES)
def test_a_variant_field_takes_exactly_its_registrys_names(field, registry):
    for name in registry:
        extra = {"warm_start_runs": 0} if field == "strategy" else {}
        assert getattr(MMGRPOConfig(**{field: name, **extra}), field) == name
    with pytest.raises(ValidationError) as err:
        MMGRPOConfig(**{field: "no-such-variant"})
    assert field in str(err.value) and all(repr(name) in str(err.value) for name in registry)


def test_the_section_hands_the_stage_the_registered_object():
    cfg = MMGRPOConfig(strategy="p -> w", credit="verified", advantage="rloo", loss_aggregation="constant",
                       importance_correction="none")
    assert cfg.section(RunConfig).optimizes == prompts.Strategy("p -> w", demos=True, weights=True)
    assert cfg.section(CreditConfig).rule is credit.CREDIT["verified"] and cfg.section(CreditConfig).rule.per_call
    assert cfg.section(CreditConfig).estimator is advantages.rloo
    agg = cfg.section(UpdateConfig).aggregation
    assert (agg.name, agg.unit, agg.per) == ("constant", "tokens", "rows")
    assert agg.share(tokens=3, rows=2, total_tokens=12, total_rows=8) == 2 / 8
    assert cfg.section(UpdateConfig).correction.weights(torch.zeros(1, 2), torch.zeros(1, 2),
                                                        torch.ones(1, 2, dtype=torch.bool), cap=2.0) is None


def test_each_aggregation_knows_its_unit_and_share():
    # unit: what a row weighs in a role's gradient mass; share: a micro-batch's part of the step's loss
    table = {"token": ("tokens", 3 / 12), "sequence": ("rows", 2 / 8), "constant": ("tokens", 2 / 8)}
    for name, (unit, share) in table.items():
        agg = loss.get_aggregation(name)
        assert agg.unit == unit
        assert agg.share(tokens=3, rows=2, total_tokens=12, total_rows=8) == share


def test_a_new_variant_is_registered_in_one_place(monkeypatch):
    """A new loss aggregation is one registry entry: the config accepts it and the update uses its behaviour (here
    the token mean under another name: the update trains exactly as under ``token``)."""
    mine = loss.Aggregation("token-again", unit="tokens", per="tokens", reduce=loss.aggregate_token)
    monkeypatch.setitem(loss.AGGREGATIONS, mine.name, mine)
    assert MMGRPOConfig(loss_aggregation="token-again").section(UpdateConfig).aggregation is mine
    monkeypatch.setitem(credit.CREDIT, "judge-all", credit.Credit("judge-all", credit.own_output, per_call=True))
    MMGRPOConfig(credit="judge-all", frozen_roles=["b"], skip_frozen=True)  # per-call: skip_frozen allowed
    with pytest.raises(ValidationError, match="per-call credit"):
        MMGRPOConfig(credit="inherit", frozen_roles=["b"], skip_frozen=True)


def test_a_registered_aggregation_trains_through_its_object(tiny_handle, monkeypatch):
    mine = loss.Aggregation("token-again", unit="tokens", per="tokens", reduce=loss.aggregate_token)
    monkeypatch.setitem(loss.AGGREGATIONS, mine.name, mine)
    model = get_peft_model(copy.deepcopy(tiny_handle.model),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    start = [p.detach().clone() for p in params]
    rows = [Row("default", "a", tuple(range(10, 20)), [30, 31, 32], 1.0),
            Row("default", "a", tuple(range(10, 20)), [40], -1.0),
            Row("default", "b", tuple(range(50, 56)), [60, 61], 0.5)]

    def step(name):
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        stats = update_adapter(model, torch.optim.SGD(params, lr=1.0), rows,
                               config=UpdateConfig(loss_aggregation=name, max_grad_norm=1e9), temperature=1.0)
        return stats["loss"], [p.detach().clone() for p in params]

    ref_loss, ref = step("token")
    got_loss, got = step("token-again")
    assert got_loss == ref_loss and all(torch.equal(a, b) for a, b in zip(got, ref))
    assert not all(torch.equal(a, b) for a, b in zip(ref, start))


def test_the_update_stage_is_given_its_sections():
    for fn in (update.update, update.update_rows, update.update_adapter, update._backward):
        sig = inspect.signature(fn)
        assert sig.parameters["config"].annotation == "UpdateConfig"
        assert "temperature" in sig.parameters  # the rollouts' sampling temperature, from the sampling section
    for fn in (update.update, update.update_rows):
        assert inspect.signature(fn).parameters["guards"].annotation == "GuardsConfig"


def test_recipes_are_flat_fields_of_the_sections():
    for name, recipe in RECIPES.items():
        cfg = MMGRPOConfig(**recipe)
        assert set(recipe) <= set(MMGRPOConfig.model_fields), name
        assert cfg.sections().run.steps == cfg.steps


def test_sections_are_sections():
    assert all(issubclass(kind, Section) and kind.model_config["frozen"] for kind in SECTIONS.values())
