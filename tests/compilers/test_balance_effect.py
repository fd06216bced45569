"""Role balancing and fan-out scaling change what the update trains, not only what the step log reports (issue 48,
item 6): through ``compilers.update.update`` on the tiny model, two roles sharing one adapter, both with gradient.

The loss is linear in the row weights (``compilers.loss.policy_loss``), so a role's own gradient norm scales by
exactly its weight, and with SGD at lr 1 the adapter's change is the weighted sum of the roles' gradients. The
expected weights are worked out by hand here, not read back from ``compilers.guards``.
"""

import pytest
import torch
from peft import LoraConfig

from compilers.config import MMGRPOConfig
from compilers.group import Group, Member
from compilers.guards import fanout_weights
from compilers.update import AdapterOptimizers, adapter_parameters, update
from tiny_setup import tiny_config
from wfc.rollout import CallNode

ROLLOUTS = 4
ADVANTAGES = [0.5, -0.5, 0.5, -0.5]  # every row carries gradient


def _call(id, role, prompt, tokens, span=(0, 1)):
    return CallNode(id=id, role=role, invocation=0, messages=[], prompt_ids=list(prompt),
                    completion_ids=[300 + (7 * id + 3 * j) % 97 for j in range(tokens)], started=span[0],
                    finished=span[1])


def _group(role, invocation, calls, advantages=ADVANTAGES):
    """One group of ``calls`` (one per rollout), with its advantages set."""
    g = Group(example=0, role=role, invocation=invocation,
              members=[Member(c, 0.0, r) for r, c in enumerate(calls)])
    g.advantages = list(advantages)
    return g


@pytest.fixture
def shared(engine):
    """The tiny model's policy with one adapter ``shared`` and its initial weights."""
    torch.manual_seed(0)
    engine.policy.add_adapter("shared", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return engine.policy, engine.policy.adapter_state("shared")


def _step(policy, start, groups, role_adapters, *, sgd=False, weights=None, **config):
    """One ``update`` from ``start``: (the adapter's stats, its weight change). Per-role and global clipping are off,
    so the reported per-role gradient norms are the weighted gradients themselves."""
    policy.restore_adapter("shared", start)
    cfg = MMGRPOConfig(**tiny_config(role_clip=False, max_grad_norm=1e9, **config))
    optimizers = AdapterOptimizers(policy, ["shared"], lr=1e-3)
    if sgd:  # the change is then minus the summed, weighted gradient
        optimizers.optimizers["shared"] = torch.optim.SGD(adapter_parameters(policy.model, "shared"), lr=1.0)
    sections = cfg.sections()
    stats = update(policy, optimizers, groups, role_adapters, config=sections.update, guards=sections.guards,
                   temperature=sections.sampling.temperature, weights=weights)["shared"]
    after = policy.adapter_state("shared")
    return stats, torch.cat([(after[k] - start[k]).flatten() for k in sorted(start)])


def _balance_groups(planner_advantages=ADVANTAGES, writer_advantages=ADVANTAGES):
    # the writer writes 12 tokens per call, the planner 2: the writer holds 48 of the 56 tokens of gradient mass
    writer = [_call(10 + r, "writer", range(100, 110), 12) for r in range(ROLLOUTS)]
    planner = [_call(20 + r, "planner", range(120, 126), 2) for r in range(ROLLOUTS)]
    return [_group("writer", 0, writer, writer_advantages), _group("planner", 0, planner, planner_advantages)]


ROLES = {"writer": "shared", "planner": "shared"}
# equal shares of the mass M = 48 + 8: b_role = (M / 2) / M_role
BALANCE = {"writer": 28 / 48, "planner": 28 / 8}


def test_role_balancing_rescales_each_roles_gradient_in_the_update(shared):
    policy, start = shared
    off, delta_off = _step(policy, start, _balance_groups(), ROLES, role_balance=False)
    on, delta_on = _step(policy, start, _balance_groups(), ROLES, role_balance=True)
    for role, b in BALANCE.items():
        assert off["roles"][role]["grad_norm"] > 0
        # the gradient each role actually put into the adapter, not only the reported weight
        assert on["roles"][role]["grad_norm"] == pytest.approx(b * off["roles"][role]["grad_norm"], rel=1e-4)
        assert on["roles"][role]["balance_weight"] == pytest.approx(b)
    assert on["roles"]["planner"]["grad_norm"] / on["roles"]["writer"]["grad_norm"] > \
        5 * off["roles"]["planner"]["grad_norm"] / off["roles"]["writer"]["grad_norm"]  # 6x: 3.5 / 0.583
    assert on["roles"]["planner"]["mass_share"] == pytest.approx(0.5)
    assert off["roles"]["planner"]["mass_share"] == pytest.approx(8 / 56)
    assert not torch.allclose(delta_on, delta_off)


def test_role_balancing_moves_the_weights_by_the_balanced_sum_of_the_roles_gradients(shared):
    policy, start = shared
    flat = [0.0] * ROLLOUTS  # a role with no advantage adds no gradient but keeps the token normalization
    _, writer = _step(policy, start, _balance_groups(planner_advantages=flat), ROLES, sgd=True, role_balance=False)
    _, planner = _step(policy, start, _balance_groups(writer_advantages=flat), ROLES, sgd=True, role_balance=False)
    _, off = _step(policy, start, _balance_groups(), ROLES, sgd=True, role_balance=False)
    _, on = _step(policy, start, _balance_groups(), ROLES, sgd=True, role_balance=True)
    scale = off.abs().max()
    assert (off - (writer + planner)).abs().max() < 1e-4 * scale  # SGD at lr 1: the change is the summed gradient
    balanced = BALANCE["writer"] * writer + BALANCE["planner"] * planner
    assert (on - balanced).abs().max() < 1e-4 * scale
    assert (on - off).abs().max() > 0.1 * scale


def _voting_groups():
    """ROLLOUTS rollouts of Voting(n=3): in each, three voters in flight together on one prompt (one cohort),
    then one aggregator call, 4 tokens each."""
    voters = [[_call(3 * r + k, "voter", range(100, 108), 4, span=(1 + k, 4 + k)) for r in range(ROLLOUTS)]
              for k in range(3)]
    aggregator = [_call(50 + r, "aggregator", range(130, 140), 4, span=(7, 8)) for r in range(ROLLOUTS)]
    return [_group("voter", k, voters[k]) for k in range(3)] + [_group("aggregator", 0, aggregator)]


def test_fanout_scaling_weighs_a_fanned_out_roles_gradient_by_one_over_k_in_the_update(shared):
    policy, start = shared
    roles = {"voter": "shared", "aggregator": "shared"}
    groups = _voting_groups()
    weights = fanout_weights(groups)
    assert sorted(set(weights.values())) == pytest.approx([1 / 3, 1.0])  # voters 1/3, the aggregator 1
    # role balancing off: it would set the roles' shares itself, whatever the fan-out weights
    plain, delta_plain = _step(policy, start, groups, roles, role_balance=False)
    scaled, delta_scaled = _step(policy, start, groups, roles, role_balance=False, weights=weights)
    assert scaled["roles"]["voter"]["grad_norm"] == pytest.approx(plain["roles"]["voter"]["grad_norm"] / 3, rel=1e-4)
    assert scaled["roles"]["aggregator"]["grad_norm"] == pytest.approx(plain["roles"]["aggregator"]["grad_norm"],
                                                                       rel=1e-4)
    # the voters' 3 x 4 rows per rollout weigh as much as the aggregator's 1 x 4 once scaled: a share of 1/2, not 3/4
    assert plain["roles"]["voter"]["mass_share"] == pytest.approx(3 / 4)
    assert scaled["roles"]["voter"]["mass_share"] == pytest.approx(1 / 2)
    assert not torch.allclose(delta_plain, delta_scaled)
