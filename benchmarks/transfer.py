"""Transfer: does a compiled math artifact keep (or gain) accuracy on SVAMP, a task it never trained on?

Evaluates, greedy, on the first ``--n`` SVAMP problems: the uncompiled program the artifact was compiled from (its
roles on the bare base model, no demos) and the artifact itself (its demos and adapters). Prints both accuracies with
95% intervals and the paired difference (problems only one of them solved). SVAMP is evaluation only: never train on it.

    python benchmarks/transfer.py artifacts/math-voting --n 200        # needs WFC_DATA_DIR (or the hub) for SVAMP
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--trust-code", action="store_true", help="the artifact's program class ships as copied source")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    logging.getLogger("dspy").setLevel(logging.ERROR)

    import wfc
    from compilers import evaluate
    from compilers.score import paired_difference
    from wfc.lower import copy_program, roles
    from wfc.tasks import get_task

    task = get_task("svamp", n_test=args.n)
    t0 = time.time()
    compiled = wfc.load(args.artifact, trust_code=args.trust_code)
    max_tokens = compiled.manifest.sampling.get("max_tokens", 64)
    uncompiled = copy_program(compiled.program)
    for predictor in roles(uncompiled).values():
        predictor.demos = []  # the program as written: no demos, no adapters
    before = evaluate(uncompiled, task.testset, compiled.engine, metric=task.metric, adapters={},
                      max_tokens=max_tokens, progress="uncompiled")
    after = evaluate(compiled.program, task.testset, compiled.engine, metric=task.metric, adapters=compiled.roles,
                     max_tokens=max_tokens, progress="compiled")
    scores = lambda res: [float(g.reward) for g in res["graphs"]]  # noqa: E731
    pair = paired_difference(scores(before), scores(after))
    result = {"artifact": str(args.artifact), "n": len(task.testset), "uncompiled": before["accuracy"],
              "uncompiled_interval": before["interval"], "compiled": after["accuracy"],
              "compiled_interval": after["interval"], "difference": pair["difference"], "interval": pair["interval"],
              "only_compiled": pair["only_after"], "only_uncompiled": pair["only_before"],
              "seconds": round(time.time() - t0, 1)}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
