"""Adapters on disk: one LoRA adapter as a standard PEFT directory (``adapter_config.json`` +
``adapter_model.safetensors``), the format an artifact stores and a vLLM engine hands to vLLM.

Invariant: a directory written here loads with peft's ``PeftModel.load_adapter`` and with vLLM's ``LoRARequest`` as
it is (tensors contiguous, peft state-dict keys, safetensors metadata ``format=pt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_adapter(config, state: dict[str, Any], path: Path) -> None:
    """Write one adapter (its peft ``LoraConfig`` and its tensors, peft-keyed) in standard PEFT format, loadable by
    peft and vLLM as it is. ``write_adapter(rev.config, rev.tensors, path)`` writes an exported ``AdapterRevision``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "adapter_model.safetensors"),
              metadata={"format": "pt"})
