"""A training metric for ChainOfThought-style roles: an answer earns the metric's score only when the reasoning
shows it.

Why: where a task has a common answer (a majority label, a small number that many problems share), a policy that
gives that answer to every input can earn more reward than a small model's sampled reasoning does, and GRPO then
climbs towards the constant answer (docs/results.md, "Why seeds 1 and 2 collapse": a 135M ChainOfThought answering
`2` to every problem, the most common answer of its training set). Requiring the answer to appear in the reasoning
gives a constant answer no reward unless the reasoning arrived at it, and leaves every reasoned success its score.

Contract of ``grounded(metric, answer=..., evidence=...)(example, prediction, trace=None)``:
- the wrapped metric's value when the ``answer`` field's text occurs in the ``evidence`` field as a whole word
  (case-insensitive; a number matches ``= 9`` but not ``19`` or ``9.5``), else 0.0;
- with ``conclusion=True``, a numeric answer must be the evidence's last number instead (``concludes``): a demo
  whose reasoning mentions the answer on its way to another number (``3 x 2 = 6`` for the answer ``2``) is refused;
- 0.0 when the prediction has no ``evidence`` field or it is empty;
- it is for training: report held-out accuracy with the plain metric.
"""

from __future__ import annotations

import re
from typing import Any, Callable


def shows(evidence: str, answer: Any) -> bool:
    """Whether ``answer``'s text occurs in ``evidence`` as a whole word, case-insensitive."""
    text = "" if answer is None else str(answer).strip()
    if not text or not evidence:
        return False
    return re.search(rf"(?<![\w.]){re.escape(text)}(?![\w]|\.\d)", evidence, flags=re.IGNORECASE) is not None


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def concludes(evidence: str, answer: Any) -> bool:
    """Whether ``evidence`` ends its reasoning at ``answer``: for a numeric answer, the last number in ``evidence``
    (thousands commas ignored) equals it; for any other answer, :func:`shows`."""
    text = "" if answer is None else str(answer).strip().replace(",", "")
    if not _NUMBER.fullmatch(text):
        return shows(evidence, answer)
    numbers = _NUMBER.findall((evidence or "").replace(",", ""))
    return bool(numbers) and float(numbers[-1]) == float(text)


def grounded(metric: Callable[..., Any], *, answer: str = "answer", evidence: str = "reasoning",
             conclusion: bool = False) -> Callable:
    """``metric`` scoring only answers that ``evidence`` shows, or with ``conclusion`` concludes (module doc)."""
    check = concludes if conclusion else shows

    def grounded_metric(example, prediction, trace=None):
        reasoning = getattr(prediction, evidence, None)
        if not reasoning or not check(str(reasoning), getattr(prediction, answer, None)):
            return 0.0
        return metric(example, prediction, trace)

    grounded_metric.__name__ = f"grounded_{getattr(metric, '__name__', 'metric')}"
    return grounded_metric
