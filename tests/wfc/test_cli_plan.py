"""``wfc plan``: it traces with the config (``--config`` / ``--set``, as compile) and on the ``--engine`` asked for."""

from __future__ import annotations

import json
import textwrap

import pytest

import wfc.cli
import wfc.engines
from wfc.cli import main

PROGRAM_FILE = """
import dspy
from programs import Voting

program = Voting(dspy.Signature("question -> answer", "Solve the arithmetic word problem."), n=2)
"""


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "plan_prog.py"
    path.write_text(textwrap.dedent(PROGRAM_FILE))
    return f"{path}:program"


@pytest.fixture
def engines(monkeypatch, tiny_handle):
    """Records every make_engine call of the CLI and hands out HF engines on the tiny model."""
    calls = []
    real = wfc.engines.make_engine

    def recording(kind, model, **kwargs):
        calls.append((kind, model, kwargs))
        return real("hf", tiny_handle)

    monkeypatch.setattr(wfc.cli, "make_engine", recording)
    return calls


def test_plan_honours_config_file_and_set(program, tmp_path, capsys, engines):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"auto_trace_examples": 2, "auto_trace_repeats": 3, "max_tokens": 5}))
    argv = ["plan", program, "--model", "tiny", "--n", "4", "--config", str(config),
            "--set", "auto_trace_repeats=1", "--set", "temperature=0.5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 2 examples from the file, 1 repeat and temperature 0.5 from --set, max_tokens 5 from the file
    assert "traced 2 rollouts (2 examples x 1) with the base model at temperature 0.5, max_tokens 5" in out
    assert engines == [("hf", "tiny", {})]


def test_plan_uses_the_engine_asked_for(program, capsys, engines):
    argv = ["plan", program, "--model", "tiny", "--n", "1", "--set", "auto_trace_repeats=1", "--set", "max_tokens=2",
            "--engine", "vllm-server", "--server", "http://10.0.0.1:8000", "--server", "http://10.0.0.2:8000"]
    assert main(argv) == 0
    assert engines == [("vllm-server", "tiny",
                        {"servers": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"], "launch": None})]
    assert "traced 1 rollouts (1 examples x 1)" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--set", "group_size=1"], "group_size"),
    (["--set", "nonsense"], "--set expects FIELD=VALUE"),
    (["--server", "http://127.0.0.1:8000"], "need --engine vllm-server"),
])
def test_plan_user_errors_exit_2(program, capsys, engines, extra, message):
    assert main(["plan", program, "--model", "tiny", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wfc: error: ") and message in err
    assert engines == []  # refused before any model or server is touched
