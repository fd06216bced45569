"""Guards as pure functions, against tables worked out by hand (see the rules in compilers/guards.py)."""

import json
import math

import pytest
import torch

from compilers import MMGRPO, mmgrpo
from compilers.group import Group, Member
from compilers.guards import (
    Cliff, adapter_learning_rates, balance_weights, capped_shares, check_role_keys, cohort_sizes, detect_cliff,
    entropy_bonus, fanout_cohorts, fanout_weights, role_mass,
)
from compilers.update import Row
from programs import Single, Voting
from wfc.artifact import adapter_state, restore_adapter
from wfc.rollout import CallNode
from tiny_setup import SIG, TRAIN, length_metric, tiny_config



def call(id, role, span, prompt=None, invocation=0):
    """A hand-built call: ``span`` = (started, finished) ticks; prompt ids default to unique per call."""
    return CallNode(id=id, role=role, invocation=invocation, messages=[], prompt_ids=prompt or [1000 + id],
                    completion_ids=[1, 2], started=span[0], finished=span[1])


def group(role, invocation, members, example=0):
    """``members``: (rollout, call) or (rollout, call, repeated)."""
    return Group(example=example, role=role, invocation=invocation,
                 members=[Member(m[1], 1.0, m[0], *m[2:]) for m in members])


# ----- fan-out ---------------------------------------------------------------------------------------------------

def test_voters_on_one_prompt_weigh_one_third_each_aggregator_one():
    # two rollouts of Voting(n=3): voters in flight together on one prompt, then one aggregator
    r0 = [call(0, "voter", (1, 4), [7, 7]), call(1, "voter", (2, 5), [7, 7]), call(2, "voter", (3, 6), [7, 7])]
    r1 = [call(0, "voter", (1, 4), [7, 7]), call(1, "voter", (2, 5), [7, 7]), call(2, "voter", (3, 6), [7, 7])]
    groups = [group("voter", k, [(0, r0[k]), (1, r1[k])]) for k in range(3)]
    groups.append(group("aggregator", 0, [(0, call(3, "aggregator", (7, 8))), (1, call(3, "aggregator", (7, 8)))]))
    w = fanout_weights(groups)
    expected = {(0, "voter", k, r): 1 / 3 for k in range(3) for r in (0, 1)}
    expected.update({(0, "aggregator", 0, 0): 1.0, (0, "aggregator", 0, 1): 1.0})
    assert w == pytest.approx(expected)
    assert cohort_sizes(groups) == {"voter": 3, "aggregator": 1}


def test_same_prompt_without_overlap_is_one_cohort():
    # the voters of a rollout can also be seen one after another (ticks not overlapping): same prompt joins them
    calls = [call(0, "voter", (1, 2), [5]), call(1, "voter", (3, 4), [5])]
    assert fanout_cohorts(calls) == [[0, 1]]
    w = fanout_weights([group("voter", k, [(0, calls[k])]) for k in range(2)])
    assert w == pytest.approx({(0, "voter", 0, 0): 0.5, (0, "voter", 1, 0): 0.5})


def test_workers_vary_per_rollout_ragged():
    # rollout 0: 3 workers in parallel on different subtasks; rollout 1: one worker. Ragged groups per invocation.
    r0 = [call(1, "worker", (2, 5)), call(2, "worker", (3, 6)), call(3, "worker", (4, 7))]
    r1 = [call(1, "worker", (2, 3))]
    groups = [group("worker", 0, [(0, r0[0]), (1, r1[0])]), group("worker", 1, [(0, r0[1])]),
              group("worker", 2, [(0, r0[2])])]
    w = fanout_weights(groups)
    assert w == pytest.approx({(0, "worker", 0, 0): 1 / 3, (0, "worker", 1, 0): 1 / 3, (0, "worker", 2, 0): 1 / 3,
                               (0, "worker", 0, 1): 1.0})


def test_fill_copies_count_in_their_cohort():
    # fill mode: rollout 1's single worker is repeated into invocations 1 and 2; its three rows share weight 1
    r0 = [call(1, "worker", (2, 5)), call(2, "worker", (3, 6)), call(3, "worker", (4, 7))]
    one = call(1, "worker", (2, 3))
    groups = [group("worker", 0, [(0, r0[0]), (1, one)]), group("worker", 1, [(0, r0[1]), (1, one, True)]),
              group("worker", 2, [(0, r0[2]), (1, one, True)])]
    w = fanout_weights(groups)
    assert all(v == pytest.approx(1 / 3) for v in w.values()) and len(w) == 6


@pytest.mark.parametrize("spans, prompts, cohorts", [
    ([(1, 2), (3, 4)], [[1], [2]], [[0], [1]]),  # sequential, different inputs (EvalOpt's evaluator rounds)
    ([(1, 3), (2, 5), (4, 6)], [[1], [2], [3]], [[0, 1, 2]]),  # 0~1 and 1~2 overlap: one cohort (transitive)
    ([(1, 4), (2, 5), (6, 9), (7, 10)], [[1], [2], [3], [4]], [[0, 1], [2, 3]]),  # two parallel waves
    ([(1, 2), (3, 4), (5, 6)], [[9], [8], [9]], [[0, 2], [1]]),  # same input asked twice, apart
    ([(0, 0), (0, 0)], [[1], [2]], [[0], [1]]),  # no ticks (never finished): only the prompt rule applies
])
def test_cohorts(spans, prompts, cohorts):
    calls = [call(i, "r", s, p) for i, (s, p) in enumerate(zip(spans, prompts))]
    assert fanout_cohorts(calls) == cohorts


def test_cohorts_are_per_rollout_and_per_example():
    a, b = call(0, "voter", (1, 3), [5]), call(0, "voter", (1, 3), [5])
    groups = [group("voter", 0, [(0, a), (1, b)]), group("voter", 0, [(0, a)], example=1)]
    assert set(fanout_weights(groups).values()) == {1.0}


# ----- role balance ----------------------------------------------------------------------------------------------

MASS = {"a": 60.0, "b": 30.0, "c": 10.0}


@pytest.mark.parametrize("cap, shares, weights", [
    (None, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"a": 100 / 3 / 60, "b": 100 / 3 / 30, "c": 100 / 3 / 10}),
    (0.5, {"a": 0.5, "b": 0.375, "c": 0.125}, {"a": 50 / 60, "b": 1.25, "c": 1.25}),
    (0.4, {"a": 0.4, "b": 0.4, "c": 0.2}, {"a": 40 / 60, "b": 40 / 30, "c": 2.0}),  # b capped in the 2nd round
    (0.6, {"a": 0.6, "b": 0.3, "c": 0.1}, {"a": 1.0, "b": 1.0, "c": 1.0}),  # cap not binding
    (0.25, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"a": 100 / 3 / 60, "b": 100 / 3 / 30, "c": 100 / 3 / 10}),  # < 1/m
])
def test_balance_table(cap, shares, weights):
    assert capped_shares(MASS, cap=cap) == pytest.approx(shares)
    b = balance_weights(MASS, cap=cap)
    assert b == pytest.approx(weights)
    assert sum(b[r] * MASS[r] for r in MASS) == pytest.approx(sum(MASS.values()))  # the loss scale is unchanged
    assert max(b[r] * MASS[r] for r in MASS) / 100 <= max(cap or 0, 1 / 3) + 1e-9


def test_balance_edges():
    assert balance_weights({}) == {}
    assert balance_weights({"a": 10.0}) == {"a": 1.0}
    assert balance_weights({"a": 0.0, "b": 50.0, "c": 150.0}) == pytest.approx({"a": 1.0, "b": 2.0, "c": 2 / 3})
    assert balance_weights({"a": 0.0, "b": 0.0}) == {"a": 1.0, "b": 1.0}
    with pytest.raises(ValueError, match="cap"):
        balance_weights(MASS, cap=0.0)
    with pytest.raises(ValueError, match="cap"):
        balance_weights(MASS, cap=1.5)
    with pytest.raises(ValueError, match="finite"):
        balance_weights({"a": -1.0, "b": 1.0})
    with pytest.raises(ValueError, match="finite"):
        balance_weights({"a": math.nan, "b": 1.0})


def test_role_mass_counts_rows_that_carry_gradient():
    rows = [Row("s", "a", (1,), [1, 2, 3, 4], 1.0, 0.5), Row("s", "a", (1,), [1] * 10, 0.0, 1.0),
            Row("s", "b", (2,), [1, 2, 3], -1.0, 1.0), Row("s", "c", (3,), [1], 0.0, 1.0)]
    assert role_mass(rows) == {"a": 2.0, "b": 3.0, "c": 0.0}
    assert role_mass(rows, unit="rows") == {"a": 0.5, "b": 1.0, "c": 0.0}
    assert role_mass(rows, beta=0.1) == {"a": 12.0, "b": 3.0, "c": 1.0}  # with KL every row has a gradient
    with pytest.raises(ValueError, match="unit"):
        role_mass(rows, unit="bytes")


# ----- per-role learning rates and config keys -------------------------------------------------------------------

def test_adapter_learning_rates():
    roles = {"solver": "A", "judge": "B", "reviser": "A"}
    assert adapter_learning_rates(roles, 1e-3) == {"A": 1e-3, "B": 1e-3}
    assert adapter_learning_rates(roles, 1e-3, {"judge": 5e-4}) == {"A": 1e-3, "B": 5e-4}
    assert adapter_learning_rates(roles, 1e-3, {"solver": 2e-4, "reviser": 2e-4}) == {"A": 2e-4, "B": 1e-3}
    with pytest.raises(ValueError, match="share adapter 'A'"):
        adapter_learning_rates(roles, 1e-3, {"solver": 1e-4})
    with pytest.raises(ValueError, match="unknown role"):
        adapter_learning_rates(roles, 1e-3, {"critic": 1e-4})
    with pytest.raises(ValueError, match="role_max_grad_norm names unknown"):
        check_role_keys("role_max_grad_norm", {"critic": 1.0}, list(roles))


# ----- cliff detection --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("accs, after, expected", [
    ([0.2, 0.6, 0.3, 0.3], None, Cliff(1, 0.6, (2, 3), (0.3, 0.3))),
    ([0.2, 0.6, 0.3], None, None),  # one bad evaluation, patience 2
    ([0.2, 0.6, 0.3, 0.55, 0.3], None, None),  # 0.55 is within the drop: the run of bad evaluations restarts
    ([0.5, 0.4, 0.4], None, None),  # exactly `drop` below is not "more than"
    ([0.6, 0.6, 0.4, 0.45], None, Cliff(0, 0.6, (2, 3), (0.4, 0.45))),  # ties: the earliest best
    ([0.2, 0.6, 0.3, 0.3, 0.3], 3, None),  # after a rollback at step 3 only step 4 counts
    ([0.2, 0.6, 0.3, 0.3, 0.3, 0.2], 3, Cliff(1, 0.6, (4, 5), (0.3, 0.2))),
    ([0.9, 0.1, 0.1, 0.1, 0.1], None, Cliff(0, 0.9, (3, 4), (0.1, 0.1))),  # the last `patience` evaluations
    ([], None, None),
])
def test_detect_cliff_table(accs, after, expected):
    assert detect_cliff(list(enumerate(accs)), drop=0.1, patience=2, after_step=after) == expected


def test_detect_cliff_options():
    evals = [(0, 0.9), (5, 0.5)]
    assert detect_cliff(evals, drop=0.3, patience=1) == Cliff(0, 0.9, (5,), (0.5,))
    assert detect_cliff(evals, drop=0.5, patience=1) is None
    with pytest.raises(ValueError, match="patience"):
        detect_cliff(evals, drop=0.1, patience=0)
    with pytest.raises(ValueError, match="drop"):
        detect_cliff(evals, drop=-0.1, patience=1)


# ----- in the loop, on the tiny model ----------------------------------------------------------------------------

def small(**kw):
    return tiny_config(**{"steps": 1, "keep": "best", **kw})


def test_fanout_and_balance_show_in_the_step_log(engine, tmp_path):
    compiled = MMGRPO(length_metric, **small(eval_every=0)).compile(
        Voting(SIG, n=3), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    step = next(r for r in compiled.manifest.history if r["kind"] == "step")
    voter, aggregator = step["roles"]["voter"], step["roles"]["aggregator"]
    assert voter["fan_out"] == 3 and voter["fanout_weight"] == pytest.approx(1 / 3)
    assert aggregator["fan_out"] == 1 and aggregator["fanout_weight"] == 1.0
    assert step["guards"] == {"fanout_scaling": True, "role_balance": True, "role_share_cap": None, "role_clip": True,
                              "cliff_guard": False, "entropy_floor": None}
    assert voter["entropy_bonus"] == 0.0 and aggregator["entropy_bonus"] == 0.0
    if voter["mass_share_raw"] and aggregator["mass_share_raw"]:
        assert voter["mass_share"] == pytest.approx(0.5) and aggregator["mass_share"] == pytest.approx(0.5)


def test_entropy_floor_shows_in_the_step_log(engine, tmp_path):
    """A floor above any entropy the tiny model samples (it is near uniform over 49k tokens: ~10 nats) gives every
    role the bonus; the log says so per role."""
    compiled = MMGRPO(length_metric, **small(eval_every=0, entropy_floor=100.0, entropy_coef=0.05)).compile(
        Voting(SIG, n=3), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    step = next(r for r in compiled.manifest.history if r["kind"] == "step")
    assert step["guards"]["entropy_floor"] == 100.0
    assert {r: s["entropy_bonus"] for r, s in step["roles"].items()} == {"voter": 0.05, "aggregator": 0.05}
    assert all(0 < s["entropy"] < 100.0 for s in step["roles"].values())


def test_entropy_floor_gives_no_bonus_where_the_engine_measured_no_entropy(tmp_path):
    """A scripted engine reports no log-probs, so its rows' sampled entropy is unknown (logged as 0.0): the floor
    must not read that as a collapse."""
    from wfc.engines.fake import ScriptedEngine
    from wfc.policy import Policy

    policy = Policy("tiny", device="cpu")
    engine = ScriptedEngine(lambda request: "[[ ## answer ## ]]\nseven", tokenizer=policy.tokenizer)
    compiled = MMGRPO(length_metric, **small(eval_every=0, entropy_floor=100.0)).compile(
        Single(SIG), trainset=TRAIN, engine=engine, policy=policy, run_dir=tmp_path / "run", progress=False)
    step = next(r for r in compiled.manifest.history if r["kind"] == "step")
    assert {r: s["entropy_bonus"] for r, s in step["roles"].items()} == {"solver": 0.0}


def test_cliff_rolls_back_to_the_exact_stored_weights(engine, tmp_path, monkeypatch):
    # validation accuracy scripted per evaluation (steps 0..4): best at step 1, then two evaluations > 0.1 below it
    script = iter([0.2, 0.6, 0.3, 0.3, 0.5])

    def fake_evaluate(*args, **kwargs):
        acc = next(script)
        return {"accuracy": acc, "interval": (acc, acc), "n": 1, "format_error_rate": 0.0, "crash_rate": 0.0,
                "graphs": []}

    starts = []  # adapter weights at the start of each step's update

    def spy_update(engine_, optimizers, groups, role_adapters, **kw):
        starts.append({a: adapter_state(engine_.model, a) for a in optimizers.optimizers})
        return real_update(engine_, optimizers, groups, role_adapters, **kw)

    real_update = mmgrpo.update
    monkeypatch.setattr(mmgrpo, "evaluate", fake_evaluate)
    monkeypatch.setattr(mmgrpo, "update", spy_update)
    compiled = MMGRPO(length_metric, **small(steps=4, cliff_drop=0.1, cliff_patience=2)).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:1], engine=engine, backend="isolated",
        run_dir=tmp_path / "run", progress=False)
    revisions = compiled.revisions
    assert sorted(revisions) == [0, 1, 2, 3, 4]
    [event] = compiled.manifest.events
    assert event["kind"] == "cliff" and event["step"] == 3 and event["to_step"] == 1
    assert event["fell_at"] == [2, 3] and event["accuracies"] == [0.3, 0.3]
    assert sorted(event["adapters"]) == ["aggregator", "voter"]
    assert event["learning_rates"] == {"voter": pytest.approx(2.5e-3), "aggregator": pytest.approx(2.5e-3)}
    for adapter, state in revisions[1].items():
        assert any(not torch.equal(state[k], revisions[3][adapter][k]) for k in state)  # it had moved on
        # step 4 started from exactly the best revision's weights
        assert all(torch.equal(state[k], starts[3][adapter][k]) for k in state)
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [logged] = [r for r in log if r["kind"] == "event"]
    assert logged["event"] == "cliff" and logged["to_step"] == 1
    step4 = [r for r in log if r["kind"] == "step"][-1]
    assert step4["roles"]["voter"]["lr"] == pytest.approx(2.5e-3)
    assert compiled.manifest.revision_step == 1  # keep="best"
    for adapter, state in revisions[1].items():
        now = adapter_state(engine.policy.model, adapter)
        assert all(torch.equal(state[k], now[k]) for k in state)


def test_cliff_guard_off_records_nothing(engine, tmp_path, monkeypatch):
    script = iter([0.6, 0.1, 0.1])
    monkeypatch.setattr(mmgrpo, "evaluate", lambda *a, **k: {"accuracy": next(script), "n": 1, "interval": (0.0, 1.0),
                                                              "format_error_rate": 0.0, "crash_rate": 0.0})
    compiled = MMGRPO(length_metric, **small(steps=2, cliff_guard=False, keep="last")).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:1], engine=engine, run_dir=tmp_path / "run", progress=False)
    assert compiled.manifest.events == [] and compiled.manifest.revision_step == 2


def test_per_role_clipping_clips_each_contribution_before_summing(engine):
    from peft import LoraConfig

    from compilers.config import UpdateConfig
    from compilers.update import update_adapter

    engine.policy.add_adapter("x", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model = engine.policy.model
    model.set_adapter("x")
    params = [p for n, p in model.named_parameters() if ".x." in n]
    start = adapter_state(model, "x")
    rows = [Row("x", "a", tuple(range(10, 20)), [30, 31, 32, 33], 1.0),
            Row("x", "a", tuple(range(10, 20)), [40, 41], -1.0), Row("x", "b", tuple(range(50, 58)), [60, 61, 62], 0.5)]
    cfg = UpdateConfig(max_grad_norm=1e9)

    def delta(limits):  # SGD with lr 1: the parameter change is minus the summed, clipped gradient
        restore_adapter(model, "x", start)
        before = [p.detach().clone() for p in params]
        stats = update_adapter(model, torch.optim.SGD(params, lr=1.0), rows, config=cfg, temperature=1.0,
                               role_max_grad_norm=limits)
        return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, params)]), stats

    full, st = delta({})
    only_b, st_b = delta({"a": 1e-12})
    only_a, _ = delta({"b": 1e-12})
    assert st_b["roles"]["a"]["clipped"] and not st_b["roles"]["b"]["clipped"]
    assert torch.allclose(full, only_a + only_b, atol=1e-6)  # contributions add up to the whole loss's gradient
    norm_a = st["roles"]["a"]["grad_norm"]
    assert norm_a > 0 and torch.linalg.vector_norm(only_a) == pytest.approx(norm_a, rel=1e-4)
    half, st_half = delta({"a": norm_a / 2})
    assert torch.linalg.vector_norm(half - only_b) == pytest.approx(norm_a / 2, rel=1e-3)  # a's part clipped to c
    assert st_half["roles"]["a"]["clipped"]
    restore_adapter(model, "x", start)


# ----------------------------------------------------------------------------------------------------------------
# Entropy floor


@pytest.mark.parametrize("floor, coef, expected", [
    # voter 0.08 and aggregator 0.35 nats per token (the demo's weak draw at step 6 had voters at 0.08)
    (0.2, 0.1, {"voter": 0.1, "aggregator": 0.0}),
    (0.5, 0.1, {"voter": 0.1, "aggregator": 0.1}),
    (0.08, 0.1, {"voter": 0.0, "aggregator": 0.0}),  # at the floor is not below it
    (None, 0.1, {"voter": 0.0, "aggregator": 0.0}),  # off
    (0.2, 0.0, {"voter": 0.0, "aggregator": 0.0}),
])
def test_entropy_bonus_table(floor, coef, expected):
    assert entropy_bonus({"voter": 0.08, "aggregator": 0.35}, floor=floor, coef=coef) == expected


def test_entropy_bonus_rejects_bad_settings():
    with pytest.raises(ValueError, match="coef must be >= 0"):
        entropy_bonus({"voter": 0.1}, floor=0.2, coef=-0.1)
    with pytest.raises(ValueError, match="floor must be >= 0"):
        entropy_bonus({"voter": 0.1}, floor=-0.2, coef=0.1)


def test_entropy_floor_raises_a_collapsed_roles_entropy(tiny_handle):
    """On the tiny real model: one update on rows whose advantages are all 0 moves nothing without the bonus, and
    with it raises the policy's entropy at the trained positions (the bonus's gradient acts where no reward
    signal does)."""
    import copy

    from compilers.config import MMGRPOConfig, UpdateConfig
    from compilers.packing import packed_logprobs
    from compilers.update import AdapterOptimizers, update_adapter
    from peft import get_peft_model

    cfg = MMGRPOConfig(learning_rate=1e-2, temperature=1.0, lora={"r": 4, "alpha": 8})
    model = get_peft_model(copy.deepcopy(tiny_handle.model), cfg.lora.peft_config())
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 1000, (6,), generator=g).tolist()
    rows = [Row(role="voter", adapter="default", prompt_ids=tuple(prompt),
                completion_ids=torch.randint(0, 1000, (4,), generator=g).tolist(), advantage=0.0)
            for _ in range(3)]

    def mean_entropy():
        with torch.no_grad():
            out = packed_logprobs(model, [(prompt, [r.completion_ids for r in rows])], entropy=True)
        return float(torch.cat([t[:, 1] for t in out[0]]).mean())

    opt = AdapterOptimizers(model, ["default"], lr=cfg.learning_rate)
    before = mean_entropy()
    st = update_adapter(model, opt.optimizers["default"], rows, config=cfg.section(UpdateConfig), temperature=1.0)
    assert st["trained_rows"] == 0 and mean_entropy() == before  # no advantage, no bonus: no update
    st = update_adapter(model, opt.optimizers["default"], rows, config=cfg.section(UpdateConfig), temperature=1.0,
                        entropy_coefs={"voter": 1.0})
    assert st["trained_rows"] == 3
    assert mean_entropy() > before + 1e-4


def test_the_step_logs_entropy_is_per_token_for_free_text_and_per_choice_for_a_choice_role():
    """A free-text role's entropy estimate is the mean negative log-prob of its sampled tokens; a choice role's is
    the mean negative log q(c) of its sampled choices (its calls' log-probs sum to log q(c)), by hand."""
    from compilers.mmgrpo import _role_stats
    from wfc.rollout import CallNode, RolloutGraph

    def call(i, role, logprobs, choices=None):
        return CallNode(id=i, role=role, invocation=0, messages=[{"role": "user", "content": "q"}],
                        completion_ids=list(range(len(logprobs))), logprobs=logprobs, choice_ids=choices,
                        outputs={"x": "y"}, started=2 * i, finished=2 * i + 1)

    verdicts = [[1, 2], [3, 4]]
    graphs = [RolloutGraph([call(0, "writer", [-0.5, -1.5, -1.0]), call(1, "judge", [-0.25, -0.5], verdicts)],
                           example={}, outputs={"x": "y"}),
              RolloutGraph([call(0, "writer", [-2.0]), call(1, "judge", [-1.0, 0.0], verdicts)],
                           example={}, outputs={"x": "y"})]
    stats = _role_stats(graphs, [])
    assert stats["writer"]["entropy"] == pytest.approx((0.5 + 1.5 + 1.0 + 2.0) / 4)  # per token
    assert stats["judge"]["entropy"] == pytest.approx((0.75 + 1.0) / 2)  # per choice
    assert stats["judge"]["entropy_measured"] and stats["writer"]["entropy_measured"]
