"""A dspy LM on wfc's engine: any DSPy program, optimizer or ``dspy.Evaluate`` runs on the local model in process.

    lm = LocalLM("smollm2-135m")                 # a colocated HF engine on the embedded model
    dspy.configure(lm=lm)                        # or program.set_lm(lm); LocalLM(engine, adapter="shared")
    dspy.Evaluate(devset=..., metric=..., num_threads=16)(program)

Contract:
- One engine, many handles: ``LocalLM(engine, adapter=...)`` routes every call through that LoRA adapter of the
  engine (``None``: the base model). Copies of the LM (``lm.copy()``, ``copy.deepcopy`` by optimizers that copy
  programs) share the engine and the counters; they never copy the model.
- Batching: calls from DSPy's threads go to the engine's ``submit``, which batches the concurrent requests into one
  ``generate``; a call blocks only its own thread.
- Structured decoding (``wfc.constrain``): a call made by a DSPy adapter (``ChatAdapter``, ``JSONAdapter``, wfc's
  compact adapter) follows the grammar of the signature that adapter formats, so it parses by construction; a ReAct
  agent's tool step is constrained to its tools. The signature is read from the adapter call that made the request
  (the DSPy 3.4 engine interface passes only messages); a call made outside an adapter (``lm("text")``) is free.
  ``decoding=Decoding(structured=False)`` turns it off.
- Counting: ``lm.usage()`` gives calls, prompt tokens and completion tokens over every handle of this LM, and every
  ``Response`` carries its own usage, so DSPy's usage tracking works.
- Fine-tuning: ``lm.copy(model="wfc/<base>@<adapter>")`` (what DSPy does with a provider's result) is a handle
  routed through that adapter; ``compilers.finetune.finetunable(lm)`` gives the LM a provider that trains one.
- ``temperature`` / ``max_tokens`` are defaults; a call's own ``config`` (DSPy's ``lm_kwargs``) overrides them.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Mapping

import dspy
from dspy.adapters.base import Adapter
from dspy.lm15 import Message, Response, TextPart, Usage

from wfc.constrain import react_tools
from wfc.engines.base import Engine, GenerationRequest, SamplingParams
from wfc.engines.hf import HFEngine
from wfc.lower import Decoding, call_grammar, request_messages

_MAX_FRAMES = 64  # how far up the stack a call looks for the DSPy adapter that made it


class _Counter:
    """Calls and tokens over every handle of one LocalLM (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = self.prompt_tokens = self.completion_tokens = 0

    def add(self, prompt: int, completion: int) -> None:
        with self._lock:
            self.calls += 1
            self.prompt_tokens += prompt
            self.completion_tokens += completion

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"calls": self.calls, "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens}


def calling_signature(max_frames: int = _MAX_FRAMES) -> tuple[Any, Adapter, dict | None] | None:
    """``(signature, adapter, tools)`` of the DSPy adapter call on this thread's stack that is asking the LM, or None.

    ``signature`` is the one the adapter formats (``processed_signature`` where DSPy rewrote it); ``tools`` is the
    tool table (``wfc.constrain.react_tools``) when that call is a ReAct agent's step. Why the stack: DSPy 3.4 hands a
    custom engine the formatted messages only, and the grammar needs the signature's fields and types."""
    frame = sys._getframe(1)
    found = None
    for _ in range(max_frames):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if found is None and isinstance(owner, Adapter) and frame.f_code.co_name in ("__call__", "acall"):
            signature = frame.f_locals.get("processed_signature") or frame.f_locals.get("signature")
            if signature is not None:
                found = (signature, owner)
        elif found is not None and isinstance(owner, dspy.ReAct):
            if owner.react.signature is found[0] or owner.react.signature == found[0]:
                return found[0], found[1], react_tools(owner)
            break
        frame = frame.f_back
    return None if found is None else (found[0], found[1], None)


class _Bridge:
    """DSPy's custom engine object (``complete(Request) -> Response``) over a wfc engine and one adapter."""

    def __init__(self, engine: Engine, adapter: str | None, decoding: Decoding, counter: _Counter):
        self.engine, self.adapter, self.decoding, self.counter = engine, adapter, decoding, counter

    def __deepcopy__(self, memo):
        return self  # a handle: programs copied by optimizers keep calling the one resident engine

    def complete(self, request):
        messages = request_messages(request)
        cfg = request.config
        sampling = SamplingParams(temperature=cfg.temperature or 0.0, max_tokens=cfg.max_tokens or 256,
                                  top_p=cfg.top_p or 1.0, stop=tuple(cfg.stop or ()))
        grammar = None
        caller = calling_signature() if self.decoding.structured else None
        if caller is not None:
            signature, parser, tools = caller
            grammar = call_grammar(signature, parser, max_tokens=sampling.max_tokens, decoding=self.decoding,
                                   tools=tools)
        gen = self.engine.submit(GenerationRequest(messages=tuple(messages), adapter=self.adapter, sampling=sampling,
                                                   seed=cfg.seed, grammar=grammar)).result()
        self.counter.add(len(gen.prompt_ids), len(gen.completion_ids))
        usage = Usage(input_tokens=len(gen.prompt_ids), output_tokens=len(gen.completion_ids),
                      total_tokens=len(gen.prompt_ids) + len(gen.completion_ids))
        return Response(id=None, model=f"wfc/{self.adapter or 'base'}", message=Message.assistant([TextPart(gen.text)]),
                        finish_reason="length" if gen.finish_reason == "length" else "stop", usage=usage)

    def close(self) -> None:
        pass  # the engine belongs to whoever made it


class LocalLM(dspy.LM):
    """A ``dspy.LM`` (so a ``dspy.BaseLM``) whose calls run on a wfc engine, through one adapter (module doc).

    ``engine``: a wfc engine, or a model name (``"smollm2-135m"``, a local path) for a new colocated HF engine.
    ``adapter``: the LoRA adapter every call routes through (None: the base model)."""

    def __init__(self, engine: Engine | str = "smollm2-135m", *, adapter: str | None = None,
                 decoding: Decoding = Decoding(), temperature: float = 0.0, max_tokens: int = 256,
                 provider: dspy.Provider | None = None, _counter: _Counter | None = None):
        if isinstance(engine, str):
            engine = HFEngine(engine)
        if not callable(getattr(engine, "submit", None)):
            raise TypeError(f"engine must be a wfc engine (with submit) or a model name, got {type(engine).__name__}")
        self.wfc_engine, self.adapter, self.decoding = engine, adapter, decoding
        self._counter = _counter or _Counter()
        name = engine.handle.name if engine.handle is not None else type(engine).__name__
        super().__init__(model=f"wfc/{name}" + (f"@{adapter}" if adapter else ""),
                         engine=_Bridge(engine, adapter, decoding, self._counter), cache=False, num_retries=0,
                         temperature=temperature, max_tokens=max_tokens, provider=provider)

    def __deepcopy__(self, memo):
        new = self.copy()  # DSPy's runtime copy: shares the engine, the bridge and the counters (module doc)
        memo[id(self)] = new
        return new

    def copy(self, **kwargs) -> "LocalLM":
        """DSPy's runtime copy; a new ``model`` of the form ``wfc/<base>@<adapter>`` (what a fine-tuning provider
        returns) routes the copy through that adapter of the same engine; another base is a ValueError."""
        model = kwargs.pop("model", None)
        if model is None or model == self.model:
            return super().copy(**kwargs)
        base, _, adapter = model.partition("@")
        if base != self.model.partition("@")[0]:
            raise ValueError(f"a LocalLM copy stays on its engine's base {self.model.partition('@')[0]!r}; got "
                             f"model={model!r} (make a LocalLM on another engine instead)")
        return self.with_adapter(adapter or None).copy(**kwargs)

    def with_adapter(self, adapter: str | None) -> "LocalLM":
        """A handle on the same engine (counters and provider) routed through ``adapter``."""
        return LocalLM(self.wfc_engine, adapter=adapter, decoding=self.decoding,
                       temperature=self.kwargs.get("temperature", 0.0), max_tokens=self.kwargs.get("max_tokens", 256),
                       provider=self.provider, _counter=self._counter)

    def usage(self) -> dict[str, int]:
        """Calls, prompt tokens and completion tokens over every handle sharing this LM's counters."""
        return self._counter.snapshot()


def set_role_lms(program: dspy.Module, lm: LocalLM, adapters: Mapping[str, str | None]) -> dspy.Module:
    """Give every predictor of ``program`` (in place) a handle of ``lm`` routed through its role's adapter
    (``adapters``: role path -> adapter name, as ``CompiledProgram.roles``; a role not in it runs on the base)."""
    for path, predictor in program.named_predictors():
        predictor.lm = lm.with_adapter(adapters.get(path))
    return program


def engine_of(program: dspy.Module) -> Engine | None:
    """The one wfc engine behind ``program``'s predictors' ``LocalLM`` handles (None when none has one); an error when
    they name several engines (compile needs the one that will hold the adapters)."""
    engines = {id(p.lm.wfc_engine): p.lm.wfc_engine for _, p in program.named_predictors()
               if isinstance(getattr(p, "lm", None), LocalLM)}
    if len(engines) > 1:
        raise ValueError("the program's predictors hold LocalLMs on different engines: give them one engine "
                         "(LocalLM(engine).with_adapter(...)) or pass engine= to compile")
    return next(iter(engines.values()), None)
