"""Scoring code answers: :func:`extract_code`, :func:`build_program`, :func:`code_metric`, :func:`pass_at_k`.

A code example (HumanEval or generated, see :mod:`wfc.tasks.humaneval` and :mod:`wfc.tasks.codegen`) carries
``prompt`` (the input), ``tests`` (source defining ``check(candidate)``, which asserts), ``entry_point`` (the
function's name) and, for completion-style problems such as HumanEval, ``stub`` (the signature and docstring the
answer may continue). A prediction passes when ``answer code + tests + check(entry_point)`` exits 0 in the sandbox
and then prints a random per-run token: an answer that exits early (``sys.exit(0)``, ``os._exit(0)``, an ``atexit``
hook) never reaches the tests, so it must not score. Known gaps: a program that reads its own source can find the
token; one that prints more than the sandbox keeps (``max_output_bytes``) hides the token and scores 0.
"""

from __future__ import annotations

import re
import uuid
from math import comb

from wfc.tasks.sandbox import SandboxLimits, SandboxResult, run_python

CODE_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10, memory_bytes=1 << 30)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_IMPORT = re.compile(r"^(?:import|from)\s+\S", re.M)


def extract_code(text: object) -> str:
    """The code in a model's answer: the first fenced block (``` or ```python; an unclosed fence runs to the end),
    preferring a block tagged python/py when several are present; else the whole text. Never raises."""
    if text is None:
        return ""
    text = str(text)
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks:
        return text.strip("\n")
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    return (python or [blocks[0][1]])[0].strip("\n")


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def build_program(
    code: str, *, tests: str, entry_point: str, stub: str | None = None, token: str | None = None
) -> str:
    """The program the sandbox runs: answer code, then the tests, then ``check(entry_point)``, then (with a
    ``token``) a line printing it, which only runs when everything before it did.

    With a ``stub`` (completion-style problems): an answer that does not define ``entry_point`` is a body that
    continues the stub, so it is appended to it; an answer that does define it still gets the stub's import lines
    (HumanEval stubs import ``List`` and friends that full-function answers often forget).
    """
    if stub is not None:
        if _defines(code, entry_point):
            imports = "\n".join(line for line in stub.splitlines() if _IMPORT.match(line))
            code = f"{imports}\n\n{code}" if imports else code
        else:
            code = stub + code
    program = f"{code}\n\n\n{tests}\n\n\ncheck({entry_point})\n"
    if token is not None:
        # os.write on fd 1: immune to answers that shadow `print` or replace `sys.stdout`
        program += f"import os as _wfc_os\n_wfc_os.write(1, {(token + chr(10)).encode()!r})\n"
    return program


def _field(obj: object, name: str, default: object = ...) -> object:
    try:
        return getattr(obj, name)
    except (AttributeError, KeyError):
        if default is not ...:
            return default
        raise


def run_tests(example: object, code: str, *, limits: SandboxLimits = CODE_LIMITS) -> tuple[bool, SandboxResult]:
    """Run ``code`` against the example's tests in the sandbox: (passed, the full :class:`SandboxResult`).

    ``passed`` needs exit status 0 *and* the end-of-program token on stdout (see the module docstring); the result
    is there for feedback (stderr holds the failing assert).
    """
    try:
        tests, entry_point = _field(example, "tests"), _field(example, "entry_point")
    except (AttributeError, KeyError):
        raise TypeError("a code example needs `tests` and `entry_point` fields (see wfc.tasks.code)") from None
    token = f"wfc-tests-done-{uuid.uuid4().hex}"
    stub = _field(example, "stub", None)
    result = run_python(build_program(code, tests=tests, entry_point=entry_point, stub=stub, token=token),
                        limits=limits)
    return result.passed and token in result.stdout, result


def code_metric(
    example: object, prediction: object, trace: object = None, *, limits: SandboxLimits = CODE_LIMITS
) -> float:
    """1.0 when the code in ``prediction.code`` (or a str) passes the example's tests in the sandbox, else 0.0.

    DSPy metric signature; ``trace`` is ignored. Pass other limits with ``functools.partial(code_metric,
    limits=...)``. A prediction without code scores 0.0 without running anything.
    """
    if isinstance(prediction, str) or prediction is None:
        text = prediction
    else:
        try:
            text = _field(prediction, "code")
        except (AttributeError, KeyError):
            raise TypeError(
                f"code_metric needs a prediction with a `code` field (a dspy.Prediction) or a str; got "
                f"{type(prediction).__name__} without one. Check that the program's signature outputs `code`."
            ) from None
    code = extract_code(text)
    if not code.strip():
        return 0.0
    passed, _ = run_tests(example, code, limits=limits)
    return 1.0 if passed else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): P(at least one of k samples drawn from n passes), c of n passing.

    ``1 - C(n-c, k) / C(n, k)``, computed with exact integers (no overflow, no cancellation); 1.0 when
    ``n - c < k``. Requires ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"pass_at_k needs integer counts; {name}={value!r}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n (c passing samples out of n), got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (draw k of the n samples), got n={n}, k={k}; sample more or lower k")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
