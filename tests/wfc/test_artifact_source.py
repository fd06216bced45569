"""Artifacts of the user's own programs in a fresh process, safe loading, checksums, and CompiledProgram as a module.

The fresh-process test compiles in one subprocess (a script in a temporary folder: one program class in the script's
``__main__``, one in a sibling module) and loads, runs and serves in another, started from a different directory.
"""

from __future__ import annotations

import json
import pickle
import shutil
import textwrap
from pathlib import Path

import dspy
import pytest
import torch

import wfc
from tests.wfc.subprocess_common import run_python
from wfc.artifact import ArtifactError, CompiledProgram, Manifest
from wfc.source import capture, slice_source

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ["What is 2 plus 2?", "What is 3 plus 1?"]

# A sibling module of the script: a program whose __init__ needs arguments, two roles from one Signature.
ROLES_LIB = '''
import dspy


class Pipeline(dspy.Module):
    def __init__(self, signature, *, note):
        super().__init__()
        self.note = note
        self.draft = dspy.Predict(signature)
        self.review = dspy.Predict(signature)

    def forward(self, question):
        draft = self.draft(question=question)
        return self.review(question=f"{question} ({self.note}: {draft.answer})")
'''

# The compiling script. Its training run is deliberately not under a main guard, as in a quick script: loading must
# not run it again (the artifact holds only the slice the program needs).
SCRIPT = '''
import json, sys
import dspy
from compilers import MMGRPO
from roles_lib import Pipeline

PREFIX = "Q"


class QA(dspy.Signature):
    """Answer the question with a number."""
    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="the number")


class TwoRoles(dspy.Module):
    def __init__(self, signature):
        super().__init__()
        self.solver = dspy.Predict(signature)
        self.checker = dspy.Predict(signature)

    def forward(self, question):
        first = self.solver(question=f"{PREFIX}: {question}")
        return self.checker(question=f"{question} Proposed: {first.answer}")


def metric(example, prediction, trace=None):
    return (len(str(prediction.answer)) % 4) / 3.0


out = sys.argv[1]
train = [dspy.Example(question=f"What is {a} plus {b}?", answer=str(a + b)).with_inputs("question")
         for a in range(3) for b in range(2)]
compiler = MMGRPO(metric, steps=1, examples_per_step=2, group_size=2, max_tokens=5, eval_every=0, learning_rate=5e-2,
                  lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
expected = {}
for name, program in (("main", TwoRoles(QA)), ("sibling", Pipeline(QA, note="draft"))):
    compiled = compiler.compile(program, trainset=train, valset=train[:1], model="tiny", backend="shared",
                                run_dir=f"{out}/run-{name}", progress=False)
    compiled.save(f"{out}/{name}")
    graphs = [compiled.trace({"question": q}) for q in __QUESTIONS__]
    expected[name] = {"answers": [compiled(question=q).answer for q in __QUESTIONS__],
                      "ids": [[c.completion_ids for c in g.calls] for g in graphs]}
    compiled.engine.close()
json.dump(expected, open(f"{out}/expected.json", "w"))
open(f"{out}/trained.marker", "a").write("x")  # counts training runs of this script
'''

# The loading process: default load refused (the code ships in the artifact), trusted load runs, serves, `wfc run`.
LOADER = '''
import contextlib, io, json, sys
import wfc
from fastapi.testclient import TestClient
from wfc.artifact import ArtifactError
from wfc.cli import main
from wfc.serve import create_app

out = sys.argv[1]
result = {}
for name in ("main", "sibling"):
    art = f"{out}/{name}"
    try:
        wfc.load(art)
        refused = None
    except ArtifactError as exc:
        refused = str(exc)
    compiled = wfc.load(art, trust_code=True)
    graphs = [compiled.trace({"question": q}) for q in __QUESTIONS__]
    client = TestClient(create_app(compiled))
    served = [client.post(f"/v1/programs/{compiled.manifest.name}", json={"inputs": {"question": q}}).json()
              for q in __QUESTIONS__]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["run", art, "--trust-code", "--input", "question=" + __QUESTIONS__[0]])
    result[name] = {"refused": refused, "answers": [compiled(question=q).answer for q in __QUESTIONS__],
                    "ids": [[c.completion_ids for c in g.calls] for g in graphs],
                    "served": [s["outputs"]["answer"] for s in served], "cli": [code, stdout.getvalue()],
                    "class": type(compiled.program).__module__}
    compiled.engine.close()
json.dump(result, open(f"{out}/loaded.json", "w"))
'''


def test_user_program_compiled_in_one_process_loads_runs_and_serves_in_another(tmp_path):
    project, elsewhere, out = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "out"
    for d in (project, elsewhere, out):
        d.mkdir()
    (project / "roles_lib.py").write_text(ROLES_LIB)
    (project / "train.py").write_text(SCRIPT.replace("__QUESTIONS__", repr(QUESTIONS)))
    (elsewhere / "load.py").write_text(LOADER.replace("__QUESTIONS__", repr(QUESTIONS)))
    run_python(["train.py", str(out)], cwd=project)
    shutil.rmtree(project)  # nothing of the compiling folder is needed to load
    run_python([str(elsewhere / "load.py"), str(out)], cwd=elsewhere)
    expected = json.loads((out / "expected.json").read_text())
    loaded = json.loads((out / "loaded.json").read_text())
    for name, source in (("main", "program/source/train.py"), ("sibling", "program/source/roles_lib.py")):
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert [s["path"] for s in manifest["program_source"]["sources"]] == [source]
        assert source in manifest["checksums"] and not manifest["program_source"]["structure_error"]
        got = loaded[name]
        assert "trust_code=True" in got["refused"] and source in got["refused"]
        assert got["ids"] == expected[name]["ids"] and all(all(ids) for ids in got["ids"])
        assert got["answers"] == expected[name]["answers"] == got["served"]
        assert got["cli"][0] == 0 and f"answer: {expected[name]['answers'][0]}" in got["cli"][1]
        assert got["class"].startswith("wfc_artifact_")
    shipped = (out / "main" / "program" / "source" / "train.py").read_text()
    assert "class TwoRoles" in shipped and "PREFIX = " in shipped and "MMGRPO" not in shipped
    assert (out / "trained.marker").read_text() == "x", "loading ran the compiling script's training again"


def test_slice_keeps_what_the_class_needs_and_drops_the_run():
    script = textwrap.dedent('''
        import json
        import dspy
        from compilers import MMGRPO
        SIG = dspy.Signature("question -> answer")
        def helper(text):
            return text.strip()
        class P(dspy.Module):
            def __init__(self):
                super().__init__()
                self.a = dspy.Predict(SIG)
            def forward(self, question):
                compiled = helper(question)  # a local that shares a name with the run below
                return self.a(question=compiled)
        program = P()
        compiled = MMGRPO(None).compile(program)
        compiled.save("out")
        if __name__ == "__main__":
            print(json.dumps({}))
    ''')
    kept = slice_source(script, {"P"})
    assert "SIG = " in kept and "def helper" in kept and "class P" in kept and "import dspy" in kept
    assert "MMGRPO" not in kept and "save" not in kept and "json" not in kept and "program = " not in kept
    compile(kept, "<slice>", "exec")


# ----- loading safely: checksums, no pickle, explicit programs -----------------------------------------------------
SIG = dspy.Signature("question -> answer", "Answer the question.")


class Lambdas(dspy.Module):
    """A program whose structure is not data (a lambda attribute)."""

    def __init__(self):
        super().__init__()
        self.answer = dspy.Predict(SIG)
        self.clean = lambda text: text.strip()

    def forward(self, question):
        return self.answer(question=self.clean(question))


def make_lambdas() -> Lambdas:
    return Lambdas()


@pytest.fixture(scope="module")
def engine():
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"), batch_wait_s=0.05)  # its own model: adapters must not leak to others
    yield engine
    engine.close()


def _save(program, engine, path: Path, roles: dict) -> Path:
    from peft import LoraConfig

    if "voters" not in getattr(engine.policy.model, "peft_config", {}):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            engine.policy.add_adapter("voters", LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=False))
    manifest = Manifest(name=type(program).__name__, base_model="tiny", base_model_checksum=engine.handle.checksum,
                        program_class=f"{type(program).__module__}:{type(program).__qualname__}", roles=roles,
                        sampling={"temperature": 0.0, "max_tokens": 6})
    return CompiledProgram(program, engine, manifest).save(path)


@pytest.fixture(scope="module")
def voting_artifact(engine, tmp_path_factory):
    from programs import Voting

    program = Voting(SIG, n=2)
    path = _save(program, engine, tmp_path_factory.mktemp("safe") / "art", {"voter": "voters", "aggregator": None})
    return path, program


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_manifest(path: Path, **update) -> None:
    data = json.loads((path / "manifest.json").read_text())
    data.update(update)
    (path / "manifest.json").write_text(json.dumps(data))


def test_installed_program_class_loads_without_pickle_or_trust(voting_artifact, engine, tmp_path):
    path, program = voting_artifact
    art = _copy(path, tmp_path / "art")
    (art / "program" / "program.pkl").unlink()  # the default route never needs it
    loaded = wfc.load(art, engine=engine)
    assert type(loaded.program).__module__ == "programs.voting" and loaded.program.n == 2
    assert loaded.program.dump_state() == program.dump_state()
    original = CompiledProgram(program, engine, loaded.manifest)
    assert [loaded.trace({"question": q}).calls[-1].prompt_ids for q in QUESTIONS] == \
        [original.trace({"question": q}).calls[-1].prompt_ids for q in QUESTIONS]
    assert [loaded(question=q).answer for q in QUESTIONS] == [original(question=q).answer for q in QUESTIONS]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_adapter_or_state_is_an_artifact_error_naming_the_file(voting_artifact, engine, tmp_path, damage):
    for rel in ("adapters/voters/adapter_model.safetensors", "program/state.json"):
        art = _copy(voting_artifact[0], tmp_path / f"{damage}-{rel.replace('/', '_')}")
        data = bytearray((art / rel).read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x01
        else:
            data = data[: len(data) // 2]
        (art / rel).write_bytes(bytes(data))
        with pytest.raises(ArtifactError, match=rel):
            wfc.load(art, engine=engine)


def test_malicious_pickle_is_not_executed_unless_trusted(voting_artifact, engine, tmp_path):
    art = _copy(voting_artifact[0], tmp_path / "evil")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (art / "program" / "program.pkl").write_bytes(pickle.dumps(Payload()))
    (art / "program" / "structure.json").unlink()  # the pickle is now the only route: an attacker's best case
    data = json.loads((art / "manifest.json").read_text())
    checksums = {k: v for k, v in data["checksums"].items() if k != "program/structure.json"}
    from wfc.artifact import sha256

    checksums["program/program.pkl"] = sha256(art / "program" / "program.pkl")  # the attacker edits it too
    data["program_source"]["structure_error"] = "forged"
    data["program_source"]["class_ref"] = "programs.voting:Voting"
    _rewrite_manifest(art, checksums=checksums, program_source=data["program_source"])
    with pytest.raises(ArtifactError, match=r"trust_code=True"):
        wfc.load(art, engine=engine)
    assert not marker.exists(), "the artifact's pickle ran without trust_code"
    with pytest.raises(ArtifactError, match="not a dspy.Module"):
        wfc.load(art, engine=engine, trust_code=True)  # trusted: it unpickles (and the payload is no program)
    assert marker.exists(), "the payload must be real for the test above to mean anything"


def test_program_that_is_not_data_says_what_to_pass(engine, tmp_path):
    found = capture(Lambdas())
    assert found.structure is None and "function" in found.source.structure_error
    art = _save(Lambdas(), engine, tmp_path / "lam", {"answer": "voters"})
    assert type(wfc.load(art, engine=engine).program) is Lambdas  # this very file defines it: used, no flag needed
    manifest = json.loads((Path(art) / "manifest.json").read_text())
    for src in manifest["program_source"]["sources"]:
        src["origin_sha256"] = "0" * 64  # as loaded where this module's file is not the one the copy came from
    (Path(art) / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"program_import_path='your_file.py:factory'.*trust_code=True"):
        wfc.load(art, engine=engine)
    loaded = wfc.load(art, engine=engine, program_import_path=f"{__file__}:make_lambdas")
    assert loaded(question=" What is 2 plus 2? ").answer == loaded(question="What is 2 plus 2?").answer


# ----- CompiledProgram is a dspy.Module ----------------------------------------------------------------------------
class Team(dspy.Module):
    def __init__(self, compiled):
        super().__init__()
        self.team = compiled

    def forward(self, question):
        return self.team(question=f"{question} Think.")


def test_compiled_program_nests_in_another_program(voting_artifact, engine):
    from wfc.lower import copy_program, trace

    compiled = wfc.load(voting_artifact[0], engine=engine)
    assert isinstance(compiled, dspy.Module)
    outer = Team(compiled)
    assert [p for p, _ in outer.named_predictors()] == ["team.voter", "team.aggregator"]
    copied = copy_program(outer)
    assert copied.team.engine is engine and copied.team.program is not compiled.program
    # standalone: its own adapters on its own engine
    q = QUESTIONS[0]
    assert outer(question=q).answer == compiled(question=f"{q} Think.").answer
    # under an enclosing tracer: the calls follow the outer binding, under the outer role paths and adapters
    graph = trace(outer, {"question": q}, engine, adapters={"team.voter": "voters", "team.aggregator": None},
                  sampling=compiled.sampling())
    assert graph.status == "ok", graph.error
    assert [c.role for c in graph.calls] == ["team.voter", "team.voter", "team.aggregator"]
    assert [c.adapter for c in graph.calls] == ["voters", "voters", None]
    assert graph.outputs["answer"] == compiled(question=f"{q} Think.").answer


def test_a_roles_stop_strings_travel_in_the_artifact_and_end_its_calls(engine, tmp_path):
    """``dspy.Predict(sig, stop=...)`` (the demo's ``--stop``): the config is part of the saved structure, and the
    loaded program's calls end at the stop string on the real engine."""
    import functools

    from programs import Voting

    program = Voting(SIG, n=2, predictor=functools.partial(dspy.Predict, stop=(" ",)))
    path = _save(program, engine, tmp_path / "art", {"voter": "voters", "aggregator": None})
    (path / "program" / "program.pkl").unlink()  # the structure alone must carry it
    loaded = wfc.load(path, engine=engine)
    assert loaded.program.voter.config == {"stop": (" ",)} and loaded.program.aggregator.config == {"stop": (" ",)}
    calls = [c for q in QUESTIONS for c in loaded.trace({"question": q}).calls]
    # stops are matched on decoded text and cut at the token that completes one (" legally" ends a call)
    stopped = [c for c in calls if c.finish_reason == "stop"]
    assert stopped and all(" " in c.text for c in stopped)
    assert all(" " not in c.text for c in calls if c.finish_reason == "length")  # one with a space would have stopped


# A script that compiles its own programs and loads what it saved, in the same process, with no flag (issue 47):
# the script's __main__ and its sibling module are the very files the artifact copied, so nothing shipped runs.
SAME_SCRIPT = '''
import json, sys
import dspy
import wfc
from compilers import MMGRPO
from roles_lib import Pipeline


class Solo(dspy.Module):
    def __init__(self):
        super().__init__()
        self.solve = dspy.Predict("question -> answer")

    def forward(self, question):
        return self.solve(question=question)


out = sys.argv[1]
train = [dspy.Example(question=f"What is {a} plus 1?", answer=str(a + 1)).with_inputs("question") for a in range(4)]
compiler = MMGRPO(lambda e, p, trace=None: float(len(str(p.answer)) % 2), steps=1, examples_per_step=2,
                  group_size=2, max_tokens=4, eval_every=0, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"]})
result = {}
for name, program in (("main", Solo()), ("sibling", Pipeline("question -> answer", note="draft"))):
    compiled = compiler.compile(program, trainset=train, model="tiny", run_dir=f"{out}/run-{name}", progress=False)
    compiled.save(f"{out}/{name}")
    loaded = wfc.load(f"{out}/{name}", engine=compiled.engine)
    result[name] = {"class": type(loaded.program) is type(program),
                    "same": loaded(question="What is 2 plus 1?").answer == compiled(question="What is 2 plus 1?").answer}
json.dump(result, open(f"{out}/same.json", "w"))
'''

# Another process whose importable roles_lib is not the file the artifact copied: refused without trust_code.
CHANGED_LOADER = '''
import json, sys
import wfc
from wfc.artifact import ArtifactError

try:
    wfc.load(sys.argv[1] + "/sibling", model="tiny")
    print(json.dumps("loaded"))
except ArtifactError as exc:
    print(json.dumps(str(exc)))
'''


def test_a_script_loads_what_it_compiled_without_trust_but_a_changed_module_is_refused(tmp_path):
    project, out = tmp_path / "project", tmp_path / "out"
    project.mkdir(), out.mkdir()
    (project / "roles_lib.py").write_text(ROLES_LIB)
    (project / "same.py").write_text(SAME_SCRIPT)
    run_python(["same.py", str(out)], cwd=project)
    assert json.loads((out / "same.json").read_text()) == {"main": {"class": True, "same": True},
                                                            "sibling": {"class": True, "same": True}}
    (project / "roles_lib.py").write_text(ROLES_LIB + "\nEDITED = True\n")  # the user's module changed since compile
    (project / "load.py").write_text(CHANGED_LOADER)
    proc = run_python(["load.py", str(out)], cwd=project)
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "trust_code=True" in said and "roles_lib" in said
