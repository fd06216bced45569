"""The ``wfc`` command line: import specs, user errors (exit 2, one line), inspect / compile / run / rollback on tiny."""

from __future__ import annotations

import json
import textwrap

import pytest

from wfc.cli import main
from wfc.imports import LoadError, load_object, load_program
from wfc.rolegraph import RoleGraph

# ----- wfc inspect: the role graph as the CLI prints it ---------------------------------------------------------------
PROGRAM_FILE = """
import dspy
from programs import Voting

SIG = dspy.Signature("question -> answer", "Solve the arithmetic word problem.")
program = Voting(SIG, n=2)

def make():
    return Voting(SIG, n=2)

class NoRoles(dspy.Module):
    def forward(self, question):
        return question

empty = NoRoles()
number = 3
"""


@pytest.fixture
def program_file(tmp_path):
    path = tmp_path / "my_prog.py"
    path.write_text(textwrap.dedent(PROGRAM_FILE))
    return path


def test_load_object_and_program(program_file):
    import dspy

    assert load_object("wfc.rolegraph:RoleGraph") is RoleGraph
    assert load_object("wfc.rolegraph:RoleGraph.from_rollouts") == RoleGraph.from_rollouts
    assert isinstance(load_program(f"{program_file}:program"), dspy.Module)
    assert list(dict(load_program(f"{program_file}:make").named_predictors())) == ["voter", "aggregator"]
    for spec, message in [
        ("no_colon", "needs the form"),
        (f"{program_file}:missing", "has no attribute 'missing'"),
        (f"{program_file}:empty", "no predictors"),
        (f"{program_file}:number", "not a dspy.Module"),
        ("programs:Voting", "zero-argument"),
        ("no_such_module_xyz:thing", "no module named"),
        ("/no/such/file.py:x", "no such Python file"),
    ]:
        with pytest.raises(LoadError, match=message):
            load_program(spec)


@pytest.mark.parametrize("argv, message", [
    (["inspect", "nonsense"], "needs the form"),
    (["inspect", "{file}:empty"], "no predictors"),
    (["inspect", "{file}:program", "--model", "no-such-model"], "unknown model 'no-such-model'"),
])
def test_inspect_user_errors_exit_2_in_one_line(argv, message, program_file, capsys):
    assert main([a.replace("{file}", str(program_file)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wfc: error: ") and message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_inspect_on_tiny_prints_rollouts_and_writes_files(program_file, tmp_path, capsys):
    dot, mmd, js = tmp_path / "g.dot", tmp_path / "g.mmd", tmp_path / "g.json"
    code = main(["inspect", f"{program_file}:program", "--model", "tiny", "--n", "2", "--max-tokens", "4",
                 "--dot", str(dot), "--mermaid", str(mmd), "--json", str(js)])
    assert code == 0
    out = capsys.readouterr().out
    assert [ln.split(" [")[0] for ln in out.splitlines() if ln.startswith("rollout ")] == ["rollout 0", "rollout 1"]
    assert "voter[1]" in out and "aggregator[0]" in out
    assert "role graph over 2 rollout(s)" in out
    assert '"voter"' in dot.read_text() and mmd.read_text().startswith("flowchart LR")
    data = json.loads(js.read_text())
    assert [r["role"] for r in data["role_graph"]["roles"]] == ["voter", "aggregator"]
    assert len(data["rollouts"]) == 2 and len(data["rollouts"][0]["calls"]) == 3


def test_compile_run_rollback_on_tiny(program_file, tmp_path, capsys):
    out = tmp_path / "art"
    argv = ["compile", f"{program_file}:program", "--task", "arithmetic", "--model", "tiny", "--steps", "1", "--group-size", "2",
            "--examples-per-step", "2", "--max-tokens", "4", "--val-size", "2", "--set", "lora.r=4",
            "--recipe", "fast", "--device", "cpu", "--out", str(out), "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["revisions"] == [0, 1] and manifest["config"]["lora"]["r"] == 4
    # the recipe is the starting point, the flags override it
    assert manifest["config"]["learning_rate"] == 6e-4 and manifest["config"]["dynamic_sampling"] is True
    assert manifest["config"]["max_tokens"] == 4 and manifest["config"]["group_size"] == 2
    assert manifest["config"]["device"] == "cpu"
    assert main(["run", str(out), "--input", "question=What is 2 plus 2?", "--model", "tiny"]) == 0
    assert "answer:" in capsys.readouterr().out
    assert main(["rollback", str(out), "--step", "0"]) == 0
    a = (out / "adapters" / manifest["roles"]["voter"] / "adapter_model.safetensors").read_bytes()
    b = (out / "revisions" / "0" / manifest["roles"]["voter"] / "adapter_model.safetensors").read_bytes()
    assert a == b
    assert json.loads((out / "manifest.json").read_text())["revision_step"] == 0
    assert main(["rollback", str(out), "--step", "7"]) == 2
    assert "no revision for step 7" in capsys.readouterr().err


def test_compile_with_a_bf16_rollout_engine(program_file, tmp_path, capsys):
    out = tmp_path / "art"
    argv = ["compile", f"{program_file}:program", "--task", "arithmetic", "--model", "tiny", "--steps", "1",
            "--group-size", "2", "--examples-per-step", "2", "--max-tokens", "4", "--val-size", "2",
            "--set", "lora.r=4", "--device", "cpu", "--engine-dtype", "bfloat16", "--out", str(out),
            "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    # the bf16 engine's log-probs against the fp32 trainer's: tests/compilers/test_policy.py (arithmetic gives the
    # tiny random model no reward spread, so no row trains here)
    assert json.loads((out / "manifest.json").read_text())["config"]["dtype"] == "float32"  # the trained policy
    assert main(["run", str(out), "--input", "question=What is 2 plus 2?", "--model", "tiny"]) == 0
    assert "answer:" in capsys.readouterr().out
    assert main([*argv[:-4], "--engine", "vllm", "--out", str(tmp_path / "x")]) == 2
    assert "--engine-dtype is the hf engine's option" in capsys.readouterr().err


def test_compile_bad_config_exits_2(program_file, tmp_path, capsys):
    argv = ["compile", f"{program_file}:program", "--model", "tiny", "--set", "group_size=1", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "group_size" in capsys.readouterr().err
    assert main([*argv[:4], "--device", "gpu", "--out", str(tmp_path / "x")]) == 2
    assert "device" in capsys.readouterr().err
    assert main([*argv[:4], "--recipe", "quick", "--out", str(tmp_path / "x")]) == 2
    assert "recipe 'quick' is unknown" in capsys.readouterr().err and not (tmp_path / "x").exists()
