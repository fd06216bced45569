"""Transfer: a compiled artifact against the program it was compiled from, on a task it never trained on.

Both run greedy on the same examples: the uncompiled program (the artifact's program with every role's demos
removed, on the bare base model: the program as written) and the artifact itself (its demos and adapters). The result
has each one's accuracy with its 95% interval and the paired difference (``compilers.score.paired_difference``),
with how many examples only one of them solved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import dspy

from compilers.mmgrpo import evaluate
from compilers.score import paired_difference
from wfc.lower import copy_program, roles

if TYPE_CHECKING:
    from wfc.artifact import CompiledProgram


def uncompiled(compiled: CompiledProgram) -> dspy.Module:
    """A copy of the artifact's program with no demos on any role (the artifact is left unchanged)."""
    program = copy_program(compiled.program)
    for predictor in roles(program).values():
        predictor.demos = []
    return program


def measure(compiled: CompiledProgram, examples: Sequence[dspy.Example], metric: Callable, *,
            max_tokens: int | None = None) -> dict[str, Any]:
    """The uncompiled program and the artifact on ``examples``, on the artifact's engine, each call limited to
    ``max_tokens`` (default: the artifact's own sampling limit, else 64). Keys: ``n``, ``uncompiled`` /
    ``compiled`` (accuracy) with ``*_interval``, ``difference`` (compiled - uncompiled) with ``interval``,
    ``only_compiled`` / ``only_uncompiled`` (examples only that one solved)."""
    if max_tokens is None:
        max_tokens = compiled.manifest.sampling.get("max_tokens", 64)
    before = evaluate(uncompiled(compiled), examples, compiled.engine, metric=metric, adapters={},
                      max_tokens=max_tokens, progress="uncompiled")
    after = evaluate(compiled.program, examples, compiled.engine, metric=metric, adapters=compiled.roles,
                     max_tokens=max_tokens, progress="compiled")
    pair = paired_difference([float(g.reward) for g in before["graphs"]], [float(g.reward) for g in after["graphs"]])
    return {"n": len(examples), "uncompiled": before["accuracy"], "uncompiled_interval": before["interval"],
            "compiled": after["accuracy"], "compiled_interval": after["interval"], "difference": pair["difference"],
            "interval": pair["interval"], "only_compiled": pair["only_after"], "only_uncompiled": pair["only_before"]}
