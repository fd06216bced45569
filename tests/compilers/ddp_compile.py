"""One compile of a small program on a scripted engine and the tiny policy, for the data-parallel test.

``python -m torch.distributed.run --standalone --nproc_per_node N tests/compilers/ddp_compile.py OUT RUN_DIR`` runs it
on N ranks (gloo on the CPU); ``train(OUT, RUN_DIR)`` runs it in one process. Each rank writes ``OUT/rank<r>.pt``:
the adapters' initial (step-0 revision) and final tensors. The scripted answer is a pure function of the request
and of how often this engine has been asked that prompt with sampling: the same in one process and on N ranks,
because each example (each prompt) is rolled out on exactly one rank. Greedy (validation) requests get one answer.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import dspy
import torch

ANSWERS = ("a", "ab", "abc")  # rewards 1/3, 2/3, 1: every group has spread
SIG = dspy.Signature("question -> answer", "Answer the question.")
TRAIN = [dspy.Example(question=f"What is {a} plus {b}?", answer=str(a + b)).with_inputs("question")
         for a in range(3) for b in range(2)]


def metric(example, prediction, trace=None):
    return min(len(str(prediction.answer)), 3) / 3.0


def script():
    seen: Counter = Counter()
    lock = threading.Lock()

    def answer(request) -> str:
        if request.sampling.greedy:
            return "ab"
        key = request.messages[-1]["content"]
        with lock:
            n, seen[key] = seen[key], seen[key] + 1
        return ANSWERS[n % len(ANSWERS)]

    return answer


def train(out: str | Path, run_dir: str | Path, *, distributed=None) -> dict:
    from compilers import MMGRPO
    from programs import Single
    from wfc.engines.fake import ScriptedEngine
    from wfc.policy import Policy

    policy = Policy("tiny", device="cpu")
    engine = ScriptedEngine(script(), tokenizer=policy.tokenizer)
    config = dict(steps=2, examples_per_step=2, group_size=3, max_tokens=6, eval_every=1, learning_rate=5e-3,
                  keep="last", cliff_guard=False, seed=3,
                  lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    compiled = MMGRPO(metric, **config).compile(Single(SIG), trainset=TRAIN, valset=TRAIN[:3], engine=engine,
                                                policy=policy, run_dir=run_dir, progress=False,
                                                distributed=distributed)
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    result = {"initial": compiled.revisions[0], "final": {a: policy.adapter_state(a) for a in policy.adapters},
              "prompts": sorted({r.messages[-1]["content"] for r in engine.calls if not r.sampling.greedy})}
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    return result


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2])
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
