"""``wfc.Program``: an optional ``dspy.Module`` base that adds metadata. Any plain DSPy program runs unchanged.

A role is a predictor the program holds; its identity is its dotted attribute path (``named_predictors()``).
"""

from __future__ import annotations

import dspy


class Program(dspy.Module):
    """A DSPy module with a ``name`` and ``description`` (shown by ``wfc inspect`` and stored in artifacts)."""

    name: str = ""
    description: str = ""

    def __init__(self, *, name: str | None = None, description: str | None = None):
        super().__init__()
        self.name = name or self.name or type(self).__name__
        self.description = description or self.description or (type(self).__doc__ or "").strip().split("\n")[0]
