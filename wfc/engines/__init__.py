"""Inference engines behind one protocol (see ``base``). Only ``wfc/engines/vllm.py`` may import vllm (the
``vllm-server`` engine talks HTTP to ``vllm serve`` processes, and starts them as subprocesses when asked)."""

from wfc.engines.base import AdapterRevision, Engine, Generation, GenerationRequest, SamplingParams
from wfc.engines.fake import ScriptedEngine
from wfc.engines.hf import HFEngine
from wfc.engines.vllm_server import VLLMServerEngine

__all__ = ["ENGINES", "AdapterRevision", "Engine", "Generation", "GenerationRequest", "SamplingParams", "ScriptedEngine", "make_engine"]

ENGINES = ("hf", "vllm", "vllm-server")


def make_engine(kind: str, model, **kwargs) -> Engine:
    """Build an engine by name: ``hf`` (transformers + peft, the default), ``vllm`` (in-process vLLM; optional
    extra) or ``vllm-server`` (running vLLM servers: ``servers=[URL, ...]``; ``launch=N`` starts N local ones as
    well, and with no ``servers`` one is started; see :mod:`wfc.engines.vllm_server`)."""
    if kind == "hf":
        return HFEngine(model, **kwargs)
    if kind == "vllm":
        try:  # the one import deferred: wfc.engines.vllm imports vllm, an optional extra
            from wfc.engines.vllm import VLLMEngine
        except ImportError as exc:
            raise ValueError(f"engine 'vllm' needs the optional extra: pip install -e '.[vllm]' ({exc})") from exc
        return VLLMEngine(model, **kwargs)
    if kind == "vllm-server":
        servers = list(kwargs.pop("servers", None) or [])
        launch = kwargs.pop("launch", None)
        if servers and not launch:
            return VLLMServerEngine(model, servers=servers, **kwargs)
        return VLLMServerEngine.launch(model, n=launch or 1, servers=servers, **kwargs)
    raise ValueError(f"unknown engine {kind!r}: use one of {', '.join(ENGINES)}")
