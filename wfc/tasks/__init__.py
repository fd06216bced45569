"""Tasks for wfc: data sets, generators, metrics and a sandbox for running model-written code.

Layout (one concept per file):

- ``registry``: :class:`Task`, :data:`TASKS`, :func:`get_task` ("arithmetic", "wordproblems", "gsm8k", "svamp",
  "humaneval", "codegen")
- ``math``: :func:`extract_number`, :func:`math_metric`; ``math_data``: :func:`load_gsm8k`, :func:`load_svamp`;
  ``arithmetic``: :func:`make_arithmetic`; ``wordproblems``: :func:`make_wordproblems`
- ``code``: :func:`extract_code`, :func:`code_metric`, :func:`pass_at_k`; ``humaneval``: :func:`load_humaneval`;
  ``codegen``: :func:`make_codegen`
- ``sandbox``: :func:`run_python` with :class:`SandboxLimits` -> :class:`SandboxResult`
- ``signatures``: :class:`SolveMath`, :class:`WriteCode`
"""

from wfc.tasks.arithmetic import make_arithmetic
from wfc.tasks.code import build_program, code_metric, extract_code, pass_at_k, run_tests
from wfc.tasks.codegen import make_codegen
from wfc.tasks.humaneval import load_humaneval
from wfc.tasks.math import extract_number, format_number, math_metric, numbers_match
from wfc.tasks.math_data import load_gsm8k, load_svamp
from wfc.tasks.registry import DEFAULT_TASK, TASKS, Task, UnknownTaskError, get_task
from wfc.tasks.sandbox import SandboxLimits, SandboxResult, run_python, sandbox_python
from wfc.tasks.signatures import SolveMath, WriteCode
from wfc.tasks.wordproblems import make_wordproblems

__all__ = [
    "DEFAULT_TASK", "TASKS", "SandboxLimits", "SandboxResult", "SolveMath", "Task", "UnknownTaskError", "WriteCode",
    "build_program", "code_metric", "extract_code", "extract_number", "format_number", "get_task", "load_gsm8k",
    "load_humaneval", "load_svamp", "make_arithmetic", "make_codegen", "make_wordproblems", "math_metric",
    "numbers_match", "pass_at_k", "run_python", "run_tests", "sandbox_python",
]
