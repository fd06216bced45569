"""SDPA attention that broadcasts grouped key/value heads inside the kernel instead of copying them (CPU).

Models with grouped-query attention (SmolLM2-135M: 9 query heads, 3 key/value heads) reach transformers' ``sdpa``
attention with fewer key/value heads than query heads. With an attention mask (every padded batch has one) and no
XPU/MPS device, transformers first copies each key/value head ``groups`` times (``repeat_kv``) and then calls
``scaled_dot_product_attention``; in a decode step that copy is the whole key/value cache of every row, in every
layer, for one query token. Measured on the 2-core CPU (torch 2.13, ``benchmarks/bench_gqa_attention.py``): a
132-row decode step's attention 6.4 ms per layer with the copy, 0.9 ms with ``enable_gqa=True``, and the outputs are
bit-identical, so a rollout samples exactly the same tokens either way.

:data:`GQA_SDPA` names that variant in transformers' attention registry (``AttentionInterface``, with the ``sdpa``
mask builder under the same name). :func:`use_gqa_sdpa` switches one model to it where it helps: on the CPU, for
a model now on ``sdpa``. On CUDA, PyTorch's fused kernels take no mask with ``enable_gqa`` and would fall back to the
slow math kernel, so models there keep transformers' own choice. Registration only adds a name to transformers'
registries (it changes no existing entry), so other models in the process are untouched.
"""

from __future__ import annotations

from typing import Any

import torch

GQA_SDPA = "wfc_sdpa_gqa"


def gqa_sdpa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                               is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Q, D), key/value (B, H_kv, K, D), H a multiple of
    H_kv; returns (B, Q, H, D). Whatever this variant does not cover (a position bias, a paged cache, attention
    weights asked for) goes to transformers' own ``sdpa`` function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # as transformers decides it: the causal flag only where a prefill runs without a mask
    is_causal = query.shape[2] > 1 and attention_mask is None and bool(is_causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Add :data:`GQA_SDPA` to transformers' attention and mask registries (idempotent: the same function each
    time)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention_forward)
    AttentionMaskInterface.register(GQA_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_gqa_sdpa(model: torch.nn.Module, device: torch.device | str) -> bool:
    """Switch ``model`` (a transformers model, or a peft model wrapping one: its base model is switched) to
    :data:`GQA_SDPA` when it runs on the CPU with ``sdpa``; returns whether it did. Anything else (eager, flash,
    CUDA) is left as it is."""
    # by the wrapper's own method: a handle's model that a policy already wrapped carries ``peft_config`` itself,
    # so Policy.base_model's test would take it for the wrapper
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if torch.device(device).type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    base.set_attn_implementation(GQA_SDPA)
    return config._attn_implementation == GQA_SDPA
