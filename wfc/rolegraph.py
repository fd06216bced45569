"""Role graphs: many rollout graphs of one program folded into one graph over its roles.

A rollout graph (``wfc.rollout``) has one node per LM call. The role graph has one node per role (dotted predictor
path) and one edge per ``role -> role`` data flow, with statistics over the rollouts. It is what ``wfc inspect``
prints, and it answers the questions to ask before training: how often is each role called, how wide does it fan
out, how many tokens (gradient mass) does it carry, how often does it fail, and what feeds what.

Data model:
- ``RoleStats`` per role. Over the ``N`` rollouts (a rollout that never calls the role counts as 0 calls):
  ``calls_mean``/``calls_min``/``calls_max`` are calls per rollout; ``fan_out`` is the largest number of the role's
  calls in flight at once in any rollout (``RolloutGraph.fan_out``); ``tokens_per_rollout`` is the mean of the role's
  prompt + completion tokens per rollout. Over the role's calls: ``prompt_tokens_mean``/``completion_tokens_mean``
  are means per call; ``format_error_rate``/``crash_rate`` are shares of calls with that status.
  ``token_share`` is the role's share of all tokens of all rollouts (= its ``tokens_per_rollout`` over the sum over
  roles), and ``completion_share`` the same for completion tokens only (what a policy-gradient loss sums over).
- ``RoleEdge`` per ordered pair of roles linked by at least one call edge: ``count`` is the number of call edges
  over all rollouts, ``rollout_share`` the share of rollouts with at least one. Self edges (a role feeding a later
  call of itself, e.g. a reviser) are kept.

Invariants: ``roles`` are in first-seen order (rollouts in order, calls in id order); the ``token_share`` values sum
to 1 whenever any token was seen (else all are 0); ``0 <= rollout_share <= 1``; no rollout is dropped, whatever its
status (``status_counts`` counts them).
"""

from __future__ import annotations

import json
from typing import Any

import networkx as nx
from pydantic import BaseModel, ConfigDict

from wfc.rollout import RolloutGraph


class RoleStats(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    role: str
    calls_mean: float
    calls_min: int
    calls_max: int
    fan_out: int
    prompt_tokens_mean: float
    completion_tokens_mean: float
    tokens_per_rollout: float
    token_share: float
    completion_share: float
    format_error_rate: float
    crash_rate: float


class RoleEdge(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    src: str
    dst: str
    count: int
    rollout_share: float


class RoleGraph(BaseModel):
    """Per-role statistics and role -> role edges over a set of rollouts (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_rollouts: int
    status_counts: dict[str, int]
    roles: list[RoleStats]
    edges: list[RoleEdge]

    # ----- building -------------------------------------------------------------------------------------------
    @classmethod
    def from_rollouts(cls, graphs: list[RolloutGraph]) -> "RoleGraph":
        graphs = list(graphs)
        if not graphs:
            raise ValueError("RoleGraph.from_rollouts needs at least one rollout graph; run the program first "
                             "(e.g. wfc.lower.run_rollouts) and pass the graphs it returns")
        for g in graphs:
            if not isinstance(g, RolloutGraph):
                raise TypeError(f"expected RolloutGraph objects, got {type(g).__name__}")
        status_counts: dict[str, int] = {}
        for g in graphs:
            status_counts[g.status] = status_counts.get(g.status, 0) + 1
        return cls(num_rollouts=len(graphs), status_counts=status_counts, roles=_role_stats(graphs),
                   edges=_role_edges(graphs))

    # ----- lookups --------------------------------------------------------------------------------------------
    @property
    def role_names(self) -> list[str]:
        return [s.role for s in self.roles]

    def stats(self, role: str) -> RoleStats:
        for s in self.roles:
            if s.role == role:
                return s
        raise KeyError(f"no role {role!r} in this role graph; roles are {self.role_names}")

    def edge(self, src: str, dst: str) -> RoleEdge | None:
        return next((e for e in self.edges if e.src == src and e.dst == dst), None)

    # ----- exports --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph with one node per role (attributes: the RoleStats fields) and edge attributes count/share."""
        g = nx.DiGraph(num_rollouts=self.num_rollouts)
        for s in self.roles:
            g.add_node(s.role, **s.model_dump(exclude={"role"}))
        for e in self.edges:
            g.add_edge(e.src, e.dst, count=e.count, rollout_share=e.rollout_share)
        return g

    def to_dot(self, *, name: str = "roles") -> str:
        """Graphviz DOT text: roles as boxes labelled with calls, fan-out and token share; edges with counts."""
        lines = [f"digraph {_dot_id(name)} {{", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
        for s in self.roles:
            lines.append(f"  {_dot_id(s.role)} [label={_dot_id(_node_label(s, sep=chr(10)))}];")
        for e in self.edges:
            label = f"{e.count}x, {e.rollout_share:.0%} of rollouts"
            lines.append(f"  {_dot_id(e.src)} -> {_dot_id(e.dst)} [label={_dot_id(label)}];")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def to_mermaid(self) -> str:
        """Mermaid flowchart text. Node ids are ``r0, r1, ...`` (role paths may hold characters Mermaid rejects)."""
        ids = {s.role: f"r{i}" for i, s in enumerate(self.roles)}
        lines = ["flowchart LR"]
        for s in self.roles:
            lines.append(f'  {ids[s.role]}["{_mermaid_text(_node_label(s, sep="<br/>"))}"]')
        for e in self.edges:
            label = _mermaid_text(f"{e.count}x, {e.rollout_share:.0%}")
            lines.append(f'  {ids[e.src]} -->|"{label}"| {ids[e.dst]}')
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        """A fixed-width text table of the role statistics, then the edges, for printing."""
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.status_counts.items()))
        head = ["role", "calls (mean/min/max)", "fan-out", "prompt tok", "compl tok", "tok/rollout",
                "tok share", "fmt err", "crash"]
        rows = [[s.role, f"{s.calls_mean:.2f} / {s.calls_min} / {s.calls_max}", str(s.fan_out),
                 f"{s.prompt_tokens_mean:.1f}", f"{s.completion_tokens_mean:.1f}", f"{s.tokens_per_rollout:.1f}",
                 f"{s.token_share:.1%}", f"{s.format_error_rate:.0%}", f"{s.crash_rate:.0%}"] for s in self.roles]
        out = [f"role graph over {self.num_rollouts} rollout(s) ({statuses})", _grid(head, rows)]
        if self.edges:
            erows = [[f"{e.src} -> {e.dst}", str(e.count), f"{e.rollout_share:.0%}"] for e in self.edges]
            out += ["", _grid(["edge", "count", "rollouts"], erows)]
        else:
            out += ["", "no role -> role edges (no call's prompt contains another call's output)"]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def _node_label(s: RoleStats, *, sep: str) -> str:
    if s.calls_min == s.calls_max:
        calls = f"{s.calls_min} call" + ("" if s.calls_min == 1 else "s")
    else:
        calls = f"{s.calls_min}-{s.calls_max} calls (mean {s.calls_mean:.2g})"
    parts = [s.role, f"{calls}, fan-out {s.fan_out}", f"{s.token_share:.0%} of tokens"]
    if s.format_error_rate or s.crash_rate:
        parts.append(f"fmt err {s.format_error_rate:.0%}, crash {s.crash_rate:.0%}")
    return sep.join(parts)


def _dot_id(text: str) -> str:
    """A DOT double-quoted string: backslashes and quotes escaped, newlines as DOT's centered line break."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;")


def _grid(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:  # first column left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


# ----- folding rollouts -----------------------------------------------------------------------------------------------
def _role_stats(graphs: list[RolloutGraph]) -> list[RoleStats]:
    """One ``RoleStats`` per role, in first-seen order (see the module docstring for each field)."""
    n = len(graphs)
    order: dict[str, None] = {}
    for g in graphs:
        for role in g.roles:
            order.setdefault(role, None)

    totals = {"all": 0, "completion": 0}
    raw = {}
    for role in order:
        per_rollout = [g.calls_of(role) for g in graphs]
        calls = [c for cs in per_rollout for c in cs]
        counts = [len(cs) for cs in per_rollout]
        prompt = sum(len(c.prompt_ids) for c in calls)
        completion = sum(len(c.completion_ids) for c in calls)
        totals["all"] += prompt + completion
        totals["completion"] += completion
        raw[role] = dict(
            calls_mean=sum(counts) / n, calls_min=min(counts), calls_max=max(counts),
            fan_out=max(g.fan_out(role) for g in graphs),
            prompt_tokens_mean=prompt / len(calls), completion_tokens_mean=completion / len(calls),
            tokens_per_rollout=(prompt + completion) / n,
            format_error_rate=sum(c.status == "format_error" for c in calls) / len(calls),
            crash_rate=sum(c.status == "crash" for c in calls) / len(calls),
            _all=prompt + completion, _completion=completion,
        )
    stats = []
    for role, r in raw.items():
        all_tokens, completion = r.pop("_all"), r.pop("_completion")
        stats.append(RoleStats(
            role=role, **r,
            token_share=all_tokens / totals["all"] if totals["all"] else 0.0,
            completion_share=completion / totals["completion"] if totals["completion"] else 0.0,
        ))
    return stats


def _role_edges(graphs: list[RolloutGraph]) -> list[RoleEdge]:
    """One ``RoleEdge`` per ordered pair of roles linked by a call edge in any rollout, in first-seen order."""
    edge_count: dict[tuple[str, str], int] = {}
    edge_rollouts: dict[tuple[str, str], int] = {}
    for g in graphs:
        seen: set[tuple[str, str]] = set()
        for a, b in g.graph.edges:
            key = (g.graph.nodes[a]["call"].role, g.graph.nodes[b]["call"].role)
            edge_count[key] = edge_count.get(key, 0) + 1
            seen.add(key)
        for key in seen:
            edge_rollouts[key] = edge_rollouts.get(key, 0) + 1
    return [RoleEdge(src=s, dst=d, count=c, rollout_share=edge_rollouts[(s, d)] / len(graphs))
            for (s, d), c in edge_count.items()]
