"""What the ChainOfThought demo's program writes on the embedded model, under other prompts or free-text rules, and
under a trained revision: greedy and sampled pass rates on validation problems (never the held-out set).

Variants (each one change against ``full``, the program as ``examples/cot_demo.py`` runs it):
- ``full``: ChatAdapter's prompt (the compact adapter falls back to it for two outputs) and the one-line free-text rule.
- ``compact``: a short prompt in the compact adapter's style (instructions, then "Reply with the reasoning, then the
  answer (an integer)."), no format template; the grammar still forces the field markers.
- ``no_placeholder``: the reasoning may not open with ``{`` or a space (the template's ``{reasoning}`` is not copyable).
- ``no_list``: as ``no_placeholder``, and not with a list number (``1.``).
- ``letter``: the reasoning opens with a letter.
- ``multiline``: the reasoning may run over several lines, ended by a blank line or its budget.

    python benchmarks/cot_formats.py --variants full,compact,no_placeholder,no_list,letter,multiline
    python benchmarks/cot_formats.py --variants full --revision runs/cot-seed1/revisions/5/shared.safetensors
    python benchmarks/cot_formats.py --variants full --demos 3 --demo-seed 1   # bootstrapped demos first
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from unittest import mock

import wfc.constrain as constrain
from compilers.config import LoraSettings
from compilers.grounded import grounded
from compilers.prompts import apply_demos, bootstrap_demos, demo_summary
from compilers.remedies import group_signal
from compilers.score import score_rollout
from programs.agents import math_cot
from wfc.adapter import CompactChatAdapter
from wfc.engines.base import AdapterRevision, SamplingParams
from wfc.engines.hf import HFEngine
from wfc.lower import run_rollouts
from wfc.tasks import get_task
from wfc.tasks.math import math_metric

_BODY = r"([^\[\n]|\[[^\[\n])*"  # one line without a field marker: the free-text rule of wfc.constrain
OPENERS = {"no_placeholder": r"[^\[\n{ ]", "no_list": r"([^\[\n{ 0-9]|[0-9]+[^.0-9\[\n])", "letter": r"[A-Za-z]"}
VARIANTS = ("full", "compact", *OPENERS, "multiline")


class ShortPrompt(CompactChatAdapter):
    """The compact adapter's prompt style for several outputs: instructions and one "Reply with ..." line."""

    def format(self, signature, demos, inputs):
        if self._single_output(signature) is not None:
            return super().format(signature, demos, inputs)
        parts = []
        for name, info in signature.output_fields.items():
            kind = "" if info.annotation is str else f" (an {getattr(info.annotation, '__name__', 'value')})"
            parts.append(f"the {name.replace('_', ' ')}{kind}")
        reply = "Reply with " + ", then ".join(parts) + "."
        return [{"role": "system", "content": f"{signature.instructions.strip()}\n{reply}"},
                {"role": "user", "content": f"{self._user_content(signature, inputs)}\n{reply}"}]


def free_text_rule(variant: str):
    """A stand-in for ``wfc.constrain.value_rule`` whose ``str`` values follow ``variant``'s rule."""
    original = constrain.value_rule

    def rule(name, annotation, *, budget):
        if annotation is not str:
            return original(name, annotation, budget=budget)
        if variant == "multiline":  # several lines; a blank line (or the budget) ends the value
            return f'{name}[stop="\\n\\n", max_tokens={budget}]: /([^\\[]|\\[[^\\[])*/', True
        return f'{name}[stop="\\n", max_tokens={budget}]: /{OPENERS[variant]}{_BODY}/', True

    return rule


def run_variant(variant: str, engine, examples, *, samples: int, temperature: float, adapters,
                program=None) -> list[dict]:
    """Greedy, then ``samples`` sampled runs of ``program`` (default ``math_cot(24)``) per example under
    ``variant``; one row each."""
    program = program if program is not None else math_cot(24)
    adapter = ShortPrompt() if variant == "compact" else CompactChatAdapter()
    patch = (mock.patch.object(constrain, "value_rule", free_text_rule(variant))
             if variant in OPENERS or variant == "multiline" else contextlib.nullcontext())
    rows = []
    with patch:
        for temp, repeats in ((0.0, 1), (temperature, samples)):
            t0 = time.time()
            graphs = run_rollouts(program, examples, engine, repeats=repeats, adapters=adapters, adapter=adapter,
                                  sampling=SamplingParams(temperature=temp, max_tokens=64),
                                  seeds=list(range(len(examples))))
            rates = [statistics.fmean(score_rollout(math_metric, g, failure_score=0.0, metric_failure_score=0.0)
                                      for g in gs) for gs in graphs]
            outs = [g.calls[0].outputs for gs in graphs for g in gs]
            reasoning = [str(o.get("reasoning", "")).lstrip() for o in outs]
            rows.append({"variant": variant, "temperature": temp, "runs": len(outs),
                         "pass_rate": round(statistics.fmean(rates), 3),
                         "groups_of_4_with_signal": round(group_signal(rates, 4), 3) if temp else None,
                         "placeholder": sum(r.startswith("{") for r in reasoning),
                         "list_opener": sum(r.startswith("1.") for r in reasoning),
                         "answer_2_after_list": sum(r.startswith("1.") and o.get("answer") == 2
                                                    for r, o in zip(reasoning, outs)),
                         "examples": [o for o in outs[:4]] if temp == 0 else None,
                         "seconds": round(time.time() - t0)})
            print(json.dumps(rows[-1], default=str), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="full", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--examples", type=int, default=48, help="validation problems (the first N)")
    ap.add_argument("--samples", type=int, default=4, help="sampled runs per problem")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--revision", default=None, help="a compile's revisions/<step>/shared.safetensors to load")
    ap.add_argument("--demos", type=int, default=0,
                    help="bootstrap this many demos from the program's own passing runs on the trainset first")
    ap.add_argument("--demo-metric", choices=("plain", "grounded"), default="grounded",
                    help="what a bootstrapped run must pass: the task's metric, or it with the reasoning ending at the "
                         "answer (compilers.grounded, conclusion=True); since stop 55 the bootstrap keeps only calls "
                         "whose reasoning ends at their answer either way (compilers.prompts.reasoning_concludes)")
    ap.add_argument("--demo-seed", type=int, default=0, help="which training examples the bootstrap draws")
    ap.add_argument("--bootstrap-examples", type=int, default=64)
    ap.add_argument("--bootstrap-repeats", type=int, default=4)
    ap.add_argument("--out", default=None, help="write the rows here as JSON")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}")
    task = get_task("arithmetic", n_train=400, n_val=100, n_test=300, seed=1, steps=1, max_operand=20)
    engine = HFEngine("smollm2-135m")
    adapters = {}
    if args.revision:
        from safetensors.torch import load_file

        engine.load_adapters([AdapterRevision("shared", 1, LoraSettings().peft_config(), load_file(args.revision))])
        adapters = {"predict": "shared"}
    program, boot = math_cot(24), {}
    if args.demos:
        metric = grounded(math_metric, conclusion=True) if args.demo_metric == "grounded" else math_metric
        demos = bootstrap_demos(program, task.trainset, engine, metric=metric, k=args.demos, adapters=adapters,
                                n_examples=args.bootstrap_examples, repeats=args.bootstrap_repeats, max_tokens=64,
                                seed=args.demo_seed, stats=boot)
        apply_demos(program, demos)
        boot["demos"] = demo_summary(program)
        print(json.dumps(boot, default=str), flush=True)
    rows = [r for v in variants for r in run_variant(v, engine, task.valset[:args.examples], samples=args.samples,
                                                      temperature=args.temperature, adapters=adapters,
                                                      program=program)]
    if args.out:
        Path(args.out).write_text(json.dumps({"revision": args.revision, "bootstrap": boot, "rows": rows}, indent=1,
                                             default=str))


if __name__ == "__main__":
    main()
