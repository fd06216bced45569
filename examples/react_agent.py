"""A ReAct agent with calculator tools (``programs.agents.calculator_agent``) compiled on two-step arithmetic.

Every step's tool call is decoded under a grammar with one branch per tool (``wfc.constrain``): the tool name is a
real tool and its arguments validate against that tool's schema, so every call parses and each run's answer is
scored. Prints the baseline, the compiled accuracy (held-out, greedy, with 95% intervals) and the share of tool
calls that named a real tool with arguments that validate; writes ``runs/<name>/summary.json``.

    python examples/react_agent.py --seed 0
    python examples/react_agent.py --seed 0 --resume   # continue a killed run from its checkpoint
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from compilers import MMGRPO, evaluate
from compilers.checkpoint import find
from compilers.recipes import get_recipe
from programs.agents import calculator_agent
from wfc.engines.hf import HFEngine
from wfc.flags import add_set_flag, apply_overrides, parse_set
from wfc.tasks import get_task
from wfc.tasks.math import math_metric

TOOLS = {"add", "subtract", "multiply", "divide", "finish"}


def tool_calls(graphs) -> tuple[int, int]:
    """(tool calls, those naming a real tool with a dict of arguments) over the agent's ``react`` calls."""
    steps = [c.outputs for g in graphs for c in g.calls if c.role == "react" and c.outputs]
    return len(steps), sum(s["next_tool_name"] in TOOLS and isinstance(s["next_tool_args"], dict) for s in steps)


def baseline(agent, task, engine, max_tokens: int, path: Path, *, reuse: bool) -> dict:
    """The uncompiled agent's held-out accuracy and interval; a resumed run reads the one its first start wrote
    (the baseline is greedy and seeded, so evaluating it again would only repeat half an hour of CPU)."""
    if reuse and path.exists():
        return json.loads(path.read_text())
    res = evaluate(agent, task.testset, engine, metric=math_metric, adapters={}, max_tokens=max_tokens,
                   progress="baseline")
    base = {"accuracy": res["accuracy"], "interval": res["interval"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(base))
    tmp.replace(path)
    return base


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--model", default="smollm2-135m", help="the base model (tests: tiny)")
    ap.add_argument("--run-name", default=None, help="runs/<name> (default react-seed<SEED>)")
    ap.add_argument("--resume", action="store_true",
                    help="continue runs/<name> (a killed run): its baseline and, once written, its checkpoint")
    add_set_flag(ap, what="recipe field")
    args = ap.parse_args(argv)
    try:
        overrides = parse_set(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    run_dir = Path("runs") / (args.run_name or f"react-seed{args.seed}")
    task = get_task("arithmetic", n_train=400, n_val=64, n_test=args.n_test, seed=1, steps=2, max_operand=20)
    engine = HFEngine(args.model)
    agent = calculator_agent(max_iters=3)
    t0 = time.time()
    base = baseline(agent, task, engine, args.max_tokens, run_dir / "baseline.json", reuse=args.resume)
    recipe = apply_overrides({**get_recipe("wide-warmup"), "max_tokens": args.max_tokens, "steps": args.steps,
                              "seed": args.seed}, overrides)
    compiled = MMGRPO(math_metric, **recipe).compile(agent, trainset=task.trainset, valset=task.valset,
                                                     engine=engine, run_dir=run_dir,
                                                     resume=run_dir if args.resume and find(run_dir) else None)
    after = evaluate(compiled.program, task.testset, engine, metric=math_metric, adapters=compiled.roles,
                     max_tokens=args.max_tokens, progress="held-out")
    calls, real = tool_calls(after["graphs"])
    summary = {"seed": args.seed, "overrides": overrides, "baseline": base["accuracy"],
               "baseline_interval": base["interval"], "compiled": after["accuracy"],
               "compiled_interval": after["interval"], "gain": after["accuracy"] - base["accuracy"],
               "tool_calls": calls, "real_tool_calls": real, "minutes": round((time.time() - t0) / 60, 1)}
    print(json.dumps(summary))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
