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
import time
from pathlib import Path

import wfc
from compilers import transfer
from wfc.tasks import get_task


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--trust-code", action="store_true", help="the artifact's program class ships as copied source")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    logging.getLogger("dspy").setLevel(logging.ERROR)

    task = get_task("svamp", n_test=args.n)
    t0 = time.time()
    compiled = wfc.load(args.artifact, trust_code=args.trust_code)
    try:
        result = {"artifact": str(args.artifact), **transfer.measure(compiled, task.testset, task.metric),
                  "seconds": round(time.time() - t0, 1)}
    finally:
        compiled.engine.close()
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
