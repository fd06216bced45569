"""A program compiled with structured decoding keeps it: saved, loaded in a fresh process from another directory,
served, and called through the openai SDK with ``response_format``, every answer parses (tiny real model)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import dspy

from compilers import MMGRPO
from wfc.engines.hf import HFEngine
from wfc.models import load_model

ROOT = Path(__file__).resolve().parents[2]
TRAIN = [dspy.Example(question=f"What is {a} plus {b}?", answer=str(a + b)).with_inputs("question")
         for a in range(3) for b in range(2)]


def int_metric(example, prediction, trace=None):
    return float(prediction.answer == int(example.answer))


CLIENT = textwrap.dedent('''
    import json, sys
    import openai
    import wfc
    from wfc.serve import ServerThread, create_app
    art = wfc.load(sys.argv[1])
    out = {"grammars": art.manifest.grammars, "decoding": art.manifest.decoding}
    with ServerThread(create_app(art, max_tokens_limit=256)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
        reply = client.chat.completions.create(
            model="predict", messages=[{"role": "user", "content": "What is 2 plus 2?"}], max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        out["chat"] = json.loads(reply.choices[0].message.content)
        import httpx
        run = httpx.post(server.url + "/v1/programs/" + art.manifest.name,
                         json={"inputs": {"question": "What is 1 plus 2?"}}, timeout=120).json()
        out["run"] = run
    print("RESULT" + json.dumps(out))
''')


def test_structured_program_saved_loaded_elsewhere_served_and_called_with_response_format(tmp_path):
    engine = HFEngine(load_model("tiny"))
    try:
        program = dspy.ChainOfThought("question -> answer: int")
        compiled = MMGRPO(int_metric, steps=1, examples_per_step=2, group_size=2, max_tokens=48, eval_every=0,
                          learning_rate=1e-3, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                          ).compile(program, trainset=TRAIN, valset=TRAIN[:2], engine=engine)
        path = compiled.save(tmp_path / "made" / "cot")
    finally:
        engine.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", CLIENT, str(path)], cwd=elsewhere, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                            "HOME": str(Path.home())})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["decoding"]["structured"] is True
    assert "[[ ## answer ## ]]" in result["grammars"]["predict"]
    assert isinstance(result["chat"]["answer"], int)
    assert result["run"]["status"] == "ok" and isinstance(result["run"]["outputs"]["answer"], int)


def test_a_react_agent_compiles_and_its_artifact_records_each_tools_argument_schema(tmp_path):
    from programs.agents import calculator_agent

    engine = HFEngine(load_model("tiny"))
    try:
        agent = calculator_agent(max_iters=2, thought_tokens=8)
        compiled = MMGRPO(int_metric, steps=1, examples_per_step=2, group_size=2, max_tokens=96, eval_every=0,
                          learning_rate=1e-3, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                          ).compile(agent, trainset=TRAIN, valset=TRAIN[:2], engine=engine)
        manifest = json.loads((compiled.save(tmp_path / "agent") / "manifest.json").read_text())
        graph = compiled.trace(TRAIN[0])
    finally:
        engine.close()
    grammar = manifest["grammars"]["react"]
    for tool in ("add", "subtract", "multiply", "divide", "finish"):
        assert f'"{tool}"' in grammar
    assert graph.status == "ok" and all(c.status == "ok" for c in graph.calls)
