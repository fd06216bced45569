"""Resume as a trainer would meet it: a compile in a real subprocess, killed with SIGKILL in the middle of step 3,
resumed in a new subprocess, against an uninterrupted run with the same seed (tiny model, real files).

The kill lands during step 3's validation, after step 3's log record was written and before its checkpoint: the
resume must cut that record and redo the step from the step-2 checkpoint. The killed script's metric (same name and
values as the uninterrupted one's) sleeps once step 3 is logged, so the kill always lands there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4

SCRIPT = textwrap.dedent('''
    import functools, json, sys, time
    from pathlib import Path

    import torch

    from compilers import MMGRPO, checkpoint as ckpt
    from programs import Single
    from tiny_setup import SIG, TRAIN, length_metric, tiny_config
    from wfc.artifact import adapter_state
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    mode, run_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    metric = length_metric
    if mode == "kill":
        @functools.wraps(length_metric)
        def metric(example, prediction, trace=None):  # stalls in step 3's validation, once step 3 is logged
            log = run_dir / "metrics.jsonl"
            if log.exists() and any(json.loads(line).get("step") == 3 and json.loads(line)["kind"] == "step"
                                    for line in log.read_text().splitlines()):
                (out / "in_step_3").write_text("")
                time.sleep(600)
            return length_metric(example, prediction, trace)
    if mode == "resume":  # record what the compile's own restore put back, before any step runs
        real = ckpt.restore

        def spy(*args, **kwargs):
            loop = real(*args, **kwargs)
            torch.save({"optimizer": {a: o.state_dict() for a, o in kwargs["optimizers"].optimizers.items()},
                        "rng": torch.get_rng_state(), "sampler": kwargs["sampler"].state_dict(), "step": loop.step},
                       out / "restored.pt")
            return loop

        ckpt.restore = spy
    engine = HFEngine(load_model("tiny"), batch_wait_s=0.02)
    # rollouts in flight together (batched by thread timing): every call's own sampling seed makes the draw repeat
    compiled = MMGRPO(metric, **tiny_config(steps=int(sys.argv[4]))).compile(
        Single(SIG), trainset=TRAIN, valset=TRAIN[:3], engine=engine, run_dir=run_dir, progress=False,
        resume=run_dir if mode == "resume" else None)
    torch.save({a: adapter_state(engine.policy.model, a) for a in engine.adapters}, out / "adapters.pt")
    engine.close()
''')


def _start(tmp_path: Path, mode: str, run_dir: Path, out: Path, steps: int = STEPS) -> subprocess.Popen:
    script = tmp_path / "compile_run.py"
    script.write_text(SCRIPT)
    path = [str(ROOT), str(ROOT / "tests" / "compilers"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.Popen([sys.executable, str(script), mode, str(run_dir), str(out), str(steps)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-3000:]
    return output


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _steps(run_dir: Path) -> dict[int, dict]:
    steps = [r for r in _records(run_dir) if r["kind"] == "step"]
    assert len(steps) == len({r["step"] for r in steps}), "a step is logged twice"
    return {r["step"]: r for r in steps}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6


def test_kill_9_mid_step_then_resume_matches_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    # One process at a time, though every training call samples with its own seed (so batching does not change the
    # draw): two compiles on two cores would only make each slower.
    victim = _start(tmp_path, "kill", killed / "run", killed / "out")
    try:
        deadline = time.time() + 240
        while not (killed / "out" / "in_step_3").exists():
            assert victim.poll() is None, victim.communicate()[0][-3000:]
            assert time.time() < deadline, "the compile never reached step 3"
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert victim.returncode == -signal.SIGKILL
    _finish(_start(tmp_path, "full", full / "run", full / "out"))
    run = killed / "run"
    saved = json.loads((run / "checkpoint" / "checkpoint.json").read_text())
    assert saved["step"] == 2, "the kill must land after the step-2 checkpoint and before step 3's"
    assert 3 in _steps(run), "step 3 was logged before the kill: the resume has to cut it"
    snapshot = tmp_path / "checkpoint-step-2"
    shutil.copytree(run / "checkpoint", snapshot)

    output = _finish(_start(tmp_path, "resume", run, killed / "out"))

    # the state the compile restored is the state the checkpoint saved
    restored = torch.load(killed / "out" / "restored.pt", weights_only=True)
    on_disk = torch.load(snapshot / "optimizer.pt", weights_only=True)
    assert restored["step"] == 2 and restored["sampler"] == saved["sampler"]
    assert torch.equal(restored["rng"], torch.load(snapshot / "rng.pt", weights_only=True)["cpu"])
    for adapter, state in on_disk.items():
        got = restored["optimizer"][adapter]
        assert got["param_groups"] == state["param_groups"]
        assert state["state"] and got["state"].keys() == state["state"].keys()
        for k, moments in state["state"].items():
            for name in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(got["state"][k][name], moments[name]), (adapter, k, name)
    # the checkpointed adapters are exactly the uninterrupted run's after step 2 (its evaluated revision 2)
    for file in (snapshot / "adapters").iterdir():
        ref = load_file(str(full / "run" / "revisions" / "2" / file.name))
        assert all(torch.equal(v, ref[k]) for k, v in load_file(str(file)).items())

    # the log continues: one record per step, the killed run's step-3 record replaced by the resumed one
    records = _records(run)
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 1, 2, 3, 4]
    assert [r["after_step"] for r in records if r["kind"] == "resume"] == [2]
    ref, got = _steps(full / "run"), _steps(run)
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):  # the first post-resume step, and the one after, as the uninterrupted run did them
        for adapter, stats in ref[step]["adapters"].items():
            assert _close(got[step]["adapters"][adapter]["loss"], stats["loss"]), (step, adapter)
            assert _close(got[step]["adapters"][adapter]["grad_norm"], stats["grad_norm"]), (step, adapter)
        assert _close(got[step]["reward_mean"], ref[step]["reward_mean"])
    # and ends with the same adapters
    a = torch.load(full / "out" / "adapters.pt", weights_only=True)
    b = torch.load(killed / "out" / "adapters.pt", weights_only=True)
    assert a.keys() == b.keys()
    for adapter in a:
        assert a[adapter].keys() == b[adapter].keys()
        for k in a[adapter]:
            assert torch.allclose(a[adapter][k], b[adapter][k], rtol=0, atol=1e-6), (adapter, k)
    assert json.loads((run / "checkpoint" / "checkpoint.json").read_text())["step"] == STEPS, output[-2000:]


CLI_PROGRAM = """
import dspy
from programs import Single

program = Single(dspy.Signature("question -> answer", "Solve the arithmetic word problem."))
"""


def test_cli_resume_continues_and_refuses_a_changed_config(tmp_path, capsys):
    from wfc.cli import main

    (tmp_path / "cli_prog.py").write_text(CLI_PROGRAM)
    base = ["compile", f"{tmp_path / 'cli_prog.py'}:program", "--task", "arithmetic", "--model", "tiny",
            "--group-size", "2", "--examples-per-step", "2", "--max-tokens", "4", "--val-size", "2",
            "--set", "lora.r=4", "--set", "eval_every=1"]
    run = tmp_path / "run"
    assert main([*base, "--steps", "1", "--out", str(tmp_path / "a"), "--run-dir", str(run)]) == 0
    assert main([*base, "--steps", "2", "--out", str(tmp_path / "b"), "--resume", str(run)]) == 0
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["revisions"] == [0, 1, 2]
    assert [r["step"] for r in manifest["history"] if r["kind"] == "step"] == [1, 2]
    capsys.readouterr()
    assert main([*base, "--steps", "3", "--lr", "0.01", "--out", str(tmp_path / "c"), "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "only steps may change" in err
    assert main([*base, "--steps", "3", "--out", str(tmp_path / "c"), "--resume", str(tmp_path / "nowhere")]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
