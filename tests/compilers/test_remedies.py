"""``auto_remedies`` (compilers.remedies): the rule against hand-worked tables, and on the tiny real model a compile
that probes once, records its choice (log and manifest), warm-starts on the probe's own passing runs, sizes groups
adaptively, and re-applies the choice on a resume."""

import json

import pytest

from compilers import MMGRPO, remedies
from compilers.loop import CompileRun
from compilers.remedies import Remedies, choose, group_signal, pass_rates, probe_subset
from compilers.sampling import PromptSampler
from programs import Single
from tiny_setup import SIG, TRAIN, tiny_config
from wfc.engines.hf import HFEngine
from wfc.models import load_model


def test_group_signal_by_hand():
    # r=0 and r=1: every group flat; r=0.5 at G=2: 1 - 1/4 - 1/4 = 1/2; mean over the three = 1/6
    assert group_signal([0.0, 1.0, 0.5], 2) == pytest.approx(1 / 6)
    assert group_signal([0.1], 3) == pytest.approx(1 - 0.001 - 0.729)
    assert group_signal([], 4) == 0.0


def test_pass_rates_clip_rewards_per_example():
    rollouts = [[-1.0, 0.5], [2.0, 1.0]]
    assert pass_rates(rollouts, score=lambda r: r) == [0.25, 1.0]


@pytest.mark.parametrize("rates, passing, adaptive, warm, starved, says", [
    ([0.0] * 8, 0, False, False, True, "starved"),  # nothing passed: no sampling remedy helps
    ([0.5] * 8, 32, False, False, False, "no remedy needed"),  # G=4: 1 - 2/16 = 87.5% of groups have signal
    ([0.05] * 10 + [0.0] * 10, 8, True, True, False, "warm start"),  # signal 0.5 x 18.5% = 9.3%, mean 0.025
    ([0.05] * 10 + [0.0] * 10, 3, True, False, False, "no warm start: only 3"),
    ([0.3] * 4 + [0.0] * 12, 20, True, True, False, "adaptive_rollouts"),  # signal 4 x 75.2% / 16 = 18.8%
    ([0.4] * 8 + [0.0] * 8, 20, True, False, False, "adaptive_rollouts"),  # signal 41%, mean 0.2: no warm start
])
def test_choose_by_hand(rates, passing, adaptive, warm, starved, says):
    got = choose(rates, group_size=4, passing_runs=passing, runs_per_example=4)
    assert (got.adaptive_rollouts, got.warm_start, got.starved) == (adaptive, warm, starved)
    assert any(says in r for r in got.reasons)
    assert got.stats["group_signal"] == pytest.approx(group_signal(rates, 4))


def test_the_probe_takes_a_seeded_subset_of_a_large_trainset():
    assert probe_subset(5, 8, seed=0) == [0, 1, 2, 3, 4]
    picked = probe_subset(100, 8, seed=3)
    assert len(set(picked)) == 8 and picked == sorted(picked) and picked == probe_subset(100, 8, seed=3)
    assert picked != probe_subset(100, 8, seed=4)


def test_priming_some_examples_leaves_the_others_unknown():
    sampler = PromptSampler(4, seed=0)
    sampler.prime({1: 0.25, 3: 1.0}, order=False)
    assert sampler.rates == {1: 0.25, 3: 1.0}
    with pytest.raises(ValueError, match="every example"):
        sampler.prime({1: 0.5}, order=True)
    with pytest.raises(ValueError, match="outside"):
        sampler.prime({7: 0.5}, order=False)


def test_choose_needs_rates():
    with pytest.raises(ValueError, match="non-empty trainset"):
        choose([], group_size=4, passing_runs=0, runs_per_example=4)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def even_length(example, prediction, trace=None):
    return float(len(str(prediction.answer)) % 2 == 0)


def never(example, prediction, trace=None):
    return 0.0


def test_a_starved_probe_is_said_and_switches_nothing_on(engine, tmp_path, monkeypatch):
    monkeypatch.setattr("compilers.loop.AUTO_PROBE_EXAMPLES", 5)  # a subset of the 12 examples is probed
    run_dir = tmp_path / "run"
    MMGRPO(never, **tiny_config(steps=1, auto_remedies=True)).compile(Single(SIG), trainset=TRAIN, engine=engine,
                                                                      run_dir=run_dir, progress=False)
    log = records(run_dir)
    [rec] = [r for r in log if r["kind"] == "remedies"]
    assert rec["starved"] and rec["chose"] == {"adaptive_rollouts": False, "warm_start": False}
    assert "starved" in rec["reasons"][0] and rec["stats"]["runs_per_example"] == remedies.AUTO_PROBE_RUNS
    assert rec["stats"]["examples"] == 5
    assert not any(r["kind"] in ("probe", "warm_start") for r in log)
    [step] = [r for r in log if r["kind"] == "step"]
    assert step["drawing"]["group_sizes"] is None and "auto_remedies" in step["starvation"]["remedies"]


def test_the_choice_is_applied_logged_and_reapplied_on_resume(engine, tmp_path, monkeypatch):
    # the rule is tested above; here the wiring: force a choice of both remedies
    monkeypatch.setattr("compilers.loop.choose", lambda rates, **kw: Remedies(True, True, False, ("forced",), {}))
    config = tiny_config(auto_remedies=True, pass_rate_probe=2, eval_every=0, max_group_size=6)
    run_dir = tmp_path / "run"
    compiled = MMGRPO(even_length, **{**config, "steps": 1}).compile(Single(SIG), trainset=TRAIN, engine=engine,
                                                                      run_dir=run_dir, progress=False)
    log = records(run_dir)
    kinds = [r["kind"] for r in log]
    assert kinds.index("remedies") < kinds.index("warm_start") < kinds.index("step") and "probe" not in kinds
    [rec] = [r for r in log if r["kind"] == "remedies"]
    [ws] = [r for r in log if r["kind"] == "warm_start"]
    assert rec["chose"] == {"adaptive_rollouts": True, "warm_start": True} and rec["reasons"] == ["forced"]
    # the warm start trained on the probe's own runs: it sampled none of its own
    assert ws["trained"] and ws["runs"] == 2 * len(TRAIN) and ws["completion_tokens"] == 0
    [step] = [r for r in log if r["kind"] == "step"]
    assert step["drawing"]["group_sizes"] is not None  # adaptive groups from the probed rates
    assert step["drawing"]["completion_tokens_total"] == rec["completion_tokens"] + step["drawing"]["completion_tokens"]
    assert [r["kind"] for r in compiled.manifest.history][:2] == ["remedies", "warm_start"]

    def refuse(self, repeats, indices):
        raise AssertionError("a resumed compile probed again")

    monkeypatch.setattr(CompileRun, "probe_and_harvest", refuse)
    again = HFEngine(load_model("tiny"), batch_wait_s=0.02)  # a new process's engine: the adapters come back
    try:
        MMGRPO(even_length, **{**config, "steps": 2}).compile(Single(SIG), trainset=TRAIN, engine=again,
                                                              run_dir=run_dir, resume=run_dir, progress=False)
    finally:
        again.close()
    steps = [r for r in records(run_dir) if r["kind"] == "step"]
    assert [s["step"] for s in steps] == [1, 2] and steps[1]["drawing"]["group_sizes"] is not None
