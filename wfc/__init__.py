"""wfc: a DSPy-style declarative compiler for multi-agent LLM workflows.

declare (``wfc.Program``, ``programs/``) -> lower (``wfc.lower``: rollout graphs) -> group / score / update
(``compilers/``: mmGRPO) -> export (``wfc.artifact``) -> serve.

This package's ``__init__`` runs before any ``wfc`` module, so it imports only from below (the artifact); the compile
shortcut is ``compilers.compile``, beside the optimizer it calls (``tests/test_layers.py`` lists the layers).
"""

from wfc.artifact import CompiledProgram, load
from wfc.program import Program

__version__ = "0.1.0"

__all__ = ["Program", "CompiledProgram", "load"]


def __getattr__(name: str):
    if name == "compile":  # the shortcut moved up to the optimizers it calls: wfc itself never imports them
        raise AttributeError("wfc.compile moved to compilers.compile: `from compilers import compile`, or "
                             "compilers.MMGRPO(metric, **config).compile(program, trainset=...)")
    raise AttributeError(f"module 'wfc' has no attribute {name!r}")
