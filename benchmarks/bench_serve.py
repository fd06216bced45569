"""Benchmark: `wfc serve` under concurrent clients: requests/s, completion tokens/s, latency p50/p90/p99.

Starts the server (uvicorn on a background thread, a free local port) on an artifact, then for each client count
drives it with that many threads for ``--seconds``: each client loops, sending a chat completion to one of the
artifact's roles or a whole workflow run (``--program-share`` of the requests), each with a distinct question so the
engine's greedy de-duplication does not flatter the figures. A request counts as an error unless it returns 200.
Program runs ask for their rollout graph to count their completion tokens. Without ``--artifact`` a small Voting
artifact (n=2, one random LoRA on the voter role) is built on ``--model`` in a temporary directory.

    python benchmarks/bench_serve.py --model tiny --clients 1,16 --seconds 10 --json bench_serve.json
    python benchmarks/bench_serve.py --artifact artifacts/math-voting --engine hf --clients 16
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path


def build_artifact(model: str, out: Path) -> Path:
    """A Voting (n=2) artifact on ``model``: the voter role on a random non-zero LoRA, the aggregator on the base."""
    import dspy
    import torch
    from peft import LoraConfig

    from programs import Voting
    from wfc.artifact import CompiledProgram, Manifest
    from wfc.engines.hf import HFEngine

    engine = HFEngine(model)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            engine.policy.add_adapter("voters", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        manifest = Manifest(name="Voting", base_model=model, base_model_checksum=engine.handle.checksum,
                            program_class="programs.voting:Voting", roles={"voter": "voters", "aggregator": None})
        program = Voting(dspy.Signature("question -> answer", "Answer the question."), n=2)
        return CompiledProgram(program, engine, manifest).save(out)
    finally:
        engine.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def drive(url: str, *, program: str, roles: list[str], input_field: str, clients: int, seconds: float,
          program_share: float, max_tokens: int, temperature: float) -> list[dict]:
    """``clients`` threads sending requests for ``seconds``; one record per request (kind, ok, latency, tokens)."""
    import httpx

    records: list[dict] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    every = round(1 / program_share) if program_share > 0 else 0

    def loop(index: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as http:
            k = 0
            while time.monotonic() < deadline:
                k += 1
                question = f"What is {index} plus {k}?"
                t0 = time.perf_counter()
                try:
                    if every and k % every == 0:
                        kind = "program"
                        r = http.post(f"/v1/programs/{program}",
                                      json={"inputs": {input_field: question}, "return_graph": True})
                        tokens = sum(c["completion_tokens"] for c in r.json()["graph"]["calls"]) if r.is_success else 0
                    else:
                        kind = "chat"
                        r = http.post("/v1/chat/completions", json={
                            "model": roles[k % len(roles)], "messages": [{"role": "user", "content": question}],
                            "temperature": temperature, "max_tokens": max_tokens})
                        tokens = r.json()["usage"]["completion_tokens"] if r.is_success else 0
                    ok, status = r.status_code == 200, r.status_code
                except Exception as exc:  # a transport failure counts as an error, the run goes on
                    kind, ok, status, tokens = "error", False, type(exc).__name__, 0
                with lock:
                    records.append({"kind": kind, "ok": ok, "status": status, "latency_s": time.perf_counter() - t0,
                                    "completion_tokens": tokens})

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for r in records:
        r["wall_s"] = wall
    return records


def summarize(records: list[dict], kind: str | None) -> dict:
    rows = [r for r in records if kind is None or r["kind"] == kind]
    wall = records[0]["wall_s"] if records else float("nan")
    lat = [r["latency_s"] * 1000 for r in rows if r["ok"]]
    return {"requests": len(rows), "errors": sum(not r["ok"] for r in rows), "wall_s": round(wall, 2),
            "req_s": round(sum(r["ok"] for r in rows) / wall, 2),
            "tok_s": round(sum(r["completion_tokens"] for r in rows) / wall, 1),
            "p50_ms": round(percentile(lat, 50), 1), "p90_ms": round(percentile(lat, 90), 1),
            "p99_ms": round(percentile(lat, 99), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", default=None, help="artifact directory [build a small one on --model]")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--model", default=None,
                    help="base model to build on [tiny], or where to load --artifact's base from [its manifest's]")
    ap.add_argument("--clients", default="16", help="comma-separated client counts, one run each [16]")
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of each run [10]")
    ap.add_argument("--program-share", type=float, default=0.25, help="share of requests that are workflow runs")
    ap.add_argument("--max-tokens", type=int, default=16, help="max_tokens of chat requests [16]")
    ap.add_argument("--temperature", type=float, default=0.0, help="temperature of chat requests [0]")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the figures as JSON")
    args = ap.parse_args()
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import httpx

    import wfc
    from wfc.engines import make_engine
    from wfc.serve import ServerThread, create_app, program_inputs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.artifact) if args.artifact else build_artifact(args.model or "tiny", Path(tmp) / "art")
        manifest = wfc.artifact.read_manifest(path)
        engine = make_engine(args.engine, args.model or manifest.base_model)
        try:
            compiled = wfc.load(path, engine=engine)
            roles = list(manifest.roles)
            field = program_inputs(compiled.program).fields[0]
            results = []
            with ServerThread(create_app(compiled)) as server:
                httpx.post(f"{server.url}/v1/programs/{manifest.name}", json={"inputs": {field: "warm up"}},
                           timeout=300)
                for clients in [int(c) for c in args.clients.split(",")]:
                    calls0 = len(engine.stats["batch_sizes"]) if hasattr(engine, "stats") else 0
                    records = drive(server.url, program=manifest.name, roles=roles, input_field=field,
                                    clients=clients, seconds=args.seconds, program_share=args.program_share,
                                    max_tokens=args.max_tokens, temperature=args.temperature)
                    batches = engine.stats["batch_sizes"][calls0:] if hasattr(engine, "stats") else []
                    results.append({"clients": clients, "all": summarize(records, None),
                                    "chat": summarize(records, "chat"), "program": summarize(records, "program"),
                                    "generate_calls": len(batches),
                                    "mean_batch": round(statistics.mean(batches), 2) if batches else None,
                                    "max_batch": max(batches) if batches else None})
        finally:
            engine.close()

    header = (f"{'clients':>7} {'kind':<8} {'requests':>8} {'errors':>6} {'req/s':>7} {'tok/s':>8} "
              f"{'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    print(f"artifact {args.artifact or '(built: Voting n=2)'} on {manifest.base_model}, engine {args.engine}, "
          f"{args.seconds:g} s per run, chat max_tokens {args.max_tokens}, T={args.temperature:g}")
    print(header)
    for res in results:
        for kind in ("chat", "program", "all"):
            s = res[kind]
            print(f"{res['clients']:>7} {kind:<8} {s['requests']:>8} {s['errors']:>6} {s['req_s']:>7.2f} "
                  f"{s['tok_s']:>8.1f} {s['p50_ms']:>8.1f} {s['p90_ms']:>8.1f} {s['p99_ms']:>8.1f}")
        print(f"{'':>7} engine: {res['generate_calls']} generate calls, mean batch {res['mean_batch']}, "
              f"max batch {res['max_batch']}")
    if args.json:
        payload = {"artifact": args.artifact, "model": manifest.base_model,
                   "engine": args.engine, "seconds": args.seconds, "max_tokens": args.max_tokens,
                   "temperature": args.temperature, "program_share": args.program_share, "runs": results}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
