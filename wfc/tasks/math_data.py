"""Math word-problem data sets as ``dspy.Example(question, answer)`` lists: :func:`load_gsm8k`, :func:`load_svamp`.

Every example has inputs ``("question",)`` and ``answer`` = the gold number as a canonical string (``"18"``,
``"-5"``, ``"0.75"``; see :func:`wfc.tasks.math.format_number`). Order is the file's order; ``limit`` keeps a prefix.

Where the data comes from, first match wins:

1. ``path=``: a file (the split itself), or a folder holding ``gsm8k/<split>.jsonl`` / ``svamp/SVAMP.json``
   (or those files directly).
2. the environment variable ``WFC_DATA_DIR``: a folder laid out as in 1.
3. the Hugging Face hub through ``datasets.load_dataset`` (``openai/gsm8k`` config ``main``; ``ChilleD/SVAMP``),
   only when the ``datasets`` package is installed; a failed download falls through to the error below.

Otherwise ``FileNotFoundError`` says both ways to provide the data. SVAMP is an **evaluation-only** transfer test:
there is deliberately no train split (all 1,000 problems are returned), never train on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

import dspy

from wfc.tasks.math import extract_number, format_number

DATA_ENV = "WFC_DATA_DIR"
GSM8K_SPLITS = ("train", "test")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")


def _example(question: str, answer: float) -> dspy.Example:
    return dspy.Example(question=question, answer=format_number(answer)).with_inputs("question")


def _resolve_local(path: str | os.PathLike | None, candidates: tuple[str, ...]) -> Path | None:
    """The data file: ``path`` itself if a file, else the first candidate under ``path`` or ``$WFC_DATA_DIR``.

    An explicit ``path`` that does not hold the data is an error (raised here), not a reason to try the hub.
    """
    if path is not None:
        p = Path(path)
        if p.is_file():
            return p
        if p.is_dir():
            for c in candidates:
                if (p / c).is_file():
                    return p / c
        raise FileNotFoundError(f"{p} is neither the data file nor a folder holding one of {list(candidates)}")
    env = os.environ.get(DATA_ENV)
    if env:
        for c in candidates:
            if (Path(env) / c).is_file():
                return Path(env) / c
    return None


def _from_hub(name: str, config: str | None, splits: Iterable[str]) -> tuple[list[dict] | None, str]:
    """Rows of ``splits`` concatenated, or (None, why not). Never raises: the hub is a best-effort fallback."""
    try:
        import datasets  # optional dependency
    except ImportError:
        return None, "the `datasets` package is not installed"
    rows: list[dict] = []
    try:
        for split in splits:
            rows.extend(dict(r) for r in datasets.load_dataset(name, config, split=split))
    except Exception as e:  # noqa: BLE001 - offline, gated, renamed: all mean "not from the hub"
        return None, f"datasets.load_dataset({name!r}) failed: {e}"
    return rows, ""


def _missing(what: str, candidates: tuple[str, ...], hub_error: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{what} not found. Either pass path= (the file, or a folder holding {' or '.join(candidates)}) or set "
        f"{DATA_ENV} to such a folder; or install `datasets` on a machine with Hugging Face hub access "
        f"({hub_error})."
    )


def _load(
    what: str,
    path,
    candidates: tuple[str, ...],
    read_file: Callable[[Path], list[dspy.Example]],
    hub: tuple[str, str | None, tuple[str, ...]],
    from_row: Callable[[dict], dspy.Example],
    limit: int | None,
) -> list[dspy.Example]:
    _check_limit(limit)
    local = _resolve_local(path, candidates)
    if local is not None:
        examples = read_file(local)
    else:
        rows, why = _from_hub(*hub)
        if rows is None:
            raise _missing(what, candidates, why)
        examples = [from_row(r) for r in rows]
    return examples if limit is None else examples[:limit]


def gsm8k_example(row: dict) -> dspy.Example:
    """One GSM8K row ``{"question", "answer": "<rationale>\\n#### <number>"}`` as an example."""
    rationale = row["answer"]
    if "####" not in rationale:
        raise ValueError(f"GSM8K answer without a '#### <number>' line: {rationale[-80:]!r}")
    value = extract_number(rationale.rsplit("####", 1)[1])
    if value is None:
        raise ValueError(f"GSM8K answer with no number after '####': {rationale[-80:]!r}")
    return _example(row["question"].strip(), value)


def _read_jsonl(path: Path) -> list[dspy.Example]:
    with open(path, encoding="utf-8") as f:
        return [gsm8k_example(json.loads(line)) for line in f if line.strip()]


def load_gsm8k(split: str = "train", *, path=None, limit: int | None = None) -> list[dspy.Example]:
    """GSM8K (7,473 train / 1,319 test problems). See the module docstring for where the data comes from."""
    if split not in GSM8K_SPLITS:
        raise ValueError(f"GSM8K split must be one of {GSM8K_SPLITS}, got {split!r}")
    candidates = (f"gsm8k/{split}.jsonl", f"{split}.jsonl")
    hub = ("openai/gsm8k", "main", (split,))
    return _load(f"GSM8K {split} split", path, candidates, _read_jsonl, hub, gsm8k_example, limit)


def svamp_example(item: dict) -> dspy.Example:
    """One SVAMP item ``{"Body", "Question", "Answer"}``: the question is Body and Question joined as sentences."""
    body = item["Body"].strip()
    if body and body[-1] not in ".?!":
        body += "."
    return _example(f"{body} {item['Question'].strip()}".strip(), float(item["Answer"]))


def _read_svamp(path: Path) -> list[dspy.Example]:
    with open(path, encoding="utf-8") as f:
        return [svamp_example(item) for item in json.load(f)]


def load_svamp(*, path=None, limit: int | None = None) -> list[dspy.Example]:
    """SVAMP, all 1,000 problems, **for evaluation only** (there is no train split; do not train on it).

    From the hub, ``ChilleD/SVAMP``'s train and test splits are concatenated back into the full 1,000.
    """
    candidates = ("svamp/SVAMP.json", "SVAMP.json")
    hub = ("ChilleD/SVAMP", None, ("train", "test"))
    return _load("SVAMP", path, candidates, _read_svamp, hub, svamp_example, limit)
