"""The warm start (compilers.warm_start): successes selected from hand-built rollouts (passing runs, dedup, the
per-example cap, frozen and unfinished calls left out), the loss convention, the token-mean NLL, and on the tiny real
model a compile whose warm start is logged, trains the adapters before step 1 and leaves the base alone, resumes
without warming again, and skips the fine-tune when no run passes."""

import json

import pytest
import torch

from compilers import MMGRPO
from compilers.config import MMGRPOConfig, UpdateConfig
from compilers.loop import CompileRun
from compilers.loss import policy_loss
from compilers.packing import naive_logprobs
from compilers.update import Row, completion_nll
from compilers.warm_start import (Harvest, batches, nll_by_role, passes, role_counts, run_counts, sft_rows,
                                  sft_sections, successes)
from programs import Single, Voting
from tiny_setup import SIG, TRAIN, length_metric, tiny_config
from wfc.engines.hf import HFEngine
from wfc.models import load_model
from wfc.policy import Policy
from wfc.rollout import CallNode, RolloutGraph


# ----- pure helpers ---------------------------------------------------------------------------------------------------
def call(i, role, prompt, completion, **kw):
    return CallNode(id=i, role=role, invocation=0, messages=[], prompt_ids=prompt, completion_ids=completion, **kw)


def run(reward, *calls, status="ok"):
    g = RolloutGraph(list(calls), example={}, status=status)
    g.reward = reward
    return g


def table():
    """Example 0: r0 passes (A [1]->[3], B [4]->[5]); r1 passes (A repeats r0's: a duplicate; B [4]->[6], new);
    r2 scores 0.5 (not full marks); r3 crashed with reward 1 (not finished). Example 1: r0 passes with A's call a
    format error, A [2]->[4] cut at its budget (kept), a frozen role F, B with an empty completion and B [9]->[10];
    r1 fails."""
    ex0 = [run(1.0, call(0, "A", [1], [3]), call(1, "B", [4], [5])),
           run(1.0, call(0, "A", [1], [3]), call(1, "B", [4], [6])),
           run(0.5, call(0, "A", [1], [7]), call(1, "B", [4], [8])),
           run(1.0, call(0, "A", [1], [2]), status="crash")]
    ex1 = [run(1.0, call(0, "A", [2], [3], status="format_error"), call(1, "A", [2], [4], finish_reason="length"),
               call(2, "F", [5], [6]), call(3, "B", [9], []), call(4, "B", [9], [10])),
           run(0.0, call(0, "A", [2], [5]))]
    return [ex0, ex1]


def kept(h: Harvest):
    return [(s.example, s.role, s.call.prompt_ids, s.call.completion_ids) for s in h.kept]


def test_successes_are_the_finished_calls_of_passing_runs_deduplicated_per_example():
    h = successes(table(), ["A", "B"])
    assert kept(h) == [(0, "A", [1], [3]), (0, "B", [4], [5]), (0, "B", [4], [6]), (1, "A", [2], [4]),
                       (1, "B", [9], [10])]
    assert (h.duplicates, h.capped) == (1, 0)
    assert role_counts(h.kept, ["A", "B"]) == {"A": 2, "B": 3}
    assert role_counts([], ["A", "B"]) == {"A": 0, "B": 0}  # a role with no success still shows


def test_the_cap_keeps_each_examples_first_successes_per_role():
    h = successes(table(), ["A", "B"], max_per_example=1)
    assert kept(h) == [(0, "A", [1], [3]), (0, "B", [4], [5]), (1, "A", [2], [4]), (1, "B", [9], [10])]
    assert (h.duplicates, h.capped) == (1, 1)  # B [4]->[6] of example 0 is past the cap
    with pytest.raises(ValueError, match="max_per_example"):
        successes(table(), ["A"], max_per_example=0)


def test_a_frozen_role_is_never_a_success_and_the_same_call_in_another_example_counts_again():
    assert kept(successes(table(), ["F"])) == [(1, "F", [5], [6])]
    assert kept(successes(table(), [])) == []
    again = [[run(1.0, call(0, "A", [1], [3]))], [run(1.0, call(0, "A", [1], [3]))]]
    assert kept(successes(again, ["A"])) == [(0, "A", [1], [3]), (1, "A", [1], [3])]


def test_a_call_whose_reasoning_does_not_end_at_its_answer_is_not_a_success():
    rollouts = [[run(1.0, call(0, "A", [1], [3], outputs={"reasoning": "1. 3 x 2 = 6", "answer": 2}),
                     call(1, "A", [1], [4], outputs={"reasoning": "1. 6 - 4 = 2", "answer": 2}),
                     call(2, "B", [5], [6], outputs={"answer": 2}))]]  # no reasoning: nothing to check
    h = successes(rollouts, ["A", "B"])
    assert kept(h) == [(0, "A", [1], [4]), (0, "B", [5], [6])]
    assert h.unconcluded == 1


def test_run_counts_and_passes():
    # tokens: example 0 has 2 + 2 + 2 + 1, example 1 has 1 + 1 + 1 + 0 + 1 and 1
    assert run_counts(table()) == {"runs": 6, "passing_runs": 3, "examples_passed": 2, "completion_tokens": 12}
    assert not passes(run(1.0, status="format_error")) and passes(run(1.0 - 1e-12))
    with pytest.raises(ValueError, match="score every rollout"):
        passes(RolloutGraph([], example={}))


def test_sft_rows_have_advantage_one_and_no_engine_logprobs():
    h = successes([[run(1.0, call(0, "A", [1, 2], [3], logprobs=[-0.5], grammar="g", choice_ids=[[3], [4]]))]],
                  ["A"])
    [row] = sft_rows(h.kept, {"A": "shared"})
    assert (row.adapter, row.role, row.prompt_ids, row.completion_ids, row.advantage, row.weight) == \
        ("shared", "A", (1, 2), [3], 1.0, 1.0)
    assert row.engine_logprobs is None and row.grammar == "g" and row.choices == [[3], [4]]
    with pytest.raises(ValueError, match="without an adapter"):
        sft_rows(h.kept, {"B": "shared"})


def test_batches_cover_every_row_once_in_a_seeded_order():
    b = batches(10, 4, seed=1)
    assert [len(x) for x in b] == [4, 4, 2] and sorted(i for x in b for i in x) == list(range(10))
    assert b == batches(10, 4, seed=1) and b != batches(10, 4, seed=2)
    assert batches(0, 4, seed=1) == []
    with pytest.raises(ValueError, match="batch size"):
        batches(3, 0, seed=1)


def test_nll_by_role_is_token_mean():
    rows = [Row("a", "A", (1,), [2, 3], 1.0), Row("a", "A", (1,), [4, 5], 1.0), Row("a", "B", (1,), [6], 1.0),
            Row("a", "C", (1,), [7], 1.0)]
    # A: (2.0 + 1.0) / (2 + 2); B: 3.0 / 1; C: every token forced (0 free); all: 6.0 / 5
    assert nll_by_role(rows, [(2.0, 2), (1.0, 2), (3.0, 1), (0.0, 0)]) == {"all": 1.2, "A": 0.75, "B": 3.0,
                                                                          "C": None}
    with pytest.raises(ValueError, match="one per row"):
        nll_by_role(rows, [(1.0, 1)])


def test_the_loss_convention_advantage_one_ratio_one_is_token_mean_nll():
    # two rows, three completion tokens: the gradient of the surrogate at ratio 1 is that of -sum(logprobs) / 3
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    grpo = MMGRPOConfig(importance_correction="tis", inner_epochs=3, beta=0.1, loss_aggregation="sequence",
                        role_share_cap=0.6).sections()
    cfg, guards = sft_sections(grpo.update, grpo.guards)
    assert (cfg.importance_correction, cfg.inner_epochs, cfg.beta, cfg.loss_aggregation, guards.role_balance) == \
        ("none", 1, 0.0, "token", False)
    assert cfg.correction.name == "none" and cfg.aggregation.name == "token"  # the objects follow the names
    assert guards.role_clip and guards.role_share_cap == 0.6  # the other guards as GRPO's
    loss, st = policy_loss(lp, lp.detach(), torch.ones(2), mask, aggregation=cfg.loss_aggregation)
    loss.backward()
    third = -1 / 3
    assert torch.allclose(lp.grad, torch.tensor([[third, third, 0.0], [third, 0.0, 0.0]]))
    assert float(loss.detach()) == pytest.approx(-1.0) and st["clip_fraction"] == 0.0


def test_warm_start_config_is_checked():
    cfg = MMGRPOConfig()
    assert (cfg.warm_start_runs, cfg.warm_start_epochs, cfg.warm_start_lr, cfg.warm_start_max_per_example) == \
        (0, 1, None, None)  # off by default
    with pytest.raises(ValueError, match="strategy='p' trains prompts only"):
        MMGRPOConfig(warm_start_runs=2, strategy="p")
    for bad in ({"warm_start_runs": -1}, {"warm_start_epochs": 0}, {"warm_start_lr": 0.0}, {"warm_start_batch": 0},
                {"warm_start_max_per_example": 0}):
        with pytest.raises(ValueError):
            MMGRPOConfig(**bad)


# ----- the tiny real model --------------------------------------------------------------------------------------------
def test_completion_nll_is_the_naive_log_likelihood_of_free_tokens():
    policy = Policy(load_model("tiny"), device="cpu")
    policy.add_adapter("w", MMGRPOConfig(**tiny_config()).lora.peft_config())
    rows = [Row("w", "A", tuple(range(10, 30)), [40, 41, 42], 1.0), Row("w", "A", tuple(range(10, 30)), [50], 1.0),
            Row("w", "B", tuple(range(60, 70)), [71, 72], 1.0)]
    rows[2].free = [True, False]  # the second token forced by a grammar: no weight
    got = completion_nll(policy, rows, config=UpdateConfig(), temperature=0.7)
    with torch.no_grad():
        ref = [naive_logprobs(policy.model, [(list(r.prompt_ids), [r.completion_ids])], temperature=0.7)[0][0]
               for r in rows]
    assert [n for _, n in got] == [3, 1, 1]
    for (nll, _), r, want in zip(got, rows, [-ref[0].sum(), -ref[1].sum(), -ref[2][0]]):
        assert nll == pytest.approx(float(want), rel=1e-4)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def lora_b(state):
    return [v for k, v in state.items() if "lora_B" in k]


def test_warm_start_trains_each_roles_adapter_before_step_1_and_leaves_the_base_alone(engine, tmp_path):
    base = {id(p): p.detach().clone() for p in engine.policy.model.parameters()}  # peft keeps these as base layers
    run_dir = tmp_path / "run"
    compiled = MMGRPO(length_metric, **tiny_config(steps=1, warm_start_runs=3, warm_start_batch=8)).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine, backend="isolated", run_dir=run_dir,
        progress=False)
    log = records(run_dir)
    kinds = [r["kind"] for r in log]
    assert kinds.index("warm_start") < kinds.index("eval")  # the step-0 validation measures the warmed program
    [ws] = [r for r in log if r["kind"] == "warm_start"]
    assert ws["runs"] == 3 * len(TRAIN) and ws["runs_per_example"] == 3
    assert 0 < ws["passing_runs"] <= ws["runs"] and 0 < ws["examples_passed"] <= len(TRAIN)
    assert set(ws["successes"]) == {"voter", "aggregator"} and all(n > 0 for n in ws["successes"].values())
    total = sum(ws["successes"].values())
    assert ws["trained"] and ws["skipped"] is None and ws["optimizer_steps"] == -(-total // 8)
    assert ws["learning_rates"] == {a: 5e-3 for a in compiled.roles.values()}  # the GRPO rate by default
    assert set(ws["loss_before"]) == {"all", "voter", "aggregator"}
    assert ws["loss_after"]["all"] < ws["loss_before"]["all"]
    assert [r["kind"] for r in compiled.manifest.history][0] == "warm_start"
    # the warm start's tokens count in the rollout budget
    [step] = [r for r in log if r["kind"] == "step"]
    assert step["drawing"]["completion_tokens_total"] == ws["completion_tokens"] + step["drawing"]["completion_tokens"]
    # every adapter moved before step 1 (LoRA B starts at zero), the base did not
    for adapter, state in compiled.revisions[0].items():
        assert all(v.abs().sum() > 0 for v in lora_b(state)), adapter
    now = {id(p): p for p in engine.policy.model.parameters()}
    assert base.keys() <= now.keys() and all(torch.equal(now[i], v) for i, v in base.items())


def test_a_resume_does_not_warm_again_and_repeats_the_uninterrupted_run(engine, tmp_path, monkeypatch):
    # one rollout in flight at a time: no batch layout's float rounding can flip a sampled token between the runs
    config = tiny_config(warm_start_runs=2, eval_every=0, rollout_workers=1)
    full = MMGRPO(length_metric, **{**config, "steps": 2}).compile(
        Single(SIG), trainset=TRAIN, engine=engine, run_dir=tmp_path / "full", progress=False)
    run_dir = tmp_path / "cut"
    first, again = HFEngine(load_model("tiny"), batch_wait_s=0.02), HFEngine(load_model("tiny"), batch_wait_s=0.02)
    try:
        # stopped right after the warm start and the step-0 checkpoint, which must hold the warmed adapters
        MMGRPO(length_metric, **{**config, "steps": 0}).compile(Single(SIG), trainset=TRAIN, engine=first,
                                                                run_dir=run_dir, progress=False)

        def refuse(self):
            raise AssertionError("a resumed compile sampled the warm start again")

        monkeypatch.setattr(CompileRun, "sample_successes", refuse)
        resumed = MMGRPO(length_metric, **{**config, "steps": 2}).compile(
            Single(SIG), trainset=TRAIN, engine=again, run_dir=run_dir, progress=False, resume=run_dir)
    finally:
        first.close()
        again.close()
    log = records(run_dir)
    assert [r["kind"] for r in log].count("warm_start") == 1 and [r["after_step"] for r in log
                                                                   if r["kind"] == "resume"] == [0]
    assert next(r for r in log if r["kind"] == "warm_start")["trained"]  # the checkpoint held warmed adapters
    assert [r["kind"] for r in resumed.manifest.history].count("warm_start") == 1
    for adapter, state in full.revisions[2].items():
        for k, v in state.items():
            assert torch.allclose(v, resumed.revisions[2][adapter][k], rtol=0, atol=1e-6), (adapter, k)


def never(example, prediction, trace=None):
    return 0.0


def test_no_passing_run_logs_zero_successes_and_skips_the_fine_tune(engine, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.warns(UserWarning, match="no passing run among 24 sampled runs"):
        compiled = MMGRPO(never, **tiny_config(steps=0, warm_start_runs=2)).compile(
            Single(SIG), trainset=TRAIN, engine=engine, run_dir=run_dir, progress=False)
    [ws] = [r for r in records(run_dir) if r["kind"] == "warm_start"]
    assert ws["passing_runs"] == 0 and ws["successes"] == {r: 0 for r in compiled.roles}
    assert not ws["trained"] and ws["optimizer_steps"] == 0 and ws["loss_before"] is None
    assert "0 successes, nothing to fine-tune on" in ws["skipped"]
    for state in compiled.revisions[0].values():
        assert all(v.abs().sum() == 0 for v in lora_b(state))  # untouched: LoRA B is still zero
