"""Benchmark: structured decoding on the embedded model (issue 45).

1. Format errors and accuracy of three uncompiled DSPy programs written as DSPy's tutorials write them, with and
   without structured decoding: ``ChainOfThought("question -> answer: int")``, a multi-hop loop
   (``programs.agents.MultiHop`` over a local corpus) and ``dspy.ReAct`` with calculator tools; 30 two-number
   addition questions, greedy, 96 new tokens a call.
2. Throughput of the HF engine at one batch (``--rows`` sampled ChainOfThought calls, T=1, seeded): decode
   steps x rows per second constrained and unconstrained, alternating, median over ``--repeats``; and the mask cost per
   row-token (the engine's ``mask_seconds``).
3. The grammar libraries on one JSON schema (the ReAct step's object): llguidance's and xgrammar's mask time per
   token over the same random walk.

    python benchmarks/bench_structured.py --out runs/bench_structured.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import dspy
import torch

from programs.agents import KeywordSearch, MultiHop, calculator_agent
from wfc.constrain import GrammarMasks, signature_grammar, unpack
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.engines.hf import HFEngine
from wfc.lower import Decoding, run_rollouts
from wfc.tasks.math import math_metric


def questions(n: int = 30, seed: int = 0) -> list[dspy.Example]:
    rnd = random.Random(seed)
    pairs = [(rnd.randint(1, 20), rnd.randint(1, 20)) for _ in range(n)]
    return [dspy.Example(question=f"What is {a} + {b}?", answer=str(a + b)).with_inputs("question") for a, b in pairs]


def programs() -> dict[str, dspy.Module]:
    corpus = [f"{a} plus {b} makes {a + b}." for a in range(1, 21, 3) for b in range(1, 21, 4)]
    return {"chain_of_thought": dspy.ChainOfThought("question -> answer: int"),
            "multi_hop": MultiHop(KeywordSearch(corpus)),
            "react": calculator_agent(max_iters=3)}


def format_errors(engine, examples) -> dict:
    out = {}
    for name, program in programs().items():
        for structured in (False, True):
            t0 = time.perf_counter()
            graphs = [gs[0] for gs in run_rollouts(program, examples, engine, decoding=Decoding(structured=structured),
                                                    sampling=SamplingParams(temperature=0.0, max_tokens=96))]
            calls = [c for g in graphs for c in g.calls]
            runs_failed = sum(g.status == "format_error" for g in graphs)
            acc = sum(math_metric(g.example and dspy.Example(**g.example), dspy.Prediction(**(g.outputs or {})))
                      if g.outputs and "answer" in g.outputs else 0.0 for g in graphs) / len(graphs)
            row = {"calls": len(calls), "call_format_errors": sum(c.status == "format_error" for c in calls),
                   "runs": len(graphs), "run_format_errors": runs_failed, "accuracy": round(acc, 3),
                   "seconds": round(time.perf_counter() - t0, 1)}
            out[f"{name}/{'structured' if structured else 'free'}"] = row
            print(name, "structured" if structured else "free", row, flush=True)
    return out


def throughput(engine, rows: int, repeats: int) -> dict:
    sig = dspy.ChainOfThought("question -> answer: int").predict.signature
    adapter = dspy.ChatAdapter()
    grammar = signature_grammar(sig, adapter, max_tokens=64, field_tokens=24)
    qs = questions(rows, seed=1)
    msgs = [tuple(adapter.format(sig, [], {"question": q.question})) for q in qs]
    sampling = SamplingParams(temperature=1.0, max_tokens=64)
    timing: dict[str, list[float]] = {"free": [], "structured": []}
    masks = []
    for r in range(repeats):
        for kind in ("free", "structured"):
            reqs = [GenerationRequest(messages=m, sampling=sampling, seed=1000 * r + i,
                                      grammar=grammar if kind == "structured" else None) for i, m in enumerate(msgs)]
            before = engine.stats.get("mask_seconds", 0.0)
            t0 = time.perf_counter()
            gens = engine.generate(reqs)
            wall = time.perf_counter() - t0
            steps = max(len(g.completion_ids) for g in gens)
            # decode steps x rows per second: one generate runs every row to the longest, so this is the engine's
            # rate at this batch whatever the rows' lengths (constrained rows end at EOS, free ones at the limit)
            timing[kind].append(rows * steps / wall)
            if kind == "structured":
                masks.append((engine.stats["mask_seconds"] - before) / (rows * steps))
    free, structured = statistics.median(timing["free"]), statistics.median(timing["structured"])
    return {"rows": rows, "row_steps_per_s_free": round(free, 1), "row_steps_per_s_structured": round(structured, 1),
            "ratio": round(structured / free, 3), "mask_us_per_row_token": round(1e6 * statistics.median(masks), 1)}


def libraries(tokenizer, steps: int = 400) -> dict:
    """Mask time per token of llguidance and xgrammar on one JSON schema, over the same random walk."""
    import xgrammar

    schema = {"type": "object", "properties": {"thought": {"type": "string", "maxLength": 64},
                                               "tool": {"enum": ["add", "subtract", "multiply", "divide", "finish"]},
                                               "args": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                         "b": {"type": "integer"}},
                                                        "required": ["a", "b"]}},
              "required": ["thought", "tool", "args"], "additionalProperties": False}
    llg = GrammarMasks(tokenizer)
    grammar = f"start: %json {json.dumps(schema)}"
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=llg.vocab_size)
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
    out = {}
    for name in ("llguidance", "xgrammar"):
        rnd = random.Random(0)
        spent, count = 0.0, 0
        while count < steps:
            if name == "llguidance":
                matcher, bitmask = llg.matcher(grammar), llg.new_bitmask(1)
            else:
                matcher, bitmask = xgrammar.GrammarMatcher(compiled), xgrammar.allocate_token_bitmask(1, llg.vocab_size)
            for _ in range(200):
                t0 = time.perf_counter()
                if name == "llguidance":
                    llg.fill(matcher, bitmask, 0)
                else:
                    matcher.fill_next_token_bitmask(bitmask, 0)
                spent += time.perf_counter() - t0
                count += 1
                allowed = unpack(bitmask, llg.vocab_size)[0].nonzero().flatten().tolist()
                token = allowed[0] if len(allowed) == 1 else rnd.choice(allowed[:500])
                if token == tokenizer.eos_token_id or matcher.is_terminated() if name == "xgrammar" else \
                        matcher.is_stopped():
                    break
                if name == "llguidance":
                    matcher.consume_token(token)
                else:
                    matcher.accept_token(token)
        out[f"{name}_us_per_token"] = round(1e6 * spent / count, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: errors, throughput, libraries")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    engine = HFEngine(args.model)
    result: dict = {"model": args.model}
    if "libraries" not in skip:
        result["libraries"] = libraries(engine.tokenizer)
        print(result["libraries"], flush=True)
    if "throughput" not in skip:
        result["throughput"] = throughput(engine, args.rows, args.repeats)
        print(result["throughput"], flush=True)
    if "errors" not in skip:
        result["format_errors"] = format_errors(engine, questions(args.n))
    engine.close()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
