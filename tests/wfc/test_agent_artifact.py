"""A ``dspy.ReAct`` agent's tools travel with its artifact (issue 45 item 3): each ``dspy.Tool`` is stored as data, its
function as a ``module:qualname`` reference, so tools defined in the user's script (sliced from ``__main__``) or in a
sibling module ship in ``program/source/`` and load in a fresh process only with ``trust_code``; tools of installed
packages load by name, with no flag. Each tool's argument schema survives, so the decoding grammar is the same."""

from __future__ import annotations

import json
import shutil

import dspy

from programs.agents import add, calculator_agent
from tests.wfc.subprocess_common import run_python
from wfc.engines.base import SamplingParams
from wfc.lower import Decoding, role_grammars
from wfc.source import capture, rebuild

QUESTION = "What is 2 plus 3?"

CALC_LIB = '''
def multiply(a: int, b: int) -> int:
    """Return a * b."""
    return a * b
'''

# The compiling script: one tool in the script itself (with a helper it needs), one from a sibling module; the
# training run is not under a main guard, so loading must not run it again.
SCRIPT = '''
import json, sys
import dspy
from compilers import MMGRPO
from calc_lib import multiply

OFFSET = 0


def _plain(x):
    return int(x) + OFFSET


def add(a: int, b: int) -> int:
    """Return a + b."""
    return _plain(a) + _plain(b)


class Solver(dspy.Module):
    def __init__(self):
        super().__init__()
        self.agent = dspy.ReAct("question -> answer: int", tools=[add, multiply], max_iters=2)

    def forward(self, question):
        return self.agent(question=question)


def metric(example, prediction, trace=None):
    return float(str(prediction.answer) == example.answer)


out = sys.argv[1]
train = [dspy.Example(question=f"What is {a} plus {b}?", answer=str(a + b)).with_inputs("question")
         for a in range(3) for b in range(2)]
compiled = MMGRPO(metric, steps=1, examples_per_step=2, group_size=2, max_tokens=48, eval_every=0,
                  lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                  ).compile(Solver(), trainset=train, valset=train[:1], model="tiny", run_dir=f"{out}/run",
                            progress=False)
compiled.save(f"{out}/agent")
json.dump({"answer": compiled(question=__QUESTION__).answer}, open(f"{out}/expected.json", "w"))
open(f"{out}/trained.marker", "a").write("x")
'''

LOADER = '''
import contextlib, io, json, sys
import wfc
from fastapi.testclient import TestClient
from wfc.artifact import ArtifactError
from wfc.cli import main
from wfc.lower import role_grammars
from wfc.serve import create_app

art = sys.argv[1] + "/agent"
try:
    wfc.load(art)
    refused = None
except ArtifactError as exc:
    refused = str(exc)
compiled = wfc.load(art, trust_code=True)
tools = compiled.program.agent.tools
graph = compiled.trace({"question": __QUESTION__})
served = TestClient(create_app(compiled)).post(f"/v1/programs/{compiled.manifest.name}",
                                               json={"inputs": {"question": __QUESTION__}}).json()
stdout = io.StringIO()
with contextlib.redirect_stdout(stdout):
    code = main(["run", art, "--trust-code", "--input", "question=" + __QUESTION__])
json.dump({"refused": refused, "answer": compiled(question=__QUESTION__).answer, "served": served["outputs"]["answer"],
           "cli": [code, stdout.getvalue()], "tools": sorted(tools), "leaked": "calc_lib" in sys.modules,
           "modules": {name: tool.func.__module__ for name, tool in tools.items()},
           "calls": [tools["add"](a=2, b=3), tools["multiply"](a=2, b=3), tools["finish"]()],
           "grammars": role_grammars(compiled.program, compiled.sampling(), compiled.decoding()) ==
           compiled.manifest.grammars,
           "trace": [graph.status, [c.status for c in graph.calls], graph.outputs.get("trajectory", {})]},
          open(sys.argv[1] + "/loaded.json", "w"))
compiled.engine.close()
'''


def test_agent_with_the_users_own_tools_loads_runs_and_serves_in_another_process(tmp_path):
    project, elsewhere, out = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "out"
    for d in (project, elsewhere, out):
        d.mkdir()
    (project / "calc_lib.py").write_text(CALC_LIB)
    (project / "agent.py").write_text(SCRIPT.replace("__QUESTION__", repr(QUESTION)))
    (elsewhere / "load.py").write_text(LOADER.replace("__QUESTION__", repr(QUESTION)))
    run_python(["agent.py", str(out)], cwd=project)
    shutil.rmtree(project)  # the tools' files are gone: only the artifact's copies remain
    run_python([str(elsewhere / "load.py"), str(out)], cwd=elsewhere)

    manifest = json.loads((out / "agent" / "manifest.json").read_text())
    source = manifest["program_source"]
    assert source["structure_error"] is None
    assert sorted(s["path"] for s in source["sources"]) == ["program/source/agent.py", "program/source/calc_lib.py"]
    shipped = (out / "agent" / "program" / "source" / "agent.py").read_text()
    assert "def add" in shipped and "def _plain" in shipped and "OFFSET = 0" in shipped and "class Solver" in shipped
    assert "MMGRPO" not in shipped and "metric" not in shipped
    for tool in ("add", "multiply", "finish"):
        assert f'"{tool}"' in manifest["grammars"]["agent.react"]

    loaded = json.loads((out / "loaded.json").read_text())
    expected = json.loads((out / "expected.json").read_text())
    refused = loaded["refused"]
    assert "trust_code=True" in refused and "program_import_path=" in refused and "program/source/" in refused
    assert loaded["tools"] == ["add", "finish", "multiply"]
    assert loaded["modules"]["add"].startswith("wfc_artifact_agent_")
    assert loaded["modules"]["multiply"].startswith("wfc_artifact_calc_lib_")
    assert not loaded["leaked"], "the shipped calc_lib stayed importable by its own name after loading"
    assert loaded["calls"] == [5, 6, "Completed."]
    assert loaded["grammars"] is True, "the rebuilt agent's tool grammar differs from the one the artifact records"
    status, call_status, trajectory = loaded["trace"]
    assert status == "ok" and call_status and all(s == "ok" for s in call_status)
    assert all(v in ("add", "multiply", "finish") for k, v in trajectory.items() if k.startswith("tool_name_"))
    assert loaded["answer"] == expected["answer"] == loaded["served"]
    assert loaded["cli"][0] == 0 and f"answer: {expected['answer']}" in loaded["cli"][1]
    assert (out / "trained.marker").read_text() == "x", "loading ran the compiling script's training again"


def test_installed_tools_are_references_and_the_rebuilt_agent_keeps_each_tools_schema(tmp_path):
    agent = calculator_agent(max_iters=2, thought_tokens=8)
    found = capture(agent)
    assert found.structure is not None and found.source.sources == []  # programs.agents is installed: no copy
    rebuilt = rebuild(found.source, found.structure, tmp_path, trust_code=False)
    assert list(rebuilt.tools) == list(agent.tools)
    for name, tool in agent.tools.items():
        again = rebuilt.tools[name]
        assert (again.name, again.desc, again.args, again.arg_types, again.has_kwargs) == \
            (tool.name, tool.desc, tool.args, tool.arg_types, tool.has_kwargs)
    assert rebuilt.tools["add"].func is add and rebuilt.tools["add"](a=2, b=3) == 5
    assert rebuilt.tools["finish"]() == "Completed."
    sampling, decoding = SamplingParams(max_tokens=64), Decoding(structured=True)
    assert role_grammars(rebuilt, sampling, decoding) == role_grammars(agent, sampling, decoding)
    assert agent.tools["add"].args == {"a": {"type": "integer"}, "b": {"type": "integer"}}  # grammars copy, not edit
    again = capture(rebuilt)  # a loaded agent saves again the same way
    assert again.structure == found.structure


class _Search:
    def __call__(self, query: str) -> str:
        return query


def test_a_tool_that_is_not_a_function_says_what_to_write():
    found = capture(dspy.ReAct("question -> answer", tools=[_Search()]))
    assert found.structure is None
    assert "tools['_Search'].func" in found.source.structure_error and "def " in found.source.structure_error


def test_a_lambda_tool_is_not_data():
    found = capture(dspy.ReAct("question -> answer", tools=[lambda a: a]))
    assert found.structure is None and "module level" in found.source.structure_error
