"""DSPy's fine-tuning on wfc's engine: ``dspy.BootstrapFinetune`` (and anything else that calls ``lm.finetune``) trains
a LoRA adapter of the local model in process, and the fine-tuned LM is a :class:`wfc.lm.LocalLM` handle routed
through that adapter.

    lm = finetunable(LocalLM(engine))                   # the same engine, with this provider
    program.set_lm(lm)
    tuned = dspy.BootstrapFinetune(metric).compile(program, trainset=trainset)
    tuned.predictors()[0].lm.adapter                    # "finetune" (then "finetune_2", ...)

Contract:
- Data: DSPy's chat format (``{"messages": [..., {"role": "assistant", "content": ...}]}``, what
  ``BootstrapFinetune`` builds from its passing traces with the program's adapter). A row's prompt is the engine's own
  encoding of every message but the last (``engine.encode_prompt``, the ids generation conditions on); its completion
  is the assistant's content followed by the tokenizer's EOS, the way the engine ends a finished call.
- Training: the warm start's supervised loop (``compilers.warm_start.fine_tune``: token-mean negative
  log-likelihood of the completions, AdamW states of its own, seeded batches) on a new adapter. The new adapter starts
  from the weights of the adapter the fine-tuned LM runs on (a LocalLM on ``shared`` fine-tunes a copy of
  ``shared``), or from a fresh LoRA on the base model; no existing adapter's weights change.
- Names: ``finetune``, then ``finetune_2``, ... (never one the policy holds). The returned model name is
  ``wfc/<base>@<adapter>``; ``LocalLM.copy(model=...)`` (what DSPy calls with it) routes the copy through it.
- Where the weights live: an HF engine trains its own policy (colocated); any other engine gets a policy of its own
  base, kept by this provider, and the new adapter is handed to the engine (``engine.load_adapters``).
- Seeded: the new LoRA's initial weights and the batches are functions of ``seed`` (a setting, below) and of the
  data as a set: the examples are sorted first, since DSPy gathers them from its threads in the order they finish.
- ``train_kwargs`` (DSPy's per-LM settings) may set ``num_train_epochs``/``epochs``, ``learning_rate``/``lr``,
  ``batch_size``/``per_device_train_batch_size`` and ``seed``; any other key is a ValueError naming these.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping, Sequence

import torch
from dspy.clients.provider import Provider
from dspy.clients.utils_finetune import TrainDataFormat

from compilers.config import GuardsConfig, LoraSettings, UpdateConfig, WarmStartConfig
from compilers.distributed import SingleProcess
from compilers.update import Row
from compilers.warm_start import fine_tune
from wfc.engines.base import Engine
from wfc.lm import LocalLM
from wfc.policy import Policy

TRAIN_KWARGS = {"num_train_epochs": "epochs", "epochs": "epochs", "learning_rate": "learning_rate",
                "lr": "learning_rate", "batch_size": "batch", "per_device_train_batch_size": "batch", "seed": "seed"}
ADAPTER_PREFIX = "finetune"


def chat_rows(engine: Engine, train_data: Sequence[Mapping[str, Any]], adapter: str) -> list[Row]:
    """One supervised row per chat example (module doc: the prompt the engine would condition on, the assistant's
    content then EOS). An example without a final assistant message is a ValueError saying which."""
    tok = engine.tokenizer
    rows = []
    for i, item in enumerate(train_data):
        messages = list(item.get("messages") or [])
        if len(messages) < 2 or messages[-1].get("role") != "assistant":
            raise ValueError(f"train_data[{i}] must be {{'messages': [..., {{'role': 'assistant', ...}}]}} (DSPy's "
                             f"chat format) with at least one prompt message; got roles "
                             f"{[m.get('role') for m in messages]}")
        completion = tok(messages[-1]["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(Row(adapter, adapter, tuple(engine.encode_prompt(messages[:-1])), completion, 1.0))
    return rows


def fresh_adapter(taken: Sequence[str]) -> str:
    """``finetune``, else ``finetune_2``, ``finetune_3``, ...: the first name not in ``taken``."""
    name, k = ADAPTER_PREFIX, 1
    while name in taken:
        k += 1
        name = f"{ADAPTER_PREFIX}_{k}"
    return name


class LocalFinetune(Provider):
    """DSPy's provider interface (``finetunable``) over one wfc engine (module doc). ``epochs``, ``batch`` and
    ``learning_rate`` are the supervised loop's defaults (``train_kwargs`` override them per job); ``lora`` shapes a
    new adapter started from the base model."""

    def __init__(self, engine: Engine, *, epochs: int = 3, batch: int = 16, learning_rate: float = 2e-4,
                 lora: LoraSettings | None = None, seed: int = 0):
        super().__init__()
        self.finetunable = True
        self.engine, self.lora = engine, lora or LoraSettings()
        self.defaults = {"epochs": epochs, "batch": batch, "learning_rate": learning_rate, "seed": seed}
        self._policy: Policy | None = engine.policy
        self._lock = threading.Lock()  # DSPy starts one thread per job; adapters are added and trained one at a time
        self.jobs: list[dict[str, Any]] = []  # per finished job: adapter, started from, rows, loss before/after

    def __deepcopy__(self, memo):
        return self  # a handle on the engine's policy, like the LocalLM it belongs to

    def settings(self, train_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        unknown = sorted(set(train_kwargs or {}) - set(TRAIN_KWARGS))
        if unknown:
            raise ValueError(f"train_kwargs {unknown} are not used by wfc's fine-tuning; known: {sorted(TRAIN_KWARGS)}")
        return {**self.defaults, **{TRAIN_KWARGS[k]: v for k, v in (train_kwargs or {}).items()}}

    def policy(self) -> Policy:
        if self._policy is None:  # an engine without a trainable policy of its own (vLLM): train one beside it
            self._policy = Policy(self.engine.handle)
        return self._policy

    def finetune(self, job, model: str, train_data: list[dict[str, Any]], train_data_format,
                 train_kwargs: dict[str, Any] | None = None) -> str:
        if train_data_format not in (TrainDataFormat.CHAT, TrainDataFormat.CHAT.value):
            raise ValueError(f"wfc fine-tunes chat data (TrainDataFormat.CHAT), got {train_data_format!r}: run "
                             "BootstrapFinetune with a ChatAdapter-based adapter (ChatAdapter, wfc's compact one)")
        if not train_data:
            raise ValueError("no training data: BootstrapFinetune kept no passing trace (check the metric, or "
                             "bootstrap from a stronger teacher=)")
        opts = self.settings(train_kwargs)
        base, _, start = model.partition("@")
        with self._lock:
            policy = self.policy()
            if start and start not in policy.adapters:
                raise ValueError(f"the LM runs on adapter {start!r}, which this engine holds but no trainable policy "
                                 "does: fine-tune from the base model (a LocalLM with adapter=None) or on an HF engine")
            name = fresh_adapter(policy.adapters)
            # DSPy gathers the data from its worker threads, in whatever order they finish: sorted, the seeded
            # batches do not depend on thread timing
            data = sorted(train_data, key=lambda d: json.dumps(d, sort_keys=True, default=str))
            with torch.random.fork_rng():  # the LoRA init and any dropout draw from the seed; no one else's draws move
                torch.manual_seed(opts["seed"])
                policy.add_adapter(name, policy.lora_config(start) if start else self.lora.peft_config())
                if start:
                    policy.restore_adapter(name, policy.adapter_state(start))
                rows = chat_rows(self.engine, data, name)
                result = fine_tune(policy, rows, config=WarmStartConfig(warm_start_epochs=opts["epochs"],
                                                                        warm_start_batch=opts["batch"]),
                                   update=UpdateConfig(), guards=GuardsConfig(), temperature=1.0, seed=opts["seed"],
                                   rates={name: opts["learning_rate"]}, distributed=SingleProcess())
            if policy is not self.engine.policy:
                self.engine.load_adapters(policy.export([name]))
            self.jobs.append({"adapter": name, "from": start or None, "rows": len(rows), **result})
        return f"{base}@{name}"


def finetunable(lm: LocalLM, **settings: Any) -> LocalLM:
    """A handle of ``lm`` (same engine, adapter and counters) whose ``finetune`` trains on the local model
    (:class:`LocalFinetune` with ``settings``)."""
    return lm.copy(provider=LocalFinetune(lm.wfc_engine, **settings))
