"""wfc: a DSPy-style declarative compiler for multi-agent LLM workflows.

declare (``wfc.Program``, ``programs/``) -> lower (``wfc.lower``: rollout graphs) -> group / score / update
(``compilers/``: mmGRPO) -> export (``wfc.artifact``) -> serve.
"""

from wfc.artifact import CompiledProgram, load
from wfc.program import Program

__version__ = "0.1.0"


def compile(program, *, trainset, metric, valset=None, model: str = "smollm2-135m", backend="shared", **config):
    """Shortcut for ``compilers.MMGRPO(metric, **config).compile(program, trainset=..., ...)``."""
    from compilers import MMGRPO

    return MMGRPO(metric, **config).compile(program, trainset=trainset, valset=valset, model=model, backend=backend)


__all__ = ["Program", "CompiledProgram", "load", "compile"]
