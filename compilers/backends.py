"""Backends: which adapter each role trains. A plan maps every role path to an adapter name.

- ``"shared"``: one adapter, ``shared``, for every role.
- ``"isolated"``: one adapter per role, named after the role path (dots become ``__``: peft module keys cannot
  hold dots; if two paths would get one name, the later one gets a ``_2``, ``_3``, ... suffix).
- a dict ``{role path: group name}``: any partition of the roles into adapters (every role must be named, group
  names are non-empty strings; the adapter is the group name made peft-safe).
- ``"auto"``: chosen from traced rollouts before training (``compilers.auto.plan``), which returns a plan of one
  of the kinds above with its reasons.

All adapters live on one resident base model; each has its own optimizer state (``compilers.update``), trains only
on its roles' groups, and rollouts route every request to its role's adapter inside mixed-adapter batches.

Invariant: the role path is the key; adapters are never keyed by signature (two roles built from one Signature
class are two roles, and under ``isolated`` two adapters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass
class BackendPlan:
    """A resolved backend: ``spec`` (what to store and show: ``"shared"``, ``"isolated"`` or a role -> group dict),
    ``role_adapters`` (role path -> adapter name) and the ``reasons`` for the choice. ``role_graph`` is set by
    ``compilers.auto.plan`` (the traced statistics the choice rests on)."""

    spec: Any
    role_adapters: dict[str, str]
    reasons: list[str] = field(default_factory=list)
    role_graph: Any = None

    @property
    def adapters(self) -> list[str]:
        return list(dict.fromkeys(self.role_adapters.values()))

    @property
    def kind(self) -> str:
        return self.spec if isinstance(self.spec, str) else "grouped"

    def describe(self) -> str:
        """Human-readable decision: kind, role -> adapter table, reasons (and the traced role graph if any)."""
        width = max(len(r) for r in self.role_adapters) if self.role_adapters else 4
        lines = [f"backend: {self.kind} ({len(self.adapters)} adapter{'s' if len(self.adapters) != 1 else ''})"]
        lines += [f"  {role.ljust(width)}  -> {adapter}" for role, adapter in self.role_adapters.items()]
        if self.reasons:
            lines.append("reasons:")
            lines += [f"  - {r}" for r in self.reasons]
        if self.role_graph is not None:
            lines += ["", str(self.role_graph)]
        return "\n".join(lines)


def adapter_name(label: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", label.replace(".", "__"))
    return name if name and not name[0].isdigit() else f"a_{name}"


def _shared(role_paths: Sequence[str]) -> BackendPlan:
    return BackendPlan("shared", {r: "shared" for r in role_paths}, ["backend=shared: one adapter for all roles"])


def _isolated(role_paths: Sequence[str]) -> BackendPlan:
    taken: dict[str, int] = {}
    out = {}
    for r in role_paths:
        name = adapter_name(r)
        taken[name] = taken.get(name, 0) + 1
        out[r] = name if taken[name] == 1 else f"{name}_{taken[name]}"
    return BackendPlan("isolated", out, ["backend=isolated: one adapter per role"])


def _grouped(partition: Mapping[str, Any], role_paths: Sequence[str]) -> BackendPlan:
    missing = [r for r in role_paths if r not in partition]
    unknown = [r for r in partition if r not in role_paths]
    if missing or unknown:
        raise ValueError(f"backend partition must name every role exactly: missing {missing}, unknown {unknown}; "
                         f"roles are {list(role_paths)}")
    bad = {r: g for r, g in partition.items() if not isinstance(g, str) or not g.strip()}
    if bad:
        raise ValueError(f"backend partition maps roles to group names (non-empty strings); got {bad}. "
                         "Example: {'solver': 'a', 'judge': 'b', 'reviser': 'a'}")
    names: dict[str, str] = {}
    for g in dict.fromkeys(partition[r] for r in role_paths):
        other = names.setdefault(adapter_name(g), g)
        if other != g:
            raise ValueError(f"groups {other!r} and {g!r} would both become adapter {adapter_name(g)!r}; rename one")
    spec = {r: partition[r] for r in role_paths}
    return BackendPlan(spec, {r: adapter_name(partition[r]) for r in role_paths},
                       ["backend=grouped: roles partitioned by the user"])


# name -> plan builder. Small registry: a new named backend is one entry.
BACKENDS: dict[str, Callable[[Sequence[str]], BackendPlan]] = {"shared": _shared, "isolated": _isolated}


def resolve_backend(backend: Any, role_paths: Sequence[str]) -> BackendPlan:
    """The plan for a named backend or a dict partition (``"auto"`` needs traced rollouts: ``compilers.auto``)."""
    if isinstance(backend, BackendPlan):
        if set(backend.role_adapters) != set(role_paths):
            raise ValueError(f"backend plan covers roles {sorted(backend.role_adapters)}, the program has "
                             f"{sorted(role_paths)}: make the plan for this program")
        return backend
    if isinstance(backend, Mapping):
        return _grouped(backend, role_paths)
    if isinstance(backend, str) and backend in BACKENDS:
        return BACKENDS[backend](role_paths)
    if backend == "auto":
        raise ValueError("backend='auto' is chosen from traced rollouts: call compilers.auto.plan(program, examples, "
                         "engine) or pass backend='auto' to MMGRPO.compile")
    raise ValueError(f"backend must be one of {sorted(BACKENDS) + ['auto']} or a dict role -> group, got {backend!r}")


def fresh_names(plan: BackendPlan, taken: Sequence[str]) -> BackendPlan:
    """``plan`` with every adapter whose name is in ``taken`` (adapters the policy already holds: an earlier compile
    on the same engine, e.g. a second weight step of ``dspy.BetterTogether``) renamed ``name-2``, ``name-3``, ...,
    so a compile never overwrites weights another program still routes to. Unchanged when nothing collides."""
    taken, renamed = set(taken), {}
    for name in plan.adapters:
        new, k = name, 1
        while new in taken:
            k += 1
            new = f"{name}-{k}"
        renamed[name] = new
        taken.add(new)
    if all(k == v for k, v in renamed.items()):
        return plan
    reasons = plan.reasons + [f"adapter {k!r} exists on the engine already: trained as {v!r}"
                              for k, v in renamed.items() if k != v]
    return BackendPlan(plan.spec, {r: renamed[a] for r, a in plan.role_adapters.items()}, reasons, plan.role_graph)
