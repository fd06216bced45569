"""Backends: which adapter each role trains. A plan maps every role path to an adapter name.

- ``"shared"``: one adapter, ``shared``, for every role.
- ``"isolated"``: one adapter per role, named after the role path (dots become ``__``: peft module keys cannot
  hold dots).
- a dict ``{role path: group name}``: any partition of the roles into adapters (every role must be named).

Invariant: the role path is the key; adapters are never keyed by signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass
class BackendPlan:
    spec: Any
    role_adapters: dict[str, str]
    reasons: list[str] = field(default_factory=list)

    @property
    def adapters(self) -> list[str]:
        return list(dict.fromkeys(self.role_adapters.values()))


def adapter_name(label: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", label.replace(".", "__"))
    return name if name and not name[0].isdigit() else f"a_{name}"


def resolve_backend(backend: Any, role_paths: Sequence[str]) -> BackendPlan:
    if backend == "shared":
        return BackendPlan("shared", {r: "shared" for r in role_paths}, ["backend=shared: one adapter for all roles"])
    if backend == "isolated":
        return BackendPlan("isolated", {r: adapter_name(r) for r in role_paths},
                           ["backend=isolated: one adapter per role"])
    if isinstance(backend, Mapping):
        missing = [r for r in role_paths if r not in backend]
        unknown = [r for r in backend if r not in role_paths]
        if missing or unknown:
            raise ValueError(f"backend partition must name every role exactly: missing {missing}, unknown {unknown}; "
                             f"roles are {list(role_paths)}")
        return BackendPlan(dict(backend), {r: adapter_name(str(backend[r])) for r in role_paths},
                           ["backend=grouped: roles partitioned by the user"])
    raise ValueError(f"backend must be 'shared', 'isolated' or a dict role -> group, got {backend!r}")
