"""Adapters on disk: one LoRA adapter as a standard PEFT directory (``adapter_config.json`` +
``adapter_model.safetensors``), the format an artifact stores and a vLLM engine hands to vLLM.

Invariant: a directory written here loads with peft's ``PeftModel.load_adapter`` and with vLLM's ``LoRARequest`` as
it is (tensors contiguous, peft state-dict keys, safetensors metadata ``format=pt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig


def write_adapter(config, state: dict[str, Any], path: Path) -> None:
    """Write one adapter (its peft ``LoraConfig`` and its tensors, peft-keyed) in standard PEFT format, loadable by
    peft and vLLM as it is. ``write_adapter(rev.config, rev.tensors, path)`` writes an exported ``AdapterRevision``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "adapter_model.safetensors"),
              metadata={"format": "pt"})


def write_zero_adapter(model, path: Path) -> None:
    """Write a PEFT adapter of rank 1 with all-zero weights on one projection of every layer of ``model`` (a
    transformers causal LM, possibly wrapped in peft) to ``path``: loaded as a LoRA it changes no output."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # a policy may have put LoRA layers on this model already: name each projection as the plain model does
    linears = [(n.removesuffix(".base_layer"), m) for n, m in base.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}" and "lora_" not in n]
    if not linears:
        raise ValueError("found no layer projections in the base model to hang the zero adapter on")
    leaf = linears[0][0].rsplit(".", 1)[-1]
    tensors = {}
    for name, module in linears:
        if name.rsplit(".", 1)[-1] == leaf:
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.zeros(1, module.in_features)
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.zeros(module.out_features, 1)
    write_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=[leaf], lora_dropout=0.0), tensors, path)
