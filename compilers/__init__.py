"""Optimizers that compile workflow programs: mmGRPO (multi-module GRPO on LoRA adapters)."""

from compilers.config import LoraSettings, MMGRPOConfig
from compilers.mmgrpo import MMGRPO, evaluate

__all__ = ["MMGRPO", "MMGRPOConfig", "LoraSettings", "evaluate", "compile"]


def compile(program, *, trainset, metric, valset=None, model: str = "smollm2-135m", backend="shared", **config):
    """Shortcut for ``MMGRPO(metric, **config).compile(program, trainset=..., ...)``."""
    return MMGRPO(metric, **config).compile(program, trainset=trainset, valset=valset, model=model, backend=backend)
