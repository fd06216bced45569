"""Reading a verdict: accept (True), reject (False) or unreadable (None), by the verdict's first word.

One reader for everything that acts on or scores a yes/no answer: EvalOpt stops revising when its evaluator's
verdict reads as accept (``programs/eval_opt.py``), verified credit scores that evaluator on whether the same reading
agrees with the gold answer (``compilers/credit.py``), and the adapter parses a ``bool`` output field with it
(``wfc/adapter.py``). Why one: with two readers, a verdict the program acted on as "reject" could be credited as
"accept" (e.g. "Right, but ..."), and the judge would learn from a decision it did not make.

Invariant: only the first word decides (case-insensitive, leading punctuation and spaces skipped), so "correct: the
sum is 5" accepts, "incorrect, 2+3 is 5" and "not correct" reject, and "The function is correct" is unreadable: a
prose verdict is not guessed at. A ``bool`` is its own reading.
"""

from __future__ import annotations

import re
from typing import Any

ACCEPT_WORDS = frozenset({"yes", "true", "correct", "right", "accept", "accepted", "1"})
REJECT_WORDS = frozenset({"no", "not", "false", "incorrect", "wrong", "reject", "rejected", "0"})
_WORD = re.compile(r"[a-z0-9]+")


def read_verdict(value: Any) -> bool | None:
    """True (accept) / False (reject) / None (unreadable) for a verdict value, by its first word."""
    if isinstance(value, bool):
        return value
    first = _WORD.search(str(value or "").lower())
    if first is None:
        return None
    word = first.group()
    return True if word in ACCEPT_WORDS else False if word in REJECT_WORDS else None
