"""Signal per step on the tiny real model: dynamic sampling, the pass band, the curriculum, per-role advantage
normalisation, verified credit, bootstrapped demos (BetterTogether), and the remedies where the base is weak
(starvation said plainly, adaptive rollouts, a curriculum by measured pass rate), each visible in the log and the
artifact."""

import json

import dspy
import pytest

import wfc
from compilers import MMGRPO
from compilers.prompts import bootstrap_demos
from compilers.sampling import adaptive_group_sizes, difficulty_from_rates, easiest_first
from programs import Voting
from tiny_setup import SIG, TRAIN, length_metric, tiny_config
from wfc.engines.hf import HFEngine
from wfc.models import load_model


def steps_of(compiled):
    return [r for r in compiled.manifest.history if r["kind"] == "step"]


def test_dynamic_sampling_keeps_only_examples_with_signal(engine, tmp_path):
    compiled = MMGRPO(length_metric, **tiny_config(
        steps=2, dynamic_sampling=True, max_draw_rounds=3, pass_band=(0.0, 1.0), role_advantage_norm=True,
        credit="verified")).compile(Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine,
                                    run_dir=tmp_path / "run", progress=False)
    for record in steps_of(compiled):
        d = record["drawing"]
        assert d["examples_kept"] + d["examples_flat"] == d["examples_drawn"]
        assert 1 <= d["draw_rounds"] <= 3
        assert record["rollouts"] == d["examples_kept"] * 3  # only kept examples reach the update
        assert d["sampler"]["seen"] >= d["examples_drawn"] or d["sampler"]["seen"] >= 1
        assert set(record["role_advantage_scales"]) <= {"voter", "aggregator"}
    kept = [r["drawing"]["examples_kept"] for r in steps_of(compiled)]
    assert sum(kept) >= 1


def always(example, prediction, trace=None):
    return 1.0  # every group flat: no signal anywhere


def test_without_dynamic_sampling_flat_examples_are_kept(engine, tmp_path):
    compiled = MMGRPO(always, **tiny_config(steps=1, dynamic_sampling=False)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "a", progress=False)
    d = steps_of(compiled)[0]["drawing"]
    assert d["examples_kept"] == 2 and d["draw_rounds"] == 1


def test_dynamic_sampling_drops_flat_examples_within_its_budget(engine, tmp_path):
    compiled = MMGRPO(always, **tiny_config(steps=1, dynamic_sampling=True, max_draw_rounds=2)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "b", progress=False)
    d = steps_of(compiled)[0]["drawing"]
    assert d["examples_kept"] == 0 and d["examples_flat"] == d["examples_drawn"] and d["draw_rounds"] == 2
    assert d["examples_drawn"] > 2  # replacements were drawn for the flat ones


def test_bootstrap_demos_come_from_passing_runs_per_role(engine):
    program = Voting(SIG, n=2)
    demos = bootstrap_demos(program, TRAIN, engine, metric=length_metric, k=2, n_examples=8, repeats=2,
                            max_tokens=6, seed=0)
    assert set(demos) == {"voter", "aggregator"}
    for role, items in demos.items():
        assert len(items) <= 2
        for d in items:
            assert "question" in d and "answer" in d
            assert length_metric(d, dspy.Prediction(answer=d.answer)) == 1.0  # passing runs only
        assert len({d.question for d in items}) == len(items)  # different problems
    assert all("candidates" in d for d in demos["aggregator"])
    greedy = [bootstrap_demos(program, TRAIN, engine, metric=length_metric, k=2, n_examples=8, repeats=1,
                              max_tokens=6, seed=0) for _ in range(2)]
    assert [[dict(d) for d in g["voter"]] for g in greedy][0] == [[dict(d) for d in g["voter"]] for g in greedy][1]


def test_prompt_then_weights_saves_demos_in_the_artifact(engine, tmp_path):
    # every training question, greedy + 2 sampled runs each: 36 runs per role, about a quarter of which pass
    compiled = MMGRPO(length_metric, **tiny_config(steps=1, strategy="p -> w", demos_per_role=1,
                                                   bootstrap_examples=len(TRAIN), bootstrap_repeats=3)).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine, run_dir=tmp_path / "run", progress=False)
    demos = {role: len(p.demos) for role, p in compiled.program.named_predictors()}
    assert sum(demos.values()) >= 1, "length_metric passes some runs of the tiny model: demos are found"
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["counts"] for r in logged if r["kind"] == "demos"] == [demos]
    path = compiled.save(tmp_path / "art")
    loaded = wfc.load(path, model="tiny")
    try:
        assert {role: len(p.demos) for role, p in loaded.program.named_predictors()} == demos
        q = "What is 2 plus 2?"
        assert loaded(question=q).answer == compiled(question=q).answer
    finally:
        loaded.engine.close()


def test_prompt_only_strategy_trains_nothing(engine, tmp_path):
    compiled = MMGRPO(length_metric, **tiny_config(steps=3, strategy="p", demos_per_role=1,
                                                   bootstrap_examples=6)).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine, run_dir=tmp_path / "run", progress=False)
    assert steps_of(compiled) == []
    assert all(v.abs().sum() == 0 for k, v in engine.policy.model.named_parameters() if "lora_B" in k)


def test_rollout_token_budget_stops_training(engine, tmp_path):
    compiled = MMGRPO(length_metric, **tiny_config(steps=50, max_rollout_tokens=1, keep="last")).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine, run_dir=tmp_path / "run", progress=False)
    steps = steps_of(compiled)
    assert len(steps) == 1 and steps[0]["drawing"]["completion_tokens_total"] >= 1
    assert compiled.manifest.revision_step == 1 and 1 in compiled.revisions


def test_curriculum_key_opens_the_pool_easiest_first(engine, tmp_path):
    # the second half of TRAIN is marked hard: at step 0 only the easy half (6 of 12) is open, all of it by step 2
    train = [ex.copy(difficulty=int(i >= 6)).with_inputs("question") for i, ex in enumerate(TRAIN)]
    compiled = MMGRPO(length_metric, **tiny_config(
        steps=3, curriculum_key="difficulty", curriculum_steps=2, curriculum_start=0.5)).compile(
        Voting(SIG, n=2), trainset=train, engine=engine, run_dir=tmp_path / "c", progress=False)
    opened = [r["drawing"]["sampler"]["open"] for r in steps_of(compiled)]
    assert opened == sorted(opened) and opened[0] < 12 and opened[-1] == 12, opened


def test_curriculum_key_missing_from_an_example_is_refused(engine, tmp_path):
    with pytest.raises(ValueError, match="curriculum_key='difficulty'"):
        MMGRPO(length_metric, **tiny_config(steps=1, curriculum_key="difficulty", curriculum_steps=2)).compile(
            Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "d", progress=False)


def test_overlong_penalty_on_tiny_rollouts_charges_exactly_the_cut_calls(engine, tmp_path):
    from compilers.group import build_groups
    from compilers.score import score_rollout
    from wfc.engines.base import SamplingParams
    from wfc.lower import run_rollouts

    # 3 new tokens: the random model rarely stops that soon, so most calls are cut; some may end on EOS
    rollouts = run_rollouts(Voting(SIG, n=2), TRAIN[:2], engine, repeats=3,
                            sampling=SamplingParams(temperature=1.0, max_tokens=3))
    for graphs in rollouts:
        for g in graphs:
            score_rollout(length_metric, g, failure_score=0.0, metric_failure_score=0.0)
    plain = build_groups(rollouts)
    charged = build_groups(rollouts, overlong_penalty=0.25)
    cut = 0
    for p, c in zip(plain, charged):
        for mp, mc in zip(p.members, c.members):
            expected = 0.25 if mp.call.finish_reason == "length" and mp.call.status == "ok" else 0.0
            cut += expected > 0
            assert mp.reward - mc.reward == pytest.approx(expected)
    assert cut > 0, "3-token budget: the tiny model's calls are cut"
    compiled = MMGRPO(length_metric, **tiny_config(steps=1, max_tokens=3, overlong_penalty=0.25)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    stats = steps_of(compiled)[0]["roles"]["voter"]
    assert 0.0 < stats["truncated_rate"] <= 1.0


# ----- signal where the base model is weak: starvation said plainly, adaptive rollouts, a measured curriculum -----

def test_a_starved_step_says_so_in_the_log_and_on_the_progress_bar(engine, tmp_path, capsys):
    compiled = MMGRPO(always, **tiny_config(steps=2)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "s", progress=True)
    for record in steps_of(compiled):
        assert record["starvation"] == {"flat": 2, "drawn": 2, "flat_fraction": 1.0, "starved": True,
                                        "pass_rate": 1.0, "step_pass_rate": 1.0, "remedies": []}
    out = capsys.readouterr().out
    # said once per starved stretch (steps 1 and 2 are one), with what to try
    assert out.count("starved of signal") == 1 and "step 1 starved of signal: 2 of 2 drawn examples" in out
    assert "remedies in force: none (try adaptive_rollouts" in out


def probe_of(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "probe"]


def test_adaptive_rollouts_size_each_group_by_its_pass_rate(engine, tmp_path):
    run_dir = tmp_path / "a"
    compiled = MMGRPO(length_metric, **tiny_config(
        steps=2, group_size=3, max_group_size=6, adaptive_rollouts=True, adaptive_budget=2.0,
        pass_rate_probe=2)).compile(Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=run_dir, progress=False)
    [probe] = probe_of(run_dir)
    steps = steps_of(compiled)
    for record in steps:
        d = record["drawing"]
        assert len(d["group_sizes"]) == len(d["indices"]) == d["examples_drawn"] == 2
        assert all(2 <= n <= 6 for n in d["group_sizes"]) and sum(d["group_sizes"]) <= 2 * 3 * 2
        assert record["rollouts"] == d["rollouts_drawn"] == sum(d["group_sizes"])  # every rollout reaches the update
        assert record["starvation"]["remedies"] == ["pass_rate_probe", "adaptive_rollouts"]
    d = steps[0]["drawing"]  # step 1 sizes come from the probe's rates
    assert d["group_sizes"] == adaptive_group_sizes([probe["rates"][i] for i in d["indices"]], base=3, max_size=6,
                                                    budget=12, target=0.8)
    assert all(v.abs().sum() > 0 for k, v in engine.policy.model.named_parameters() if "lora_B" in k)


def test_curriculum_ordered_by_the_measured_pass_rate_survives_a_resume(engine, tmp_path):
    run_dir = tmp_path / "c"
    config = tiny_config(steps=1, pass_rate_probe=2, curriculum_steps=2, curriculum_start=0.5, eval_every=0)
    compiled = MMGRPO(length_metric, **config).compile(Voting(SIG, n=2), trainset=TRAIN, engine=engine,
                                                       run_dir=run_dir, progress=False)
    [probe] = probe_of(run_dir)
    assert probe["orders_curriculum"] and probe["runs_per_example"] == 2 and len(probe["rates"]) == 12
    assert probe["pass_at_k"] == sum(r > 0 for r in probe["rates"]) / 12 and probe["completion_tokens"] > 0
    order = easiest_first(difficulty_from_rates(probe["rates"]))
    saved = json.loads((run_dir / "checkpoint" / "checkpoint.json").read_text())["sampler"]
    assert saved["order"] == order
    first = steps_of(compiled)[0]["drawing"]
    assert set(first["indices"]) <= set(order[:6])  # the most often passed half is open at step 1
    # the probe's tokens count in the budget
    assert first["completion_tokens_total"] == probe["completion_tokens"] + first["completion_tokens"]
    again = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    try:
        resumed = MMGRPO(length_metric, **{**config, "steps": 2}).compile(
            Voting(SIG, n=2), trainset=TRAIN, engine=again, run_dir=run_dir, progress=False, resume=run_dir)
    finally:
        again.close()
    assert len(probe_of(run_dir)) == 1  # not measured again: the order came back with the sampler
    second = steps_of(resumed)[-1]["drawing"]
    assert set(second["indices"]) <= set(order[:9])  # three quarters at step 2
