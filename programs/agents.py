"""DSPy programs as users write them, for structured decoding: a calculator ReAct agent and a multi-hop searcher.

- :func:`calculator_tools`: ``add``, ``subtract``, ``multiply``, ``divide`` on integers, typed, so each tool's
  argument schema (``dspy.Tool.args``) is what structured decoding constrains a call's arguments to.
- :func:`calculator_agent`: ``dspy.ReAct(signature, tools=calculator_tools())``; its roles are ``react`` (the
  thought and tool call each step) and ``extract.predict`` (the final answer).
- :class:`MultiHop`: ``hops`` rounds of ``ChainOfThought("question, notes -> query")`` over a search function, then
  ``Predict("question, notes -> answer")``; its roles are ``hop`` (one role, called once per round) and ``answer``.
- :class:`KeywordSearch`: a local corpus searched by word overlap (deterministic, no index to download).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import dspy

from wfc.constrain import with_budgets


def add(a: int, b: int) -> int:
    """Return a + b."""
    return a + b


def subtract(a: int, b: int) -> int:
    """Return a - b."""
    return a - b


def multiply(a: int, b: int) -> int:
    """Return a * b."""
    return a * b


def divide(a: int, b: int) -> float:
    """Return a / b."""
    if b == 0:
        raise ValueError("cannot divide by zero")
    return a / b


def calculator_tools() -> list[Callable]:
    return [add, subtract, multiply, divide]


MATH_COT_INSTRUCTIONS = "Solve the math word problem. Think briefly, then give the final number."


def math_cot(reasoning_tokens: int = 24) -> dspy.ChainOfThought:
    """``dspy.ChainOfThought("question -> answer: int")`` with its reasoning capped at ``reasoning_tokens``: the
    ChainOfThought demo's program (``examples/cot_demo.py``, ``benchmarks/cot_formats.py``)."""
    cot = dspy.ChainOfThought(dspy.Signature("question -> answer: int", MATH_COT_INSTRUCTIONS))
    cot.predict.signature = with_budgets(cot.predict.signature, reasoning=reasoning_tokens)
    return cot


def calculator_agent(signature="question -> answer: int", *, max_iters: int = 3,
                     thought_tokens: int = 24) -> dspy.ReAct:
    """A ReAct agent with the calculator tools; each step's thought capped at ``thought_tokens``."""
    agent = dspy.ReAct(signature, tools=calculator_tools(), max_iters=max_iters)
    agent.react.signature = with_budgets(agent.react.signature, next_thought=thought_tokens)
    return agent


_WORD = re.compile(r"[a-z0-9]+")


class KeywordSearch:
    """``search(query, k)`` -> the ``k`` passages of ``corpus`` sharing the most words with ``query`` (ties: corpus
    order)."""

    def __init__(self, corpus: Sequence[str]):
        if not corpus:
            raise ValueError("KeywordSearch needs a non-empty corpus of passages")
        self.corpus = list(corpus)
        self._words = [set(_WORD.findall(p.lower())) for p in self.corpus]

    def __call__(self, query: str, k: int = 2) -> list[str]:
        words = set(_WORD.findall(str(query).lower()))
        ranked = sorted(range(len(self.corpus)), key=lambda i: (-len(words & self._words[i]), i))
        return [self.corpus[i] for i in ranked[:k]]


class MultiHop(dspy.Module):
    """``hops`` rounds of query-writing over ``search``, then an answer from the gathered notes."""

    def __init__(self, search: Callable[[str], list[str]], *, hops: int = 2, answer="answer: int",
                 query_tokens: int = 24):
        super().__init__()
        self.search = search
        self.hops = hops
        self.hop = dspy.ChainOfThought("question, notes: list[str] -> query")
        self.hop.predict.signature = with_budgets(self.hop.predict.signature, reasoning=query_tokens,
                                                  query=query_tokens)
        self.answer = dspy.Predict(f"question, notes: list[str] -> {answer}")

    def forward(self, question: str):
        notes: list[str] = []
        for _ in range(self.hops):
            query = self.hop(question=question, notes=notes).query
            notes += [p for p in self.search(query) if p not in notes]
        return self.answer(question=question, notes=notes)
