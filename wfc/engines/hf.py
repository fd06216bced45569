"""The HF engine: transformers generate + peft multi-LoRA, with request batching across threads.

Concurrent requests are batched by :class:`wfc.engines.batching.BatchingEngine`; rows with different adapters share
one ``generate`` call through peft's ``adapter_names``. Rows are grouped only by sampling settings, since one
``generate`` call has one generation config.

Adapters live on the policy's one resident base model (:class:`wfc.policy.Policy`: a ``PeftModel`` once the first
adapter exists). A colocated trainer updates adapter weights in place on that same object, so the next rollouts use
them with no reload; it holds the policy's lock while it does, and so does generation, which keeps generation out of
a half-updated model. Inputs go to the policy's device.

Log-probs are recorded while sampling (a logits processor that sees the raw logits before any warper), under the
temperature-scaled distribution (T=1 for greedy requests). No full (B, T, V) logits tensor is ever kept.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from wfc.engines.base import AdapterRevision, Generation, GenerationRequest, SamplingParams
from wfc.engines.batching import BatchingEngine
from wfc.models import ModelHandle
from wfc.policy import Policy

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch


class _LogprobRecorder:
    """Logits processor that records log p(token) of each sampled token, one (B,) tensor per step."""

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0
        self.prev: torch.Tensor | None = None  # (B, V) log-probs of the step whose token is not yet known
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, sequences[:, -1:]).squeeze(1))
            self.prev = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(sequences.shape[0], 0)  # (B, R)


class HFEngine(BatchingEngine):
    """transformers + peft engine on a :class:`wfc.policy.Policy`'s model.

    ``HFEngine("tiny")`` (a name for :func:`wfc.models.load_model`, or a loaded handle) builds its own policy on
    ``device``; ``HFEngine(policy=policy)`` shares a trainer's policy in process (colocated). Either way generation
    reads the policy's adapters in place, under its lock, so :meth:`load_adapters` has nothing to do."""

    engine_name = "hf"

    def __init__(
        self,
        model: str | ModelHandle | None = None,
        *,
        policy: Policy | None = None,
        device: str = "auto",
        max_batch: int = 256,
        batch_wait_s: float = 0.05,
        default_stop: tuple[str, ...] = (),
        share_prefill: bool = True,
    ):
        super().__init__(max_batch=max_batch, batch_wait_s=batch_wait_s)
        if policy is not None and model is not None:
            raise ValueError("pass model or policy to HFEngine, not both: a policy already holds its base model")
        self.policy = policy if policy is not None else Policy(model or "smollm2-135m", device=device)
        self.default_stop = tuple(default_stop)
        self.share_prefill = share_prefill
        self.stats = {"generate_calls": 0, "rows": 0, "batch_sizes": []}

    # ----- read-only views of the policy ----------------------------------------------------------------------
    @property
    def handle(self) -> ModelHandle:
        return self.policy.handle

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    @property
    def adapters(self) -> list[str]:
        return self.policy.adapters

    def load_adapters(self, revisions: Sequence[AdapterRevision]) -> None:
        """No-op: this engine generates on its policy's model, so the trainer's changes are already in place. The
        revisions must name adapters of that policy (a trainer with another policy must share this one)."""
        missing = sorted({r.name for r in revisions} - set(self.adapters))
        if missing:
            raise ValueError(f"HFEngine shares its policy's weights, which have no adapter(s) {missing}: train with "
                             "that policy (HFEngine(policy=...) / compile(policy=engine.policy))")

    def _render(self, messages) -> str:
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)

    def encode_prompt(self, messages) -> list[int]:
        """The exact prompt ids this engine conditions on for ``messages``."""
        return self.tokenizer(self._render(messages), add_special_tokens=False)["input_ids"]

    def _generate_batch(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        # Rows in a canonical order (by prompt, then adapter; equal requests keep their order): the random numbers a
        # sampled row draws from torch's global generator then depend on the batch's contents, not on which thread
        # submitted first, so a seeded compile (and a resumed one) samples the same tokens every run.
        order = sorted(range(len(requests)), key=lambda i: (self._render(requests[i].messages),
                                                            requests[i].adapter or ""))
        results = self._generate_rows([requests[i] for i in order], sampling)
        out: list[Generation] = [None] * len(requests)  # type: ignore[list-item]
        for row, i in enumerate(order):
            out[i] = results[row]
        return out

    def _generate_rows(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        tok = self.tokenizer
        texts = [self._render(r.messages) for r in requests]
        enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        stop = tuple(sampling.stop) + self.default_stop
        recorder = _LogprobRecorder(sampling.temperature)
        kwargs: dict[str, Any] = dict(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            max_new_tokens=sampling.max_tokens,
            do_sample=not sampling.greedy,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            logits_processor=[recorder],
            num_beams=1,
        )
        if not sampling.greedy:  # top_k=0: sample from the full distribution the recorded log-probs describe
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=tok)
        device = self.policy.device
        kwargs["input_ids"], kwargs["attention_mask"] = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        wanted = [r.adapter for r in requests]
        if any(a is not None for a in wanted):
            missing = sorted({a for a in wanted if a is not None} - set(self.adapters))
            if missing:
                raise ValueError(f"unknown adapter(s) {missing}; this engine has {self.adapters or 'none'}")
        policy = self.policy
        if policy.is_peft:
            kwargs["adapter_names"] = [a if a is not None else BASE_ADAPTER for a in wanted]
        with policy.lock, torch.inference_mode():
            model = policy.model
            model.eval()
            if self.share_prefill:
                self._prefill_shared(model, kwargs, requests)
            out = model.generate(**kwargs)
            logprobs = recorder.finish(out).cpu()  # (B, R)
            out = out.cpu()
        self.stats["generate_calls"] += 1
        self.stats["rows"] += len(requests)
        self.stats["batch_sizes"].append(len(requests))
        prompt_len = enc["input_ids"].shape[1]
        results = []
        for row in range(len(requests)):
            mask = enc["attention_mask"][row].bool()
            prompt_ids = enc["input_ids"][row][mask].tolist()
            produced = out[row, prompt_len:].tolist()
            completion, finish = self._trim(produced, stop, sampling.max_tokens)
            results.append(
                Generation(
                    text=tok.decode(completion, skip_special_tokens=True),
                    prompt_ids=prompt_ids,
                    completion_ids=completion,
                    logprobs=logprobs[row, : len(completion)].tolist(),
                    finish_reason=finish,
                )
            )
        return results

    def _prefill_shared(self, model, kwargs: dict[str, Any], requests: list[GenerationRequest]) -> None:
        """Prefill each distinct (prompt, adapter) once and hand generate a cache expanded to every row.

        In GRPO every rollout of an example sends its first role the same prompt (and fan-out roles send it k times
        more), so a sampled batch is mostly duplicates: prefill is the bulk of CPU generation cost and is paid once
        per distinct prompt here. Positions follow the attention mask exactly as generate computes them, so the
        result equals an unshared prefill up to float rounding. No-op when every row is distinct."""
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        keys = [(tuple(ids[i].tolist()), r.adapter) for i, r in enumerate(requests)]
        first: dict = {}
        index = [first.setdefault(k, len(first)) for k in keys]
        if len(first) == len(keys) or ids.shape[1] < 2:
            return
        rows = [keys.index(k) for k in first]  # one representative row per distinct prompt
        u_ids, u_mask = ids[rows, :-1], mask[rows, :-1]
        position_ids = (u_mask.long().cumsum(-1) - 1).clamp(min=0)
        extra = {"adapter_names": [kwargs["adapter_names"][r] for r in rows]} if "adapter_names" in kwargs else {}
        out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=position_ids, use_cache=True,
                         logits_to_keep=1, **extra)
        cache = out.past_key_values
        cache.batch_select_indices(torch.tensor(index, device=ids.device))
        kwargs["past_key_values"] = cache
        self.stats["shared_prefill_rows"] = self.stats.get("shared_prefill_rows", 0) + len(keys) - len(first)

    def _trim(self, produced: list[int], stop: tuple[str, ...], max_tokens: int) -> tuple[list[int], str]:
        """Cut a generated row at its first EOS (kept) or at the token completing a stop string (kept)."""
        eos = self.tokenizer.eos_token_id
        end = len(produced)
        finish = "length"
        if eos in produced:
            end = produced.index(eos) + 1
            finish = "stop"
        if stop:
            text = self.tokenizer.decode(produced[:end], skip_special_tokens=True)
            if any(s in text for s in stop):
                for k in range(1, end + 1):
                    piece = self.tokenizer.decode(produced[:k], skip_special_tokens=True)
                    if any(s in piece for s in stop):
                        end, finish = k, "stop"
                        break
        if finish == "length" and end < max_tokens:
            finish = "stop"  # generation ended early for the whole batch on a stop criterion
        return produced[:end], finish
