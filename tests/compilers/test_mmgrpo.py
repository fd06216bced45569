"""mmGRPO on the tiny real model: real adapter updates, base untouched, artifact round trip, bad input."""

import json
import shutil

import dspy
import pytest
import torch
from pydantic import ValidationError

import wfc
from compilers import MMGRPO, MMGRPOConfig
from compilers.score import MetricError
from programs import Voting
from wfc.artifact import ArtifactError
from tiny_setup import SIG, TRAIN, length_metric, tiny_config


def small(**kw):
    return tiny_config(**kw)


def test_compile_trains_adapter_and_leaves_base_and_program_untouched(engine, tmp_path):
    base = {k: v.clone() for k, v in engine.policy.model.state_dict().items()}
    program = Voting(SIG, n=2)
    before = json.dumps(program.dump_state(), sort_keys=True, default=str)
    compiled = MMGRPO(length_metric, **small()).compile(program, trainset=TRAIN, valset=TRAIN[:3], engine=engine,
                                                        run_dir=tmp_path / "run", progress=False)
    trained = {k: v for k, v in engine.policy.model.named_parameters() if "lora_B" in k}
    assert trained and any(v.abs().sum() > 0 for v in trained.values()), "LoRA B starts at 0: training must move it"
    for name, p in engine.policy.model.get_base_model().named_parameters():
        if "lora_" in name:
            continue
        key = name.replace(".base_layer", "")
        assert torch.equal(p.detach(), base[key]), f"base weight {key} changed"
    assert json.dumps(program.dump_state(), sort_keys=True, default=str) == before
    assert all(getattr(p, "lm", None) is None for _, p in program.named_predictors())
    steps = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert len(steps) == 2 and all("voter" in r["roles"] for r in steps)
    assert (tmp_path / "run" / "metrics.jsonl").exists() and (tmp_path / "run" / "curves.png").exists()
    assert set(compiled.revisions) == {0, 1, 2}


def test_save_load_gives_identical_greedy_outputs(engine, tmp_path):
    compiled = MMGRPO(length_metric, **small(steps=1)).compile(
        Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:2], engine=engine, run_dir=tmp_path / "run", progress=False)
    path = compiled.save(tmp_path / "art")
    assert (path / "adapters" / "shared" / "adapter_model.safetensors").exists()
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["roles"] == {"voter": "shared", "aggregator": "shared"}
    questions = ["What is 2 plus 2?", "What is 3 plus 1?"]
    expected = [compiled(question=q).answer for q in questions]
    loaded = wfc.load(path, model="tiny")
    try:
        assert [loaded(question=q).answer for q in questions] == expected
        a = loaded.engine.policy.model.state_dict()
        b = engine.policy.model.state_dict()
        for k in a:
            if "lora_" in k and ".shared." in k:
                assert torch.equal(a[k], b[k])
    finally:
        loaded.engine.close()


def test_artifact_bad_loads(engine, tmp_path):
    compiled = MMGRPO(length_metric, **small(steps=1, eval_every=0)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    path = compiled.save(tmp_path / "art")
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["base_model_checksum"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="trained on base"):
        wfc.load(bad, engine=engine)
    m["format_version"] = 99
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="upgrade wfc"):
        wfc.load(bad, engine=engine)
    missing = tmp_path / "missing"
    shutil.copytree(path, missing)
    shutil.rmtree(missing / "adapters" / "shared")
    with pytest.raises(ArtifactError, match="missing"):
        wfc.load(missing, engine=engine)
    with pytest.raises(ArtifactError, match="not a wfc artifact"):
        wfc.load(tmp_path)


def test_config_validation_names_the_field():
    with pytest.raises(ValidationError, match="group_size"):
        MMGRPOConfig(group_size=1)
    with pytest.raises(ValidationError, match="format_failure_score"):
        MMGRPOConfig(failure_score=0.0, format_failure_score=0.5)
    with pytest.raises(ValidationError, match="advantage"):
        MMGRPOConfig(advantage="ppo")
    with pytest.raises(ValidationError, match="stepz"):
        MMGRPOConfig(stepz=3)


def test_metric_failures(engine, tmp_path):
    def broken(example, prediction, trace=None):
        raise RuntimeError("boom")

    with pytest.raises(MetricError, match="What is"):
        MMGRPO(broken, **small(steps=1, eval_every=0)).compile(
            Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "a", progress=False)


def test_metric_failure_score_opt_in(engine, tmp_path):
    def nan_metric(example, prediction, trace=None):
        return float("nan")

    compiled = MMGRPO(nan_metric, **small(steps=1, eval_every=0, metric_failure_score=0.0)).compile(
        Voting(SIG, n=2), trainset=TRAIN, engine=engine, run_dir=tmp_path / "b", progress=False)
    assert compiled.manifest.history[-1]["kind"] == "step"


def test_bad_compile_inputs(engine):
    with pytest.raises(ValueError, match="trainset is empty"):
        MMGRPO(length_metric).compile(Voting(SIG), trainset=[], engine=engine)
    with pytest.raises(TypeError, match="dspy.Example"):
        MMGRPO(length_metric).compile(Voting(SIG), trainset=[{"question": "q"}], engine=engine)
    with pytest.raises(ValueError, match="no predictors"):
        MMGRPO(length_metric).compile(dspy.Module(), trainset=TRAIN, engine=engine)
    with pytest.raises(TypeError, match="metric must be callable"):
        MMGRPO("accuracy")


def test_sampled_voters_train_at_the_run_temperature_and_sample_when_served(engine, tmp_path):
    """Voting(sample_voters=0.5) on the tiny model: training rollouts (T=1) keep T=1 on every call, so the engine's
    log-probs equal the trainer's (applying 0.5 there too put them up to 0.4 apart); the loaded artifact's greedy run
    samples its voters at 0.5, with the sampled tokens' log-probs."""
    compiled = MMGRPO(length_metric, **small(steps=1)).compile(
        Voting(SIG, n=3, skip_unanimous=True, sample_voters=0.5), trainset=TRAIN, valset=TRAIN[:2], engine=engine,
        run_dir=tmp_path / "run", progress=False)
    (step,) = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert step["logprob_mismatch"]["tokens"] > 0 and step["logprob_mismatch"]["max_abs"] < 1e-3
    loaded = wfc.load(compiled.save(tmp_path / "art"), model="tiny")
    try:
        assert loaded.program.sample_voters == 0.5
        graph = wfc.lower.trace(loaded.program, {"question": "What is 2 plus 2?"}, loaded.engine,
                                adapters=loaded.roles, sampling=loaded.sampling())
        voters = graph.calls_of("voter")
        assert len(voters) == 3 and all(c.temperature == 0.5 and c.logprobs_known for c in voters)
        assert all(c.temperature == 0.0 for c in graph.calls_of("aggregator"))
    finally:
        loaded.engine.close()


def test_pooled_unanimous_voting_trains_and_the_artifact_keeps_the_option(engine, tmp_path):
    """Voting(skip_unanimous=True) compiled with pool_fanout on the tiny model: the voters train in one group per
    example (group_size x n members), sampled rollouts where the voters disagree call the aggregator, greedy runs
    (unanimous voters) do not, and the loaded artifact still skips."""
    compiled = MMGRPO(length_metric, **small(steps=1, pool_fanout=True, group_size=3)).compile(
        Voting(SIG, n=3, skip_unanimous=True), trainset=TRAIN, valset=TRAIN[:2], engine=engine,
        run_dir=tmp_path / "run", progress=False)
    (step,) = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert step["roles"]["voter"]["calls"] == 2 * 3 * 3  # examples x rollouts x voters
    assert step["groups"] <= 2 + 2  # per example one pooled voter group (unpooled: 3) and at most one aggregator group
    trained = {k: v for k, v in engine.policy.model.named_parameters() if "lora_B" in k and ".shared." in k}
    assert any(v.abs().sum() > 0 for v in trained.values())
    loaded = wfc.load(compiled.save(tmp_path / "art"), model="tiny")
    try:
        assert loaded.program.skip_unanimous is True
        graph = wfc.lower.trace(loaded.program, {"question": "What is 2 plus 2?"}, loaded.engine,
                                adapters=loaded.roles)
        assert graph.roles == ["voter"] and len(graph.calls_of("voter")) == 3  # greedy voters agree: no aggregator
    finally:
        loaded.engine.close()


def test_a_seeded_compile_draws_the_same_rollouts_batched_or_one_by_one(tmp_path):
    """Every training call samples with its own seed, so how the rollouts fall into generate calls (all in flight
    together, or one request per call) does not change what is drawn, nor what is trained. Before per-call seeds
    the two draws came from torch's global generator in different orders."""
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    def run(workers, name):
        engine = HFEngine(load_model("tiny"), batch_wait_s=0.02)
        try:
            MMGRPO(length_metric, **small(temperature=1.0, rollout_workers=workers, seed=4)).compile(
                Voting(SIG, n=2), trainset=TRAIN, valset=TRAIN[:3], engine=engine, run_dir=tmp_path / name,
                progress=False)
            adapters = {a: engine.policy.adapter_state(a) for a in engine.adapters}
        finally:
            engine.close()
        steps = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        drawn = [(r["reward_mean"], r["drawing"]["completion_tokens"]) for r in steps if r["kind"] == "step"]
        return [x for pair in drawn for x in pair], adapters, engine

    batched, a, engine = run(256, "batched")
    alone, b, _ = run(1, "alone")
    assert max(engine.stats["batch_sizes"]) > 1  # the batched run did batch
    assert batched == pytest.approx(alone, abs=1e-6)
    # the weights agree to 2% of one Adam step (lr 5e-3): the rollout log-probs behind the importance ratio
    # differ by float rounding between batch layouts, and Adam magnifies that on near-zero gradient entries
    diff = max((a[n][k] - b[n][k]).abs().max().item() for n in a for k in a[n])
    assert diff < 1e-4, diff  # measured 2.3e-5; different draws move weights by whole steps


def test_evalopt_checked_by_its_prompts_example_trains_the_fixer_on_the_feedback_and_loads_back(engine, tmp_path):
    """EvalOpt(check=example_check) on code: the tiny model's code never passes the prompt's example, so every
    rollout calls the optimizer, whose prompt holds what running the example found; it trains like any role, and
    the artifact records the check by name, so the loaded program checks (and answers) as the compiled one."""
    from programs import EvalOpt
    from wfc.tasks.codegen import make_codegen
    from wfc.tasks.visible import example_check

    code_sig = dspy.Signature("prompt -> code", "Write the Python function.")
    tasks = make_codegen(4, seed=1)

    def code_length(example, prediction, trace=None):  # spread across samples, as length_metric
        return (len(str(prediction.code)) % 4) / 3.0

    program = EvalOpt(code_sig, rounds=1, check=example_check)
    compiled = MMGRPO(code_length, **small(steps=1, eval_every=0, temperature=1.0, max_tokens=8)).compile(
        program, trainset=tasks, engine=engine, run_dir=tmp_path / "run", progress=False)
    (step,) = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert set(step["roles"]) == {"generator", "optimizer"}
    assert step["roles"]["optimizer"]["calls"] == step["roles"]["generator"]["calls"] > 0
    assert step["logprob_mismatch"]["tokens"] > 0 and step["logprob_mismatch"]["max_abs"] < 1e-3
    graph = compiled.trace(tasks[0])
    (fix,) = graph.calls_of("optimizer")
    ok, feedback = example_check(tasks[0], graph.calls_of("generator")[0].outputs)
    assert not ok and feedback in fix.messages[-1]["content"]
    loaded = wfc.load(compiled.save(tmp_path / "art"), model="tiny")
    try:
        assert loaded.program.check is example_check
        for task in tasks[:2]:
            assert loaded(prompt=task.prompt).code == compiled(prompt=task.prompt).code
    finally:
        loaded.engine.close()


def test_a_chosen_verdict_role_trains_on_the_choices_it_drew_and_loads_back_as_one(engine, tmp_path):
    """EvalOpt(choose_verdict=True): the evaluator's calls are choice requests; they are trained like any call (the
    trainer's log-probs of the chosen tokens equal the engine's: no mismatch) and the loaded artifact's evaluator is
    still decoded as a choice, answering as the compiled program does."""
    from programs import EvalOpt
    from wfc.adapter import CompactChatAdapter

    program = EvalOpt(SIG, rounds=1, choose_verdict=True)
    compiled = MMGRPO(length_metric, **small(steps=1, eval_every=0, temperature=1.0)).compile(
        program, trainset=TRAIN, engine=engine, run_dir=tmp_path / "run", progress=False)
    (step,) = [r for r in compiled.manifest.history if r["kind"] == "step"]
    assert step["roles"]["evaluator"]["calls"] > 0
    assert step["logprob_mismatch"]["tokens"] > 0 and step["logprob_mismatch"]["max_abs"] < 1e-3
    path = compiled.save(tmp_path / "art")
    loaded = wfc.load(path, model="tiny")
    try:
        judge = dict(loaded.program.named_predictors())["evaluator"]
        assert CompactChatAdapter.choices(judge.signature) == ("correct", "incorrect")
        for q in ("What is 2 plus 2?", "What is 3 plus 1?"):
            assert loaded(question=q).answer == compiled(question=q).answer
    finally:
        loaded.engine.close()
