"""compilers.transfer: an artifact against its own program uncompiled (no demos, no adapters), on a scripted engine
that answers right only when the trained demo is in the prompt, so every figure is known in advance."""

from __future__ import annotations

import dspy

from compilers.transfer import measure, uncompiled
from programs import Single
from wfc.artifact import CompiledProgram, Manifest
from wfc.tasks.math import math_metric

SIG = dspy.Signature("question -> answer", "Answer with a number.")
DEMO = dspy.Example(question="What is 1 plus 1?", answer="2")


def _compiled(fake_engine, requests):
    def answer(request):
        requests.append(request)
        text = "\n".join(m["content"] for m in request.messages)
        return "[[ ## answer ## ]]\n4" if DEMO.question in text else "[[ ## answer ## ]]\n0"

    program = Single(SIG)
    program.solver.demos = [DEMO]
    manifest = Manifest(name="Single", base_model="fake", base_model_checksum="0", program_class="programs:Single",
                        roles={"solver": "shared"}, sampling={"max_tokens": 7})
    return CompiledProgram(program, fake_engine(answer), manifest)


def test_the_uncompiled_program_is_a_copy_without_demos(fake_engine):
    compiled = _compiled(fake_engine, [])
    bare = uncompiled(compiled)
    assert bare.solver.demos == [] and len(compiled.program.solver.demos) == 1


def test_the_artifact_and_its_uncompiled_program_are_paired_on_the_same_examples(fake_engine):
    requests = []
    compiled = _compiled(fake_engine, requests)
    examples = [dspy.Example(question=f"What is 2 plus {i}?", answer="4").with_inputs("question") for i in (2, 2, 2)]
    result = measure(compiled, examples, math_metric)
    assert (result["n"], result["uncompiled"], result["compiled"], result["difference"]) == (3, 0.0, 1.0, 1.0)
    assert (result["only_compiled"], result["only_uncompiled"]) == (3, 0)
    assert len(result["compiled_interval"]) == len(result["interval"]) == 2
    assert {r.sampling.max_tokens for r in requests} == {7}  # the artifact's own limit
    assert {r.adapter for r in requests} == {None, "shared"}  # the bare base model, then the artifact's adapter
    requests.clear()
    measure(compiled, examples, math_metric, max_tokens=3)
    assert {r.sampling.max_tokens for r in requests} == {3}
