"""Rollout graphs: the lowered form of one run of a program on one example.

Data model:
- ``CallNode``: one LM call. ``role`` is the dotted predictor path (the one identity of a role everywhere);
  ``invocation`` is this call's index among the same role's calls in the rollout: calls outside any fan-out in
  submission order, then calls made in ``parallel_map`` branches by branch index (``wfc.lower``), never by thread
  timing;
  ``prompt_ids``/``completion_ids``/``logprobs`` are exactly what the engine saw and produced (``logprobs_known``
  False: the engine could not report log-probs, and ``logprobs`` are placeholders);
  ``status`` is ``ok``, ``format_error`` (``text`` holds the raw completion) or ``crash`` (``error`` holds the
  exception). ``started``/``finished`` are ticks of a per-rollout clock, used to find parallel calls and data flow.
- ``RolloutGraph``: a ``networkx.DiGraph`` over call ids plus the example, the program's outputs, the rollout's
  ``status`` and ``error``, and ``reward`` (``None`` until scored: not the same as 0).

Invariants (tested): every LM call of the run is a node, whatever its status (nothing is dropped); an edge ``a -> b``
means b's prompt contains text that a produced and a finished before b started; node ids follow submission order.
"""

from __future__ import annotations

from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

CallStatus = Literal["ok", "format_error", "crash"]
RolloutStatus = Literal["ok", "format_error", "crash"]


class CallNode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    role: str
    invocation: int
    adapter: str | None = None
    messages: list[dict[str, str]]
    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    logprobs_known: bool = True  # False: the engine reported no log-probs (``logprobs`` are placeholders)
    choice_ids: list[list[int]] | None = None  # a choice call's every choice as token ids (wfc.engines.base)
    grammar: str | None = None  # the grammar the call was decoded under (wfc.constrain); None: unconstrained
    text: str = ""
    outputs: dict[str, Any] | None = None
    inputs: dict[str, Any] | None = None  # the predictor's input values (from DSPy's trace); None: not recorded
    status: CallStatus = "ok"
    error: str | None = None
    finish_reason: str | None = None
    temperature: float = 0.0
    started: int = 0
    finished: int = 0
    reward: float | None = None  # per-call credit (compilers.credit); None: inherit the rollout's reward
    no_credit: bool = False  # credit found nothing this call could have changed: it is left out of its group

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


class RolloutGraph:
    """One traced run: a DiGraph of ``CallNode``s (node attribute ``call``) plus the run's example and outcome."""

    def __init__(
        self,
        calls: list[CallNode],
        *,
        example: dict[str, Any],
        outputs: dict[str, Any] | None = None,
        status: RolloutStatus = "ok",
        error: str | None = None,
        stopped_at: str | None = None,
    ):
        self.graph = nx.DiGraph()
        for call in sorted(calls, key=lambda c: c.id):
            self.graph.add_node(call.id, call=call)
        self.example = example
        self.outputs = outputs
        self.status: RolloutStatus = status
        self.error = error
        # the role whose first call ended this run early (``wfc.lower.trace``'s ``stop_roles``), else None; the
        # outputs are then the latest answer made before it
        self.stopped_at = stopped_at
        self.reward: float | None = None
        self._link()

    def _link(self) -> None:
        calls = self.calls
        for b in calls:
            prompt = "\n".join(m.get("content", "") for m in b.messages)
            for a in calls:
                if a.id == b.id or a.finished > b.started or a.status != "ok" or not a.outputs:
                    continue
                fields = [k for k, v in a.outputs.items() if any(piece in prompt for piece in _pieces(v))]
                if fields:
                    self.graph.add_edge(a.id, b.id, fields=fields)

    @property
    def calls(self) -> list[CallNode]:
        return [self.graph.nodes[n]["call"] for n in sorted(self.graph.nodes)]

    def calls_of(self, role: str) -> list[CallNode]:
        return sorted((c for c in self.calls if c.role == role), key=lambda c: c.invocation)

    @property
    def roles(self) -> list[str]:
        seen: dict[str, None] = {}
        for c in self.calls:
            seen.setdefault(c.role, None)
        return list(seen)

    def fan_out(self, role: str) -> int:
        """The most calls of ``role`` in flight at once in this rollout (1 = sequential)."""
        spans = [(c.started, c.finished) for c in self.calls_of(role)]
        best = 0
        for s, _ in spans:
            best = max(best, sum(1 for s2, f2 in spans if s2 <= s < f2))
        return best

    def to_dict(self) -> dict[str, Any]:
        return {
            "example": self.example,
            "outputs": self.outputs,
            "status": self.status,
            "error": self.error,
            "stopped_at": self.stopped_at,
            "reward": self.reward,
            "calls": [c.model_dump() for c in self.calls],
            "edges": [{"src": a, "dst": b, **d} for a, b, d in self.graph.edges(data=True)],
        }

    def __repr__(self) -> str:
        return f"RolloutGraph(calls={len(self.graph)}, roles={self.roles}, status={self.status!r}, reward={self.reward})"


def _pieces(value: Any) -> list[str]:
    """The non-empty strings a produced value can show up as in a later prompt (list items one by one)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _pieces(v)]
    text = str(value).strip()
    return [text] if text else []
