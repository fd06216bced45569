"""What weight training does with the demos a student already holds (a prompt optimizer's: ``dspy.MIPROv2``,
``BootstrapFewShot``; the ``p`` step of ``dspy.BetterTogether(p=..., w=MMGRPO(...))``), the ``student_demos`` field.

A registry of three rules (:data:`RULES`), applied by ``compilers.loop.CompileRun.student_demos`` before any other
stage touches the program:

- ``keep``: the demos stay in every prompt; GRPO trains with them there and the artifact saves them (the default:
  the student is the program the user gave);
- ``drop``: every predictor's demos are cleared and its instructions kept (DSPy's ``BootstrapFinetune`` has the same
  switch, ``exclude_demos``);
- ``internalize``: each trained role is first fine-tuned on its own demos, each rendered as the call it demonstrates
  (the role's adapter formats the demo's inputs with no demos, the demo's outputs are the completion: the format
  ``BootstrapFinetune`` trains on), then the demos are dropped. The weights carry what the demos taught; the prompts
  are as short as the zero-shot program's.

Why not always ``keep``: measured on SmolLM2-135M (the demo, seed 0, docs/results.md), MIPROv2's demos made every
prompt several times longer and the demo's 14 GRPO steps climbed more slowly from that program than from the
zero-shot one (0.537 held-out against 0.720). And ``internalize`` is no free lunch there: one fine-tune step on
MIPROv2's 4 voter demos at GRPO's rate took the step-0 validation from 0.14 to 0.00 (the voters learned to answer a
bare number at once), so it is an option to measure, not a default.

Invariants: only demos holding every input and output field of their role's signature are internalized (a labeled
demo of a ``ChainOfThought`` role has no ``reasoning``: it is counted in ``incomplete`` and dropped untrained); a
frozen role's demos are dropped under ``drop``/``internalize`` but never trained on; the rows are in program order
(role, then demo), so the same program gives the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import dspy

from compilers.finetune import chat_rows
from compilers.update import Row
from wfc.engines.base import Engine
from wfc.lower import roles


@dataclass(frozen=True)
class Rule:
    """``drop``: clear the demos before training; ``train``: fine-tune each trained role on its demos first."""

    name: str
    drop: bool
    train: bool


RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("keep", drop=False, train=False),
    Rule("drop", drop=True, train=False),
    Rule("internalize", drop=True, train=True),
)}


@dataclass
class DemoCalls:
    """The calls the demos demonstrate: role -> chat examples (DSPy's fine-tuning format), and what was left out."""

    chats: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    incomplete: dict[str, int] = field(default_factory=dict)  # role -> demos missing a field of its signature


def demo_counts(program: dspy.Module) -> dict[str, int]:
    """Role -> the demos its predictor holds (roles without any left out)."""
    return {role: len(p.demos) for role, p in roles(program).items() if p.demos}


def demo_calls(program: dspy.Module, trained: Sequence[str], parser: dspy.Adapter) -> DemoCalls:
    """Each trained role's demos as the calls they demonstrate, formatted by ``parser`` (the adapter the program's
    calls are formatted with) with no demos in the prompt: what the role's zero-shot prompt looks like."""
    out = DemoCalls()
    for role, pred in roles(program).items():
        if role not in trained or not pred.demos:
            continue
        sig = pred.signature
        names = [*sig.input_fields, *sig.output_fields]
        complete = [d for d in pred.demos if all(n in d for n in names)]
        if len(complete) < len(pred.demos):
            out.incomplete[role] = len(pred.demos) - len(complete)
        if complete:
            out.chats[role] = [parser.format_finetune_data(
                sig, demos=[], inputs={n: d[n] for n in sig.input_fields},
                outputs={n: d[n] for n in sig.output_fields}) for d in complete]
    return out


def demo_rows(engine: Engine, calls: DemoCalls, role_adapters: Mapping[str, str]) -> list[Row]:
    """One supervised row per demonstrated call (``compilers.finetune.chat_rows``: the engine's own prompt encoding,
    the reply then EOS), on its role's adapter and under its role's name."""
    rows = []
    for role, chats in calls.chats.items():
        rows += [replace(r, role=role) for r in chat_rows(engine, chats, role_adapters[role])]
    return rows


def drop_demos(program: dspy.Module) -> dict[str, int]:
    """Clear every predictor's demos in place; returns role -> how many it held (roles without any left out)."""
    dropped = demo_counts(program)
    for pred in roles(program).values():
        pred.demos = []
    return dropped
