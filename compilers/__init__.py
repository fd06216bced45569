"""Optimizers that compile workflow programs: mmGRPO (multi-module GRPO on LoRA adapters)."""

from compilers.config import LoraSettings, MMGRPOConfig
from compilers.mmgrpo import MMGRPO, evaluate

__all__ = ["MMGRPO", "MMGRPOConfig", "LoraSettings", "evaluate"]
