"""The examples a code prompt shows, run against a proposed answer: a check a program may use at inference.

:func:`prompt_examples` reads them off the prompt text alone, so a program that runs them uses only its own input,
never the task's hidden ``tests``: the generated tasks' sentence "For example, ``f(3)`` should return ``7``."
(:mod:`wfc.tasks.codegen`), and doctest lines (``>>> f(3)`` then ``7``, as HumanEval's docstrings show them).
:func:`run_examples` runs the answer's code and each example's call in the sandbox (:mod:`wfc.tasks.sandbox`) and
says what went wrong in one line a model can read: "f(3) returned 6, but it should return 7.", "Running f(3)
raised ZeroDivisionError: division by zero.", "The code does not run: SyntaxError: invalid syntax (line 2)."
:func:`example_check` is the ``(inputs, proposal) -> (accepted, feedback)`` form ``programs.EvalOpt(check=...)``
takes.

Invariants: an expected value is compared with ``==`` after evaluating both sides in the sandbox (never in the
host); a prompt that shows no example passes (there is nothing to check, and the check must not reject what it
cannot judge); every example runs in one sandbox run, and the first failing one is reported. Known gap: an answer
that continues a completion-style prompt (a HumanEval body without its ``def`` line) is run as written, so it reads
as code that does not run; ``wfc.tasks.code.build_program`` joins such answers to their stub for the tests.
"""

from __future__ import annotations

import ast
import doctest
import json
import re
import uuid
from typing import Any, Mapping

from wfc.tasks.code import CODE_LIMITS, extract_code
from wfc.tasks.sandbox import SandboxLimits, run_python

SHOWN = 200  # characters of a returned value or an error message the report keeps
_SENTENCE = re.compile(r"For example, (?P<call>.+?) should return ", re.S)
_STOP = re.compile(r"\.(?=\s|$)")


def _expression(text: str) -> bool:
    try:
        ast.parse(text, mode="eval")
        return True
    except SyntaxError:
        return False


def prompt_examples(prompt: str) -> list[tuple[str, str]]:
    """The ``(call, expected)`` source pairs ``prompt`` shows, in order (see the module docstring); pairs whose
    either side is not a Python expression are left out."""
    pairs = []
    for m in _SENTENCE.finditer(prompt):
        # the expected value ends at the first sentence stop that leaves an expression ('a. b' holds a stop)
        ends = [stop.start() for stop in _STOP.finditer(prompt, m.end())]
        want = next((prompt[m.end():end].strip() for end in ends if _expression(prompt[m.end():end].strip())), "")
        pairs.append((m["call"].strip(), want))
    for example in doctest.DocTestParser().get_examples(prompt):
        # a docstring's closing quotes at the example's indentation read as part of its expected output
        want = re.split(r'^\s*(?:"""|\'\'\')', example.want, maxsplit=1, flags=re.M)[0]
        pairs.append((example.source.strip(), want.strip()))
    return [(call, want) for call, want in pairs if call and want and _expression(call) and _expression(want)]


def _harness(code: str, examples: list[tuple[str, str]], marker: str) -> str:
    lines = [code, "", "", "import json as _wfc_json, os as _wfc_os", "def _wfc_report(*row):",
             f"    _wfc_os.write(1, ({marker!r} + _wfc_json.dumps(row) + '\\n').encode())"]
    for i, (call, want) in enumerate(examples):
        lines += ["try:", f"    _wfc_got = {call}",
                  f"    _wfc_report({i}, bool(_wfc_got == ({want})), repr(_wfc_got)[:{SHOWN}])",
                  "except Exception as _wfc_error:",
                  f"    _wfc_report({i}, False, None, (type(_wfc_error).__name__ + ': ' + str(_wfc_error))[:{SHOWN}])"]
    return "\n".join(lines) + "\n"


def run_examples(code: str, examples: list[tuple[str, str]], *,
                 limits: SandboxLimits = CODE_LIMITS) -> tuple[bool, str]:
    """(every example returned what it should, a one-line report of the first that did not; "" when all did)."""
    if not examples:
        return True, ""
    marker = f"wfc-example-{uuid.uuid4().hex}:"
    result = run_python(_harness(code, examples, marker), limits=limits)
    rows = {}
    for line in result.stdout.splitlines():
        if line.startswith(marker):
            index, *row = json.loads(line[len(marker):])
            rows[index] = row
    for index, (call, want) in enumerate(examples):
        if index not in rows:
            if rows or not result.stderr.strip():
                return False, f"Running {call} did not finish ({result.status})."
            error = result.stderr.strip().splitlines()[-1][:SHOWN]
            return False, f"The code does not run: {error}"
        ok, got, *error = rows[index]
        if error:
            return False, f"Running {call} raised {error[0]}."
        if not ok:
            return False, f"{call} returned {got}, but it should return {want}."
    return True, ""


def example_check(inputs: Mapping[str, Any], proposal: Mapping[str, Any], *, prompt_field: str = "prompt",
                  code_field: str = "code") -> tuple[bool, str]:
    """``EvalOpt``'s check for code tasks: run the examples ``inputs[prompt_field]`` shows against the code in
    ``proposal[code_field]`` (:func:`wfc.tasks.code.extract_code`)."""
    code = extract_code(proposal.get(code_field))
    if not code.strip():
        return False, "There is no code."
    return run_examples(code, prompt_examples(str(inputs.get(prompt_field, ""))))
