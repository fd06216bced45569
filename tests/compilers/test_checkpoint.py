"""compilers.checkpoint: the checkpoint a compile writes, an exact save/restore round trip, and every refusal
(changed config, base model, data, metric; corrupted, truncated or missing files; an edited log)."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil

import pytest
import torch

from compilers import MMGRPO, MMGRPOConfig
from compilers import checkpoint as ckpt
from compilers.sampling import PromptSampler
from compilers.update import AdapterOptimizers
from programs import Single
from tiny_setup import SIG, TRAIN, length_metric, tiny_config
from wfc.artifact import adapter_state


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A two-step compile's run directory and the engine it ran on."""
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    run = tmp_path_factory.mktemp("ckpt") / "run"
    MMGRPO(length_metric, **tiny_config(steps=2)).compile(Single(SIG), trainset=TRAIN, valset=TRAIN[:3],
                                                            engine=engine, run_dir=run, progress=False)
    yield run, engine
    engine.close()


@pytest.fixture
def run_copy(trained, tmp_path):
    run, _ = trained
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _resume(engine, run, *, metric=length_metric, trainset=TRAIN, **config):
    return MMGRPO(metric, **tiny_config(steps=2, **config)).compile(
        Single(SIG), trainset=trainset, valset=TRAIN[:3], engine=engine, progress=False, resume=run)


def test_compile_writes_a_complete_checkpoint(trained):
    run, engine = trained
    ck = ckpt.load(run)
    assert ck.path == run / "checkpoint" and ck.step == 2
    assert sorted(ck.data["files"]) == ["adapters/shared.safetensors", "optimizer.pt", "revisions/0/shared.safetensors",
                                        "revisions/1/shared.safetensors", "revisions/2/shared.safetensors", "rng.pt"]
    loop = ck.loop_state()
    assert sorted(loop.revisions) == [0, 1, 2] and [s for s, _ in loop.evals] == [0, 1, 2]
    assert loop.current == 2 and loop.spent > 0 and loop.val == loop.evals[-1][1]
    assert ck.data["fingerprint"]["base_checksum"] == engine.handle.checksum
    assert ck.data["fingerprint"]["roles"] == {"solver": "shared"} and "steps" not in ck.data["fingerprint"]["config"]
    assert ck.data["log"]["records"] == len((run / "metrics.jsonl").read_text().splitlines())
    assert not list(run.glob(".checkpoint*")), "no temporary or old checkpoint directory is left behind"


def test_save_restore_round_trip_is_exact(trained, tmp_path):
    """Adapters, AdamW moments / step counts / learning rate after a cliff cut, sampler, program state, every RNG."""
    _, engine = trained
    model = engine.policy.model
    opt = AdapterOptimizers(model, ["shared"], lr=1e-3)
    for p in opt.optimizers["shared"].param_groups[0]["params"]:
        p.grad = torch.randn_like(p)
    saved_weights = adapter_state(model, "shared")
    opt.optimizers["shared"].step()
    opt.scale_lr("shared", 0.5)  # a cliff cut
    sampler = PromptSampler(len(TRAIN), seed=3, band=(0.0, 1.0))
    sampler.draw(4)
    sampler.observe(1, 0.5)
    sampler.advance()
    student = Single(SIG)
    student.solver.demos = [TRAIN[0]]
    loop = ckpt.LoopState(step=5, history=[{"kind": "step", "step": 5}], evals=[(0, 0.25), (5, 0.5)],
                          revisions={0: {"shared": saved_weights}}, best_step=5, best_val=0.5, val=0.5,
                          last_rollback=5, current=0, spent=123)
    torch.manual_seed(11)
    random.seed(12)
    expected = {"torch": torch.get_rng_state(), "python": random.getstate(), "weights": adapter_state(model, "shared"),
                "optimizer": opt.optimizers["shared"].state_dict(), "sampler": sampler.state_dict(),
                "program": student.dump_state()}
    fp = {"config": {}, "base_model": "tiny", "base_checksum": "x", "roles": {}, "trainset": "", "valset": "",
          "metric": "m", "program": "p"}
    ckpt.save(tmp_path, loop=loop, policy=engine.policy, adapters=["shared"], optimizers=opt, sampler=sampler, student=student,
              fingerprint=fp, plan={"spec": "shared", "role_adapters": {}, "reasons": []},
              revision_files=ckpt.RevisionFiles())
    # scramble everything, then restore
    torch.rand(100)
    random.random()
    fresh = AdapterOptimizers(model, ["shared"], lr=1e-3)
    other_sampler = PromptSampler(len(TRAIN), seed=3, band=(0.0, 1.0))
    other_student = Single(SIG)
    from wfc.artifact import restore_adapter

    restore_adapter(model, "shared", {k: torch.zeros_like(v) for k, v in saved_weights.items()})
    got = ckpt.restore(ckpt.load(tmp_path), policy=engine.policy, engine=engine, adapters=["shared"], optimizers=fresh,
                       sampler=other_sampler, student=other_student)
    assert torch.equal(torch.get_rng_state(), expected["torch"]) and random.getstate() == expected["python"]
    assert all(torch.equal(v, expected["weights"][k]) for k, v in adapter_state(model, "shared").items())
    state = fresh.optimizers["shared"].state_dict()
    assert state["param_groups"] == expected["optimizer"]["param_groups"] and fresh.lr("shared") == 5e-4
    for k, moments in expected["optimizer"]["state"].items():
        assert all(torch.equal(state["state"][k][n], moments[n]) for n in ("step", "exp_avg", "exp_avg_sq"))
    assert other_sampler.state_dict() == expected["sampler"]
    assert other_student.dump_state() == json.loads(json.dumps(expected["program"], default=str))
    assert dataclasses.replace(got, revisions={}) == dataclasses.replace(loop, revisions={})
    assert all(torch.equal(v, saved_weights[k]) for k, v in got.revisions[0]["shared"].items())


def test_changed_config_is_refused_naming_it(trained, run_copy):
    _, engine = trained
    with pytest.raises(ckpt.CheckpointError, match=r"learning_rate: 0\.005 -> 0\.01.*lora\.r: 4 -> 8.*only steps"):
        _resume(engine, run_copy, learning_rate=0.01, lora={"r": 8, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    with pytest.raises(ValueError, match="after step 2: resume with steps >= 2"):
        MMGRPO(length_metric, **tiny_config(steps=1)).compile(Single(SIG), trainset=TRAIN, valset=TRAIN[:3],
                                                               engine=engine, progress=False, resume=run_copy)


def test_different_base_model_data_or_metric_is_refused(trained, run_copy):
    from wfc.engines.hf import HFEngine

    _, engine = trained
    other = HFEngine(dataclasses.replace(engine.handle, name="other", checksum="0" * 64))
    try:
        with pytest.raises(ckpt.CheckpointError, match=r"base model 'tiny' \(checksum .*\) -> 'other' \(checksum 0+"):
            _resume(other, run_copy)
    finally:
        other.close()
    with pytest.raises(ckpt.CheckpointError, match="trainset"):
        _resume(engine, run_copy, trainset=TRAIN[:-1])

    def accuracy(example, prediction, trace=None):
        return 1.0

    with pytest.raises(ckpt.CheckpointError, match="metric 'length_metric' -> 'accuracy'"):
        _resume(engine, run_copy, metric=accuracy)


@pytest.mark.parametrize("damage, message", [
    ("truncate adapters", "adapters/shared.safetensors does not match its sha256"),
    ("truncate revision", "revisions/1/shared.safetensors does not match its sha256"),
    ("delete optimizer", "optimizer.pt is missing"),
    ("truncate json", "checkpoint.json is unreadable"),
    ("edit json", "does not match its digest"),
    ("delete checkpoint", "holds no checkpoint"),
])
def test_corrupted_checkpoint_is_detected(trained, run_copy, damage, message):
    cdir = run_copy / "checkpoint"
    if damage == "truncate adapters":
        data = (cdir / "adapters" / "shared.safetensors").read_bytes()
        (cdir / "adapters" / "shared.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "truncate revision":
        data = (run_copy / "revisions" / "1" / "shared.safetensors").read_bytes()
        (run_copy / "revisions" / "1" / "shared.safetensors").write_bytes(data[:-8])
    elif damage == "delete optimizer":
        (cdir / "optimizer.pt").unlink()
    elif damage == "truncate json":
        text = (cdir / "checkpoint.json").read_text()
        (cdir / "checkpoint.json").write_text(text[: len(text) // 2])
    elif damage == "edit json":
        data = json.loads((cdir / "checkpoint.json").read_text())
        data["loop"]["best_val"] = -12.5  # no accuracy: a value the run cannot have written
        (cdir / "checkpoint.json").write_text(json.dumps(data))
    else:
        shutil.rmtree(cdir)
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load(run_copy)
    if damage == "truncate adapters":  # and compile reports it before touching the model
        _, engine = trained
        with pytest.raises(ckpt.CheckpointError, match="start a fresh compile"):
            _resume(engine, run_copy)


def test_a_checkpoint_is_replaced_whole(trained, run_copy, monkeypatch):
    """A write that fails midway leaves the previous checkpoint; a kill between the two renames of a replacement
    leaves it as .checkpoint.old-<pid>, which load falls back to."""
    _, engine = trained
    ck = ckpt.load(run_copy)
    before = {p.name: p.read_bytes() for p in (run_copy / "checkpoint").iterdir() if p.is_file()}

    def failing_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(run_copy, loop=ck.loop_state(), policy=engine.policy, adapters=["shared"],
                  optimizers=AdapterOptimizers(engine.policy.model, ["shared"], lr=1e-3), sampler=PromptSampler(3),
                  student=Single(SIG), fingerprint=ck.data["fingerprint"], plan=ck.plan,
                  revision_files=ck.revision_files())
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (run_copy / "checkpoint").iterdir() if p.is_file()} == before
    assert not list(run_copy.glob(".checkpoint*"))
    (run_copy / "checkpoint").rename(run_copy / ".checkpoint.old-4242")
    assert ckpt.load(run_copy).path == run_copy / ".checkpoint.old-4242"


def test_resume_cuts_the_log_back_and_refuses_an_edited_one(trained, run_copy):
    ck = ckpt.load(run_copy)
    log = run_copy / "metrics.jsonl"
    original = log.read_text()
    log.write_text(original + json.dumps({"kind": "step", "step": 3}) + "\n")
    records = ckpt.restore_log(ck)
    assert log.read_text() == original and len(records) == ck.data["log"]["records"]
    log.write_text(original.replace('"kind": "eval"', '"kind": "evil"', 1))
    with pytest.raises(ckpt.CheckpointError, match="does not start with the"):
        ckpt.restore_log(ck)


def test_resume_argument_errors(trained, tmp_path):
    _, engine = trained
    with pytest.raises(ValueError, match="resume=True resumes run_dir, but no run_dir"):
        MMGRPO(length_metric, **tiny_config()).compile(Single(SIG), trainset=TRAIN, engine=engine, resume=True)
    with pytest.raises(ValueError, match="differ"):
        MMGRPO(length_metric, **tiny_config()).compile(Single(SIG), trainset=TRAIN, engine=engine,
                                                       resume=tmp_path / "a", run_dir=tmp_path / "b")


def test_check_fingerprint_lists_every_difference(tmp_path):
    def fp(**kw):
        return ckpt.fingerprint(MMGRPOConfig(**kw), base_model="tiny", base_checksum="abc", role_adapters={"r": "a"},
                                trainset=TRAIN, valset=[], metric=length_metric, program=Single(SIG))

    ckpt.check_fingerprint(fp(steps=3), fp(steps=30), where=tmp_path)  # steps may change
    with pytest.raises(ckpt.CheckpointError, match=r"seed: 0 -> 1, temperature: 1\.0 -> 0\.5"):
        ckpt.check_fingerprint(fp(), fp(seed=1, temperature=0.5), where=tmp_path)


def test_resume_keeps_the_bootstrapped_demos(tmp_path):
    """strategy 'p -> w': the demos are program state; a resume restores them instead of bootstrapping again."""
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    def full_marks(example, prediction, trace=None):
        return 1.0

    cfg = tiny_config(strategy="p -> w", demos_per_role=1, bootstrap_examples=3, bootstrap_repeats=1)
    run = tmp_path / "run"
    engines = [HFEngine(load_model("tiny"), batch_wait_s=0.02) for _ in range(2)]
    try:
        first = MMGRPO(full_marks, **{**cfg, "steps": 1}).compile(Single(SIG), trainset=TRAIN, valset=TRAIN[:2],
                                                                  engine=engines[0], run_dir=run, progress=False)
        demos = first.program.solver.demos
        assert demos, "the tiny model gave no parseable call to bootstrap from"
        second = MMGRPO(full_marks, **cfg).compile(Single(SIG), trainset=TRAIN, valset=TRAIN[:2], engine=engines[1],
                                                   progress=False, resume=run)
    finally:
        for engine in engines:
            engine.close()
    assert [dict(d) for d in second.program.solver.demos] == [dict(d) for d in demos]
    kinds = [json.loads(line)["kind"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("demos") == 1 and kinds.count("plan") == 1 and kinds.count("resume") == 1
    assert [r["step"] for r in second.manifest.history if r["kind"] == "step"] == [1, 2]
