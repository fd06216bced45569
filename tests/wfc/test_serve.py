"""``wfc serve`` on the tiny real model: routes, routing to adapters, errors, API key, and a concurrent load test
against a real uvicorn server (answers equal single-request references; requests batch in the engine)."""

from __future__ import annotations

import threading
import time

import dspy
import httpx
import pytest
import torch
from fastapi.testclient import TestClient

import wfc
from wfc.artifact import CompiledProgram, Manifest
from wfc.cli import main
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.serve import ServerThread, create_app, program_inputs

SIG = dspy.Signature("question -> answer", "Answer the question.")
ROLES = {"voter": "voters", "aggregator": None}  # one role on an adapter named unlike it, one on the base model
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}]
QUESTIONS = ["What is 2 plus 2?", "What is 3 plus 1?"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A saved and reloaded Voting artifact (n=2) with a random non-zero LoRA on the voter role."""
    from peft import LoraConfig

    from programs import Voting
    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"), batch_wait_s=0.05)  # its own model: adapters must not leak to tiny_engine
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            engine.policy.add_adapter("voters", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        manifest = Manifest(name="Voting", base_model="tiny", base_model_checksum=engine.handle.checksum,
                            program_class="programs.voting:Voting", roles=ROLES,
                            sampling={"temperature": 0.0, "max_tokens": 8})
        path = CompiledProgram(Voting(SIG, n=2), engine, manifest).save(tmp_path_factory.mktemp("serve") / "art")
        yield wfc.load(path, engine=engine)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def client(compiled):
    return TestClient(create_app(compiled, max_tokens_limit=32))


def alone(engine, adapter, messages=MESSAGES, sampling=GREEDY):
    (gen,) = engine.generate([GenerationRequest(messages=tuple(messages), adapter=adapter, sampling=sampling)])
    return gen


def chat(client, model, messages=MESSAGES, **kw):
    return client.post("/v1/chat/completions", json={"model": model, "messages": messages, **kw})


def test_health_and_models(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["program"] == "Voting" and health["roles"] == ROLES
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert {m["id"]: (m["kind"], m["adapter"]) for m in models["data"]} == {
        "voter": ("role", "voters"), "aggregator": ("role", None), "voters": ("adapter", "voters"),
        "tiny": ("base", None)}
    assert client.get("/v1/programs").json()["data"][0]["inputs"] == ["question"]


def test_chat_routes_each_model_name_to_its_adapter(client, compiled):
    engine = compiled.engine
    expected = {None: alone(engine, None), "voters": alone(engine, "voters")}
    assert expected["voters"].text != expected[None].text  # the routing check below means something
    for model, adapter in {"voter": "voters", "voters": "voters", "aggregator": None, "tiny": None}.items():
        r = chat(client, model, temperature=0, max_tokens=8)
        assert r.status_code == 200, r.text
        body = r.json()
        want = expected[adapter]
        assert body["object"] == "chat.completion" and body["model"] == model
        assert body["choices"][0]["message"] == {"role": "assistant", "content": want.text}, model
        assert body["choices"][0]["finish_reason"] == want.finish_reason
        assert body["usage"] == {"prompt_tokens": len(want.prompt_ids), "completion_tokens": len(want.completion_ids),
                                 "total_tokens": len(want.prompt_ids) + len(want.completion_ids)}
    # unset sampling fields take the artifact's (greedy, 8 tokens); n choices; OpenAI text parts
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in MESSAGES]
    body = chat(client, "voter", parts, n=2).json()
    assert [c["message"]["content"] for c in body["choices"]] == [expected["voters"].text] * 2
    assert body["usage"]["completion_tokens"] == 2 * len(expected["voters"].completion_ids)
    sampled = chat(client, "voter", temperature=1.0, top_p=0.9, max_tokens=3, stop=["\n"]).json()
    assert sampled["usage"]["completion_tokens"] <= 3


def test_program_route_matches_the_loaded_program(client, compiled):
    for question in QUESTIONS:
        expected = dict(compiled(question=question).items())
        r = client.post("/v1/programs/Voting", json={"inputs": {"question": question}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok" and body["outputs"] == expected and "graph" not in body
    body = client.post("/v1/programs/Voting", json={"inputs": {"question": QUESTIONS[0]}, "return_graph": True}).json()
    graph = body["graph"]
    assert [(c["role"], c["adapter"]) for c in graph["calls"]] == [("voter", "voters")] * 2 + [("aggregator", None)]
    assert all(c["status"] == "ok" and c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 for c in graph["calls"])
    assert graph["calls"][0]["messages"][-1]["content"] == f"{QUESTIONS[0]}\nReply with only the answer."
    assert graph["outputs"] == body["outputs"] and all(e["src"] < e["dst"] for e in graph["edges"])


def test_request_errors_are_clear_4xx(client):
    r = client.post("/v1/programs/Nope", json={"inputs": {"question": "x"}})
    assert r.status_code == 404 and "Voting" in r.json()["error"]["message"]
    for inputs in ({}, {"question": "x", "extra": 1}, {"q": "x"}):
        r = client.post("/v1/programs/Voting", json={"inputs": inputs})
        assert r.status_code == 422 and "['question']" in r.json()["error"]["message"], r.text
    r = client.post("/v1/programs/Voting", json={"question": "x"})  # inputs not wrapped
    assert r.status_code == 422 and "inputs" in r.json()["error"]["message"]
    r = chat(client, "voter", max_tokens=33)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert "limit of 32" in r.json()["error"]["message"]
    assert chat(client, "gpt-4").status_code == 404
    assert chat(client, "voter", []).status_code == 422
    assert chat(client, "voter", temperature=-1).status_code == 422
    assert client.post("/v1/chat/completions", json={"messages": MESSAGES}).status_code == 422


def test_api_key_guards_every_route_but_health(compiled):
    keyed = TestClient(create_app(compiled, api_key="s3cret"))
    assert keyed.get("/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        assert keyed.get("/v1/models", headers=headers).status_code == 401
        r = keyed.post("/v1/programs/Voting", json={}, headers=headers)  # 401 before the body is even checked
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    good = {"Authorization": "Bearer s3cret"}
    assert keyed.get("/v1/models", headers=good).status_code == 200
    r = keyed.post("/v1/chat/completions", json={"model": "voter", "messages": MESSAGES}, headers=good)
    assert r.status_code == 200
    with pytest.raises(ValueError, match="empty"):
        create_app(compiled, api_key="")


def test_failed_runs_are_500_and_engine_failures_503_with_the_reason(fake_engine):
    from programs import Voting

    def script(request):
        if "boom" in request.messages[-1]["content"]:
            raise RuntimeError("engine on fire")
        return ""  # an empty completion: every role call is a format error

    manifest = Manifest(name="Voting", base_model="fake", base_model_checksum="0", program_class="x", roles=ROLES)
    client = TestClient(create_app(CompiledProgram(Voting(SIG, n=2), fake_engine(script), manifest)))
    r = client.post("/v1/programs/Voting", json={"inputs": {"question": "x"}, "return_graph": True})
    body = r.json()
    assert r.status_code == 500 and body["error"]["type"] in ("format_error", "crash"), body
    assert [c["status"] for c in body["graph"]["calls"]] == ["format_error"] * 2
    r = chat(client, "voter", [{"role": "user", "content": "boom"}])
    assert r.status_code == 503 and "engine on fire" in r.json()["error"]["message"]


def test_program_inputs_from_forward_or_roles():
    class Named(dspy.Module):
        def __init__(self):
            super().__init__()
            self.solve = dspy.Predict("question, context -> answer")

        def forward(self, question, hint=""):
            return self.solve(question=question, context=hint)

    spec = program_inputs(Named())
    assert spec.fields == ("question", "hint") and spec.required == {"question"}


def test_concurrent_clients_batch_and_get_single_request_answers(compiled):
    """16 client threads against a real server for a few seconds: no errors, greedy answers equal to the lone
    requests', and the engine generated requests of different clients together."""
    engine = compiled.engine
    prompts = [MESSAGES, [{"role": "user", "content": "Name a color."}]]
    chat_jobs = [(model, msgs, alone(engine, adapter, msgs).text)
                 for model, adapter in (("voter", "voters"), ("aggregator", None), ("tiny", None))
                 for msgs in prompts]
    program_jobs = [(q, dict(compiled(question=q).items())) for q in QUESTIONS]
    batches_before = len(engine.stats["batch_sizes"])
    errors: list[str] = []
    done = {"chat": 0, "program": 0}
    lock = threading.Lock()
    n_clients, seconds = 16, 5.0

    def client_loop(index: int, url: str, deadline: float) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            k = index
            while time.monotonic() < deadline:
                k += 1
                try:
                    if k % 3 == 0:
                        question, want = program_jobs[k % len(program_jobs)]
                        r = http.post("/v1/programs/Voting", json={"inputs": {"question": question}})
                        ok = r.status_code == 200 and r.json()["outputs"] == want
                        kind = "program"
                    else:
                        model, msgs, want = chat_jobs[k % len(chat_jobs)]
                        r = http.post("/v1/chat/completions",
                                      json={"model": model, "messages": msgs, "temperature": 0, "max_tokens": 8})
                        ok = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
                        kind = "chat"
                    with lock:
                        if ok:
                            done[kind] += 1
                        else:
                            errors.append(f"{kind} {r.status_code}: {r.text[:300]}")
                except Exception as exc:  # a transport failure is a failure of the server too
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")

    with ServerThread(create_app(compiled)) as server:
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=client_loop, args=(i, server.url, deadline)) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors[:5]
    assert done["chat"] >= n_clients and done["program"] >= 1, done
    assert max(engine.stats["batch_sizes"][batches_before:]) > 1, "concurrent requests were never batched"


def test_cli_serve_bad_directory_is_a_clean_error(tmp_path, capsys, monkeypatch):
    assert main(["serve", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wfc: error:") and "not a wfc artifact" in err and "Traceback" not in err
    monkeypatch.delenv("MY_KEY", raising=False)
    assert main(["serve", str(tmp_path), "--api-key-env", "MY_KEY"]) == 2
    assert "MY_KEY" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--port", "70000"]) == 2
