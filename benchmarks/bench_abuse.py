"""Benchmark: `wfc serve` under hostile clients beside normal ones: requests held, answers per kind, correctness.

Starts the server (uvicorn on a background thread, a free local port) on an artifact and, for ``--seconds``, runs
normal clients (greedy chat requests on the artifact's roles, each answer compared with the same request generated
alone on the engine) beside hostile clients of each kind, ``--hostile`` threads per kind:

- ``oversize``: a body of twice ``--max-body-bytes`` with its Content-Length (expected 413);
- ``chunked_oversize``: the same body sent chunked, without a Content-Length (413);
- ``huge_prompt``: a prompt of ~20k tokens in a body under the size limit (400: over the prompt-token limit);
- ``slowloris``: a valid body announced by its Content-Length and sent one byte every 0.2 s (408 after
  ``--body-timeout``);
- ``disconnect``: a valid request whose client hangs up 50 ms after sending it (no answer to read; the server must
  give the slot back);
- ``malformed_json``: a body that is not JSON (422); ``wrong_types``: JSON with fields of the wrong type (422).

It reports, per kind, the answers by status (``unexpected`` counts those outside the expected set), the normal
clients' latency and wrong answers, the most requests the server held at once (working and waiting, from
``/v1/stats``), what it still holds at the end (must be none), and whether it still answers afterwards.

    python -m benchmarks.bench_abuse --model tiny --seconds 20 --normal 8 --hostile 2 --json bench_abuse.json
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import select
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse


EXPECTED = {"oversize": {413}, "chunked_oversize": {413}, "huge_prompt": {400}, "slowloris": {408},
            "disconnect": {"hung_up"}, "malformed_json": {422}, "wrong_types": {422}}


def normal_jobs(engine, roles: dict[str, str | None], *, max_tokens: int = 8) -> list[tuple[dict, str]]:
    """(request body, expected text): greedy chat requests on each role, their answers generated alone."""
    from wfc.engines.base import GenerationRequest, SamplingParams

    jobs = []
    for model, adapter in roles.items():
        for question in ("What is 2 + 3?", "Name a color.", "Say hello."):
            messages = [{"role": "user", "content": question}]
            (gen,) = engine.generate([GenerationRequest(messages=tuple(messages), adapter=adapter,
                                                        sampling=SamplingParams(temperature=0.0,
                                                                                max_tokens=max_tokens))])
            jobs.append(({"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens},
                         gen.text))
    return jobs


def _raw(url: str, head: str, body: bytes, *, dribble_s: float | None = None, hang_up_s: float | None = None,
         timeout_s: float = 60.0):
    """Send an HTTP/1.1 request over a bare socket; returns the status code, or "hung_up" / "closed"."""
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s) as sock:
        sock.sendall(head.encode() + b"\r\n")
        try:
            if dribble_s is None:
                sock.sendall(body)
            else:
                for i in range(len(body)):
                    if select.select([sock], [], [], 0)[0]:
                        break  # the server answered before the body was complete: read it below
                    sock.sendall(body[i:i + 1])
                    time.sleep(dribble_s)
        except OSError:  # the server gave up on us first: read its answer below
            pass
        if hang_up_s is not None:
            time.sleep(hang_up_s)
            return "hung_up"
        try:
            data = sock.recv(4096)
        except OSError:
            return "closed"
        if not data:
            return "closed"
        return int(data.split(b" ", 2)[1])


def _head(path: str, length: int) -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n")


def hostile_request(kind: str, url: str, http, *, model: str, max_body_bytes: int):
    """One request of a hostile ``kind``; returns its status code (or "hung_up" / "closed" / an exception name)."""
    chat = "/v1/chat/completions"
    valid = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                        "max_tokens": 32, "temperature": 0}).encode()
    if kind == "oversize":
        big = json.dumps({"model": model, "messages": [{"role": "user", "content": "x" * (2 * max_body_bytes)}]})
        return http.post(chat, content=big.encode(), headers={"Content-Type": "application/json"}).status_code
    if kind == "chunked_oversize":
        def chunks():
            for _ in range(2 * max_body_bytes // 65536 + 1):
                yield b"x" * 65536
        return http.post(chat, content=chunks(), headers={"Content-Type": "application/json"}).status_code
    if kind == "huge_prompt":
        text = "word " * 20000  # ~100 kB, ~20k tokens
        return http.post(chat, json={"model": model, "messages": [{"role": "user", "content": text}]}).status_code
    if kind == "slowloris":
        return _raw(url, _head(chat, len(valid)), valid, dribble_s=0.2)
    if kind == "disconnect":
        return _raw(url, _head(chat, len(valid)), valid, hang_up_s=0.05)
    if kind == "malformed_json":
        return http.post(chat, content=b'{"model": "x", "messages": [', headers={"Content-Type": "application/json"}
                         ).status_code
    if kind == "wrong_types":
        return http.post(chat, json={"model": 7, "messages": "hi", "max_tokens": "lots", "n": [1]}).status_code
    raise ValueError(f"unknown hostile kind {kind!r}; pick one of {sorted(EXPECTED)}")


def run_abuse(url: str, *, jobs: list[tuple[dict, str]], seconds: float, normal: int, hostile: int,
              max_body_bytes: int, kinds=tuple(EXPECTED)) -> dict:
    """Normal and hostile clients against the server at ``url`` for ``seconds``; returns the report."""
    import httpx

    lock = threading.Lock()
    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    latencies: list[float] = []
    wrong: list[str] = []
    refusals: list[str] = []  # the first few non-200 answers of normal clients, for the report
    deadline = time.monotonic() + seconds
    model = jobs[0][0]["model"]

    def normal_loop(index: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            k = index
            while time.monotonic() < deadline:
                k += 1
                body, want = jobs[k % len(jobs)]
                t0 = time.perf_counter()
                try:
                    r = http.post("/v1/chat/completions", json=body)
                    status = r.status_code
                    if status != 200 and len(refusals) < 5:
                        refusals.append(f"{status}: {r.text[:300]}")
                    if status == 200 and r.json()["choices"][0]["message"]["content"] != want:
                        with lock:
                            wrong.append(f"{body['model']}: {r.json()['choices'][0]['message']['content']!r} != "
                                         f"{want!r}")
                except Exception as exc:
                    status = type(exc).__name__
                with lock:
                    statuses["normal"][status] += 1
                    if status == 200:
                        latencies.append(time.perf_counter() - t0)

    def hostile_loop(kind: str) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while time.monotonic() < deadline:
                try:
                    status = hostile_request(kind, url, http, model=model, max_body_bytes=max_body_bytes)
                except Exception as exc:
                    status = type(exc).__name__
                with lock:
                    statuses[kind][status] += 1

    threads = [threading.Thread(target=normal_loop, args=(i,)) for i in range(normal)]
    threads += [threading.Thread(target=hostile_loop, args=(kind,)) for kind in kinds for _ in range(hostile)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    time.sleep(0.5)  # let the server notice the last hang-ups
    with httpx.Client(base_url=url, timeout=60) as http:
        stats = http.get("/v1/stats").json()
        body, want = jobs[0]
        after = http.post("/v1/chat/completions", json=body)
        answers_after = after.status_code == 200 and after.json()["choices"][0]["message"]["content"] == want
    ordered = sorted(latencies)

    def pct(q):
        return round(1000 * ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1) if ordered else None

    kinds_report = {kind: {"requests": sum(c.values()), "statuses": {str(k): v for k, v in sorted(c.items(), key=str)},
                           "unexpected": sum(v for k, v in c.items() if k not in EXPECTED.get(kind, {200}))}
                    for kind, c in statuses.items()}
    return {"wall_s": round(wall, 2), "kinds": kinds_report, "normal_wrong_answers": wrong, "normal_refusals": refusals,
            "normal_latency_ms": {"p50": pct(50), "p99": pct(99)},
            "held": {"max_active": stats["max_active"], "max_waiting": stats["max_waiting"],
                     "active_after": stats["active"], "waiting_after": stats["waiting"]},
            "server_outcomes": stats["outcomes"], "answers_after": answers_after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="base model of the artifact built for the run [tiny]")
    ap.add_argument("--seconds", type=float, default=20.0, help="duration [20]")
    ap.add_argument("--normal", type=int, default=8, help="normal client threads [8]")
    ap.add_argument("--hostile", type=int, default=2, help="threads per hostile kind [2]")
    ap.add_argument("--max-body-bytes", type=int, default=256 * 1024, help="the server's body limit [262144]")
    ap.add_argument("--body-timeout", type=float, default=2.0, help="the server's body timeout, s [2]")
    ap.add_argument("--request-timeout", type=float, default=60.0, help="the server's request timeout, s [60]")
    ap.add_argument("--max-concurrent", type=int, default=64, help="[64]")
    ap.add_argument("--max-queue", type=int, default=256, help="[256]")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    args = ap.parse_args()
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import wfc
    from benchmarks.bench_serve import build_artifact
    from wfc.engines.hf import HFEngine
    from wfc.serve import ServerThread, create_app
    from wfc.serve_limits import ServeLimits

    limits = ServeLimits(max_body_bytes=args.max_body_bytes, max_concurrent=args.max_concurrent,
                         max_queue=args.max_queue, request_timeout_s=args.request_timeout,
                         body_timeout_s=args.body_timeout)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_artifact(args.model, Path(tmp) / "art")
        engine = HFEngine(args.model)
        try:
            compiled = wfc.load(path, engine=engine)
            jobs = normal_jobs(engine, compiled.roles)
            with ServerThread(create_app(compiled, limits=limits)) as server:
                report = run_abuse(server.url, jobs=jobs, seconds=args.seconds, normal=args.normal,
                                   hostile=args.hostile, max_body_bytes=args.max_body_bytes)
        finally:
            engine.close()

    print(f"wfc serve on {args.model}: {args.seconds:g} s, {args.normal} normal clients, {args.hostile} per hostile "
          f"kind; limits {limits}")
    print(f"{'kind':<18} {'requests':>8} {'unexpected':>10}  statuses")
    for kind, row in sorted(report["kinds"].items()):
        print(f"{kind:<18} {row['requests']:>8} {row['unexpected']:>10}  {row['statuses']}")
    print(f"normal: wrong answers {len(report['normal_wrong_answers'])}, latency p50 "
          f"{report['normal_latency_ms']['p50']} ms, p99 {report['normal_latency_ms']['p99']} ms")
    for refusal in report["normal_refusals"]:
        print(f"  normal client refused: {refusal}")
    held = report["held"]
    print(f"held at most {held['max_active']} working + {held['max_waiting']} waiting; after: "
          f"{held['active_after']} working, {held['waiting_after']} waiting; server outcomes "
          f"{report['server_outcomes']}; answers after: {report['answers_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **report}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
