"""Inference engines behind one protocol (see ``base``). Only ``wfc/engines/vllm.py`` may import vllm."""

from wfc.engines.base import Engine, Generation, GenerationRequest, SamplingParams
from wfc.engines.fake import ScriptedEngine

__all__ = ["Engine", "Generation", "GenerationRequest", "SamplingParams", "ScriptedEngine", "make_engine"]


def make_engine(kind: str, model, **kwargs) -> Engine:
    """Build an engine by name: ``hf`` (transformers + peft, the default) or ``vllm`` (optional extra)."""
    if kind == "hf":
        from wfc.engines.hf import HFEngine

        return HFEngine(model, **kwargs)
    if kind == "vllm":
        try:
            from wfc.engines.vllm import VLLMEngine
        except ImportError as exc:
            raise ValueError(f"engine 'vllm' needs the optional extra: pip install -e '.[vllm]' ({exc})") from exc
        return VLLMEngine(model, **kwargs)
    raise ValueError(f"unknown engine {kind!r}: use 'hf' or 'vllm'")
