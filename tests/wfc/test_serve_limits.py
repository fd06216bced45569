"""``wfc serve`` under abuse, on the tiny real model and a real uvicorn server: body and prompt limits, the bounded
queue, timeouts, disconnects, engine failures, bounded statistics, OpenAI streaming, and a short hostile load test.

Engines here are the real one; where a fault must be injected (a slow engine, a failing one) a wrapper holds or
fails requests around it and every other request still reaches the real engine."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from concurrent.futures import Future, InvalidStateError
from pathlib import Path

import dspy
import httpx
import pytest
from fastapi.testclient import TestClient

from wfc.artifact import CompiledProgram, Manifest
from wfc.cli import main
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.serve import ServerThread, create_app, text_pieces
from wfc.serve_limits import ServeLimits, ServeStats

SIG = dspy.Signature("question -> answer", "Answer the question.")
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
ROOT = Path(__file__).resolve().parents[2]


def compiled_on(engine) -> CompiledProgram:
    from programs import Voting

    manifest = Manifest(name="Voting", base_model="tiny", base_model_checksum=engine.handle.checksum,
                        program_class="programs.voting:Voting", roles={"voter": None, "aggregator": None},
                        sampling={"temperature": 0.0, "max_tokens": 8})
    return CompiledProgram(Voting(SIG, n=2), engine, manifest)


def alone(engine, messages=MESSAGES, sampling=GREEDY):
    (gen,) = engine.generate([GenerationRequest(messages=tuple(messages), sampling=sampling)])
    return gen


def chat_body(content="What is 2 + 3?", **kw):
    return {"model": "voter", "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 8,
            **kw}


class HeldEngine:
    """Fault injection, a stuck engine: each request waits for ``release`` before it reaches the real engine; a
    request whose future was cancelled meanwhile never reaches it (``reached`` lists those that did)."""

    def __init__(self, engine):
        self.engine, self.release = engine, threading.Event()
        self.futures: list[Future] = []
        self.reached: list[GenerationRequest] = []

    def submit(self, request):
        outer: Future = Future()
        self.futures.append(outer)

        def run():
            self.release.wait(60)
            if outer.cancelled():
                return
            self.reached.append(request)
            try:
                outer.set_result(self.engine.submit(request).result())
            except InvalidStateError:
                pass

        threading.Thread(target=run, daemon=True).start()
        return outer

    def __getattr__(self, name):
        return getattr(self.engine, name)


class FailingEngine:
    """Fault injection, a failing engine: a request whose last message says "boom" raises; the rest are real."""

    def __init__(self, engine):
        self.engine = engine

    def submit(self, request):
        if "boom" in request.messages[-1]["content"]:
            future: Future = Future()
            future.set_exception(RuntimeError("CUDA error: device on fire"))
            return future
        return self.engine.submit(request)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def stats(url):
    return httpx.get(f"{url}/v1/stats").json()


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.02)


def raw_request(url: str, head: bytes, body: bytes, *, timeout_s: float = 10.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head + body)
        return sock.recv(4096)


# ----- body and prompt limits -----------------------------------------------------------------------------------------
def test_body_limit_is_413_before_the_body_is_read(tiny_engine):
    limits = ServeLimits(max_body_bytes=4096, body_timeout_s=5.0)
    with ServerThread(create_app(compiled_on(tiny_engine), limits=limits)) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        big = json.dumps({"inputs": {"question": "x" * 5000}}).encode()
        for path in ("/v1/chat/completions", "/v1/programs/Voting"):
            r = http.post(path, content=big, headers={"Content-Type": "application/json"})
            error = r.json()["error"]
            assert r.status_code == 413 and error["code"] == "request_too_large", r.text
            assert "at most 4096 bytes" in error["message"] and error["type"] == "invalid_request_error"
            # no Content-Length (chunked): the bytes are counted as they arrive
            r = http.post(path, content=iter([b"x" * 3000] * 2), headers={"Content-Type": "application/json"})
            assert r.status_code == 413, r.text
        # announce 1 GB and send 10 bytes: the refusal comes at once, not after the body
        t0 = time.perf_counter()
        answer = raw_request(server.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                         b"application/json\r\nContent-Length: 1000000000\r\n\r\n", b"{" * 10)
        assert answer.startswith(b"HTTP/1.1 413") and time.perf_counter() - t0 < 3
        assert http.post("/v1/chat/completions", json=chat_body()).status_code == 200  # a small body passes
        assert stats(server.url)["outcomes"]["body_too_large"] == 5


def test_slow_body_is_408_and_holds_no_slot(tiny_engine):
    limits = ServeLimits(body_timeout_s=0.5)
    with ServerThread(create_app(compiled_on(tiny_engine), limits=limits)) as server:
        body = json.dumps(chat_body()).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        answer = raw_request(server.url, head, body[:5])  # the rest never comes: a slow-loris client
        assert answer.startswith(b"HTTP/1.1 408") and b"0.5 s" in answer
        view = stats(server.url)
        assert view["outcomes"]["body_timeout"] == 1 and view["max_active"] == 0 and view["max_waiting"] == 0


def test_prompt_token_limit_is_400_on_chat_and_programs(tiny_engine):
    client = TestClient(create_app(compiled_on(tiny_engine), limits=ServeLimits(max_prompt_tokens=50)))
    long = "word " * 100
    count = len(tiny_engine.encode_prompt([{"role": "user", "content": long}]))
    r = client.post("/v1/chat/completions", json=chat_body(long))
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "prompt_too_long", r.text
    assert f"the prompt is {count} tokens" in error["message"] and "at most 50" in error["message"]
    r = client.post("/v1/programs/Voting", json={"inputs": {"question": long}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long", r.text
    assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
    # by default the limit is the model's context (2048 for tiny), counting max_tokens too
    client = TestClient(create_app(compiled_on(tiny_engine)))
    r = client.post("/v1/chat/completions", json=chat_body("word " * 1500, max_tokens=1000))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert "context of 2048" in r.json()["error"]["message"]
    assert client.get("/v1/stats").json()["limits"]["max_prompt_tokens"] == 2048
    with pytest.raises(ValueError, match="context of 2048"):
        create_app(compiled_on(tiny_engine), limits=ServeLimits(max_prompt_tokens=4096))


# ----- queue, timeout, disconnect, engine failure ---------------------------------------------------------------------
def test_full_queue_is_429_with_retry_after(tiny_engine):
    held = HeldEngine(tiny_engine)
    want = alone(tiny_engine).text
    with ServerThread(create_app(compiled_on(held), limits=ServeLimits(max_concurrent=1, max_queue=1))) as server:
        answers = []
        clients = [threading.Thread(target=lambda: answers.append(httpx.post(
            f"{server.url}/v1/chat/completions", json=chat_body(), timeout=60))) for _ in range(2)]
        for t in clients:
            t.start()
        wait_for(lambda: stats(server.url)["active"] == 1 and stats(server.url)["waiting"] == 1)
        program = {"inputs": {"question": "x"}}
        for path, body in (("/v1/chat/completions", chat_body()), ("/v1/programs/Voting", program)):
            r = httpx.post(f"{server.url}{path}", json=body)
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", r.text
            assert int(r.headers["Retry-After"]) >= 1
        held.release.set()
        for t in clients:
            t.join(60)
        assert [(r.status_code, r.json()["choices"][0]["message"]["content"]) for r in answers] == [(200, want)] * 2
        view = stats(server.url)
        assert view["outcomes"]["queue_full"] == 2 and (view["active"], view["waiting"]) == (0, 0)


def test_timeout_is_504_and_withdraws_the_work(tiny_engine):
    held = HeldEngine(tiny_engine)
    with ServerThread(create_app(compiled_on(held), limits=ServeLimits(request_timeout_s=0.5))) as server:
        t0 = time.perf_counter()
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(), timeout=30)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout" and time.perf_counter() - t0 < 5
        r = httpx.post(f"{server.url}/v1/programs/Voting", json={"inputs": {"question": "x"}}, timeout=30)
        assert r.status_code == 504, r.text
        view = stats(server.url)
        assert view["outcomes"]["timeout"] == 2 and (view["active"], view["waiting"]) == (0, 0)
        assert held.futures and all(f.cancelled() for f in held.futures)
        held.release.set()
        time.sleep(0.2)
        assert held.reached == []  # the abandoned calls never reached the engine
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(), timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == alone(tiny_engine).text


def test_a_client_that_disconnects_frees_its_slot(tiny_engine):
    held = HeldEngine(tiny_engine)
    with ServerThread(create_app(compiled_on(held), limits=ServeLimits(max_concurrent=1, max_queue=0))) as server:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(), timeout=0.5)
        wait_for(lambda: stats(server.url)["active"] == 0, timeout_s=3)
        assert stats(server.url)["outcomes"]["disconnected"] == 1 and held.futures[0].cancelled()
        answers = []
        client = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{server.url}/v1/chat/completions", json=chat_body(), timeout=60)))
        client.start()
        wait_for(lambda: stats(server.url)["active"] == 1)  # the freed slot serves the next client
        held.release.set()
        client.join(60)
        assert answers[0].status_code == 200 and held.reached == [held.reached[0]]


def test_engine_failure_is_503_and_the_server_stays_up(tiny_engine):
    with ServerThread(create_app(compiled_on(FailingEngine(tiny_engine)))) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        for _ in range(2):
            r = http.post("/v1/chat/completions", json=chat_body("boom"))
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_error", r.text
            assert "device on fire" in r.json()["error"]["message"]
            r = http.post("/v1/programs/Voting", json={"inputs": {"question": "boom"}})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_error", r.text
            r = http.post("/v1/chat/completions", json=chat_body())
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == alone(tiny_engine).text
        assert http.post("/v1/programs/Voting", json={"inputs": {"question": "What is 1 + 1?"}}).status_code == 200
        assert stats(server.url)["outcomes"]["engine_error"] == 4


def test_stats_are_bounded_counters(tiny_engine):
    ring = ServeStats(ring=8)
    for i in range(10_000):
        ring.latencies.append(i / 1000)
    assert len(ring.latencies) == 8 and ring.latency_ms(50) == pytest.approx(9996.0, abs=1)
    client = TestClient(create_app(compiled_on(tiny_engine)))
    for _ in range(3):
        client.post("/v1/chat/completions", json=chat_body())
    client.post("/v1/chat/completions", content=b"{nope", headers={"Content-Type": "application/json"})
    view = client.get("/v1/stats").json()
    assert view["statuses"]["200"] == 3 and view["statuses"]["422"] == 1 and view["latency_ms"]["window"] == 3
    assert client.get("/health").json()["load"] == {"active": 0, "waiting": 0, "max_concurrent": 64, "max_queue": 256}


# ----- streaming ------------------------------------------------------------------------------------------------------
def test_stream_with_the_openai_sdk_equals_the_whole_answer(tiny_engine):
    openai = pytest.importorskip("openai")
    want = alone(tiny_engine)
    with ServerThread(create_app(compiled_on(tiny_engine))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        chunks = list(client.chat.completions.create(model="voter", messages=MESSAGES, temperature=0, max_tokens=8,
                                                     stream=True, stream_options={"include_usage": True}))
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(deltas) == want.text and len(deltas) > 1  # one delta per token, not one blob
        assert deltas == text_pieces(want.text, want.completion_ids, tiny_engine.tokenizer)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason
        assert chunks[-1].usage.completion_tokens == len(want.completion_ids) and not chunks[-1].choices
        # the wire format: data lines, text/event-stream, ending with [DONE]; n choices by index
        with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                          json={**chat_body(), "stream": True, "n": 2}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
        assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert {e["object"] for e in events} == {"chat.completion.chunk"}
        for i in range(2):
            assert "".join(e["choices"][0]["delta"].get("content", "") for e in events
                           if e["choices"][0]["index"] == i) == want.text
        # errors before the stream starts are plain JSON errors
        r = httpx.post(f"{server.url}/v1/chat/completions", json={**chat_body(), "stream": True, "model": "gpt-4"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


# ----- everything at once ---------------------------------------------------------------------------------------------
def test_hostile_clients_beside_normal_ones(tiny_engine):
    """benchmarks/bench_abuse.py for a few seconds: every hostile request gets its expected refusal, normal clients
    get their single-request answers, nothing stays held, and the server answers afterwards."""
    spec = importlib.util.spec_from_file_location("bench_abuse", ROOT / "benchmarks" / "bench_abuse.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    compiled = compiled_on(tiny_engine)
    jobs = bench.normal_jobs(tiny_engine, compiled.roles)
    # 2 s for a body: the chunked oversize client streams its first 256 kB in a thread that shares the GIL with the
    # server and four generating clients; at 0.5 s a loaded 2-core machine once got 408 (too slow) before 413
    limits = ServeLimits(max_body_bytes=256 * 1024, body_timeout_s=2.0, request_timeout_s=30)
    with ServerThread(create_app(compiled, limits=limits)) as server:
        report = bench.run_abuse(server.url, jobs=jobs, seconds=4.0, normal=4, hostile=1,
                                 max_body_bytes=limits.max_body_bytes)
    kinds = report["kinds"]
    assert set(kinds) == set(bench.EXPECTED) | {"normal"}, kinds
    assert {k: v["unexpected"] for k, v in kinds.items()} == {k: 0 for k in kinds}, kinds
    assert all(v["requests"] >= 1 for v in kinds.values()) and kinds["normal"]["statuses"]["200"] >= 4, kinds
    assert report["normal_wrong_answers"] == [] and report["normal_refusals"] == []
    assert report["held"]["active_after"] == 0 and report["held"]["waiting_after"] == 0, report["held"]
    assert report["server_outcomes"]["disconnected"] >= 1 and report["answers_after"]


# ----- pieces ---------------------------------------------------------------------------------------------------------
def test_a_cancelled_request_is_dropped_by_the_batching_engine(tiny_handle):
    from wfc.engines.hf import HFEngine

    engine = HFEngine(tiny_handle, batch_wait_s=0.5)
    try:
        request = GenerationRequest(messages=tuple(MESSAGES), sampling=GREEDY)
        withdrawn = engine.submit(request)
        assert withdrawn.cancel()  # still queued: the worker is collecting its batch
        kept = engine.submit(request.model_copy(update={"messages": ({"role": "user", "content": "Hi"},)}))
        assert kept.result(timeout=60).completion_ids and engine.stats["rows"] == 1
    finally:
        engine.close()


def test_cli_rejects_bad_limits(tmp_path, capsys):
    assert main(["serve", str(tmp_path), "--request-timeout", "0"]) == 2
    assert "request_timeout_s must be > 0" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--max-queue", "-1"]) == 2
