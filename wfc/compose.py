"""Composing a trained role into another program: one role of a compiled artifact, with everything it was trained
with, moved onto a role of a program the artifact was not compiled as (a writer trained alone, run inside a
program that checks and fixes its code; a solver trained in one topology, run in another).

What a role carries: its static demos, its demo retriever (``wfc.retrieve``: the demos chosen per run) and the
adapter it runs on. :func:`carry_role` puts the first two on the target role in place and returns the adapter, which
the caller routes the target role to (``adapters={path: adapter}`` for ``compilers.evaluate`` or ``wfc.lower.bind``);
the artifact itself is left unchanged. The target role should take the same inputs as the trained one, or its demos
and retrieved examples will not fit its prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import dspy

from wfc.retrieve import install, retrievers

if TYPE_CHECKING:
    from wfc.artifact import CompiledProgram


def pick_role(roles: Mapping[str, str | None], role: str | None = None, *, default: str = "generator") -> str:
    """The artifact role to carry: ``role`` when given, else the artifact's only role, else ``default``.
    ``ValueError`` naming the artifact's roles when that role is not one of them."""
    if role is None:
        role = next(iter(roles)) if len(roles) == 1 else default
    if role not in roles:
        raise ValueError(f"the artifact has no role {role!r}; its roles are {sorted(roles)}: name one of them")
    return role


def carry_role(compiled: CompiledProgram, role: str, program: dspy.Module, path: str) -> str | None:
    """Give ``program``'s role ``path`` (in place) the static demos and the demo retriever that ``compiled``'s role
    ``role`` has, so the role is prompted as it was trained, and return the adapter ``role`` runs on (None: the base
    model) for the caller to route ``path`` to. ``ValueError`` when either role does not exist."""
    source = dict(compiled.program.named_predictors())
    target = dict(program.named_predictors())
    if role not in source:
        raise ValueError(f"the artifact has no role {role!r}; its roles are {sorted(source)}")
    if path not in target:
        raise ValueError(f"the program has no role {path!r}; its roles are {sorted(target)}")
    target[path].demos = list(source[role].demos)
    found = retrievers(compiled.program)
    if role in found:
        install(program, {path: found[role]})
    return compiled.roles.get(role)
