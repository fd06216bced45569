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

Sampling is done by that same processor, by inverse CDF (:func:`sample_tokens`: one uniform number per row, a
cumulative sum, a binary search), and ``generate`` then runs greedy over its one-hot
scores. The distribution is exactly the one ``generate``'s own sampler would draw from (softmax of the logits at the
temperature, top-p applied the same way), but ``torch.multinomial`` over a 49k vocabulary draws one exponential per
vocabulary entry: measured on the 2-core CPU, that was 13% of a 96-row sampled batch of SmolLM2-135M. A row's
uniform numbers come from a generator of its own when its request carries a ``seed`` (its n-th token takes that
generator's n-th number, so the row samples alike in any batch), else from torch's global generator.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

import torch

from wfc.constrain import GrammarMasks, additive_mask
from wfc.engines.base import AdapterRevision, Generation, GenerationRequest, SamplingParams
from wfc.engines.batching import BatchingEngine
from wfc.memory import release_freed_memory
from wfc.models import ModelHandle
from wfc.policy import Policy

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch
CHOICE_ROWS = 16  # choice requests scored per forward pass (each is one row per choice)


def sample_tokens(logprobs: torch.Tensor, uniform: torch.Tensor, *, top_p: float = 1.0) -> torch.Tensor:
    """One token per row of ``logprobs`` (B, V; log of a distribution per row), drawn by inverse CDF with
    ``uniform`` (B,) numbers in [0, 1): row b's token is the first index whose cumulative probability exceeds
    ``uniform[b]`` times the row's total, so token v is drawn with probability p_v exactly (float rounding aside).
    ``top_p < 1`` keeps, as transformers' top-p warper does, the tokens whose strictly-more-probable mass is below
    ``top_p`` (at least the most probable one), renormalised. A token of probability 0 is never returned."""
    probs = logprobs.float().exp()
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    cdf = probs.cumsum(-1)
    target = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    pos = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[1] - 1)
    # u * total rounding up to the total lands past the last positive entry: take the most probable token then
    pos = torch.where(probs.gather(1, pos) > 0, pos, probs.argmax(-1, keepdim=True))
    return (order.gather(1, pos) if order is not None else pos).squeeze(1)


class _LogprobRecorder:
    """Logits processor that records log p(token) of each generated token, one (B,) tensor per step; with
    ``sample``, it also draws each row's token (:func:`sample_tokens`) and returns scores whose argmax is that
    token, so ``generate`` runs greedy."""

    def __init__(self, temperature: float, *, sample: bool = False, top_p: float = 1.0,
                 seeds: Sequence[int | None] | None = None, grammars: "_RowGrammars | None" = None):
        self.grammars = grammars  # per-row grammar matchers: scores are masked to each row's allowed tokens
        self.temperature = temperature if temperature > 0 else 1.0
        self.sample = sample
        self.top_p = top_p
        # one generator per seeded row (None: that row draws from torch's global generator)
        self.generators = ([torch.Generator().manual_seed(s) if s is not None else None for s in seeds]
                           if seeds is not None and any(s is not None for s in seeds) else None)
        self.prev: torch.Tensor | None = None  # (B, V) log-probs of the step whose token is not yet known
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
            if self.grammars is not None:
                self.grammars.advance(input_ids[:, -1].tolist())
        if self.grammars is not None:
            scores = self.grammars.mask(scores)
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if not self.sample:
            return scores
        tokens = sample_tokens(self.prev, self.uniforms(scores.shape[0]).to(scores.device), top_p=self.top_p)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens.unsqueeze(1), 0.0)

    def uniforms(self, rows: int) -> torch.Tensor:
        """One uniform number in [0, 1) per row for this step: from the row's own generator when it has one."""
        if self.generators is None:
            return torch.rand(rows)
        return torch.cat([torch.rand(1, generator=g) if g is not None else torch.rand(1) for g in self.generators])

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, sequences[:, -1:]).squeeze(1))
            self.prev = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(sequences.shape[0], 0)  # (B, R)


class _RowGrammars:
    """The grammar state of each row of one generate call (rows without a grammar are left alone): masks each
    step's scores to the allowed tokens and advances with the tokens chosen. The masks are
    :meth:`wfc.constrain.GrammarMasks.replay`'s, position for position, which is what the trainer recomputes."""

    def __init__(self, masks: GrammarMasks, grammars: Sequence[str | None]):
        self.masks = masks
        self.matchers = [masks.matcher(g) if g is not None else None for g in grammars]
        self.rows = [i for i, m in enumerate(self.matchers) if m is not None]
        self.bitmask = masks.new_bitmask(len(self.rows))
        self.mask_seconds = 0.0  # time spent computing masks (the cost benchmarks/bench_structured.py reports)

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        for k, row in enumerate(self.rows):  # one at a time: llguidance's threads cost more than they save here
            self.masks.fill(self.matchers[row], self.bitmask, k)
        mask = additive_mask(self.bitmask, scores.shape[1]).to(scores.device)  # (rows, V): 0 or -inf
        if len(self.rows) == scores.shape[0]:
            scores = scores + mask.to(scores.dtype)
        else:
            rows = torch.tensor(self.rows, device=scores.device)
            scores = scores.index_add(0, rows, mask.to(scores.dtype))
        self.mask_seconds += time.perf_counter() - start
        return scores

    def advance(self, tokens: list[int]) -> None:
        for row in self.rows:
            matcher = self.matchers[row]
            if not matcher.is_stopped():
                matcher.consume_token(tokens[row])


def shared_prefix(prompts: Sequence[Sequence[int]], *, min_shared: int = 1) -> int:
    """Length of the prefix all ``prompts`` share, kept below the shortest one (every row keeps a token of its own
    for generate); 0 when under ``min_shared`` or when there are fewer than two distinct prompts."""
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    if len(distinct) < 2:
        return 0
    first, limit, n = distinct[0], min(len(p) for p in distinct) - 1, 0
    while n < limit and all(p[n] == first[n] for p in distinct):
        n += 1
    return n if n >= min_shared else 0


def prefill_cost(prompts: Sequence[Sequence[int]], *, min_shared: int = 1) -> int:
    """Token positions one generate call prefills for these rows with :meth:`HFEngine._prefill_shared`: the
    shared prefix once, then each distinct prompt's remainder padded to the longest (duplicates cost nothing)."""
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    shared = shared_prefix(distinct, min_shared=min_shared)
    return shared + len(distinct) * (max(len(p) for p in distinct) - shared)


def plan_subbatches(prompts: Sequence[Sequence[int]], kinds: Sequence, *, decode_cost: int,
                    min_shared: int = 1) -> list[list[int]]:
    """Row indices of the generate calls to make for one batch: all rows together, or one call per kind (rows of
    one role share a system prompt and adapter) when that prefills fewer positions even after paying
    ``decode_cost`` (a whole decode, in prefill-token equivalents) for each extra call. A batch mixing a role with
    short prompts and one with long prompts pads the short ones to the long width and shares no prefix beyond the
    chat template; split, each part shares its own system prompt. Kinds keep their first-seen order."""
    rows = list(range(len(prompts)))
    groups: dict = {}
    for i, kind in enumerate(kinds):
        groups.setdefault(kind, []).append(i)
    if len(groups) < 2:
        return [rows]
    whole = prefill_cost(prompts, min_shared=min_shared)
    split = sum(prefill_cost([prompts[i] for i in g], min_shared=min_shared) for g in groups.values())
    return list(groups.values()) if split + decode_cost * (len(groups) - 1) < whole else [rows]


def _same_weights(held: dict[str, torch.Tensor], given: dict[str, torch.Tensor]) -> bool:
    """Whether ``given`` (an adapter revision's tensors) is exactly what the engine holds, after the dtype cast a
    copy into the engine would make."""
    return held.keys() == given.keys() and all(
        torch.equal(held[k], given[k].to(device=held[k].device, dtype=held[k].dtype)) for k in held)


class HFEngine(BatchingEngine):
    """transformers + peft engine on a :class:`wfc.policy.Policy`'s model.

    ``HFEngine("tiny")`` (a name for :func:`wfc.models.load_model`, or a loaded handle) builds its own policy on
    ``device`` in ``dtype``; ``HFEngine(policy=policy)`` shares a trainer's policy in process (colocated), and then
    generation reads the trainer's adapters in place, under its lock, so :meth:`load_adapters` has nothing to do.

    ``HFEngine("smollm2-135m", dtype="bfloat16")`` beside a trainer's fp32 ``Policy`` is a rollout engine of its
    own: :meth:`load_adapters` copies each handed-over revision into the engine's model (cast to its dtype), and the
    trainer's importance correction covers the bf16 log-probs (``compilers/offpolicy.py``). On a CPU with AVX-512
    BF16 a sampled batch runs about 1.4x faster (``benchmarks/bench_rollout_dtype.py``)."""

    engine_name = "hf"

    def __init__(
        self,
        model: str | ModelHandle | None = None,
        *,
        policy: Policy | None = None,
        device: str = "auto",
        dtype: str = "float32",
        max_batch: int = 256,
        batch_wait_s: float = 0.05,
        default_stop: tuple[str, ...] = (),
        share_prefill: bool = True,
        min_shared_prefix: int = 8,
        decode_step_tokens: int = 32,
    ):
        super().__init__(max_batch=max_batch, batch_wait_s=batch_wait_s)
        if policy is not None and model is not None:
            raise ValueError("pass model or policy to HFEngine, not both: a policy already holds its base model")
        if policy is not None and dtype != "float32" and policy.dtype != getattr(torch, dtype, None):
            raise ValueError(f"dtype={dtype!r} but the given policy holds {policy.dtype}: a shared policy generates "
                             "in its own dtype; pass a model name instead for an engine with its own weights")
        self.policy = policy if policy is not None else Policy(model or "smollm2-135m", device=device, dtype=dtype)
        self.default_stop = tuple(default_stop)
        self.share_prefill = share_prefill
        self.min_shared_prefix = min_shared_prefix  # shorter common prefixes are not worth a separate pass
        # what one more decode step costs, in prompt tokens of prefill: the price of splitting a batch in two
        self.decode_step_tokens = decode_step_tokens
        # rows: requests answered; prompt/completion tokens: what they conditioned on and produced (usage counts)
        self.stats = {"generate_calls": 0, "rows": 0, "batch_sizes": [], "prompt_tokens": 0, "completion_tokens": 0}

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

    @property
    def context_length(self) -> int | None:
        return self.handle.context_length

    @property
    def grammar_masks(self) -> GrammarMasks:
        """The grammar masks over this engine's tokenizer: the policy's, which the trainer replays."""
        return self.policy.grammar_masks

    def load_adapters(self, revisions: Sequence[AdapterRevision]) -> None:
        """Make the engine generate with these adapter revisions. An adapter whose weights this engine's model
        already holds (a colocated trainer changed them in place: the same policy) is left as it is; any other is
        added (with the revision's LoRA config) or overwritten, its tensors cast to the engine's dtype, under the
        policy's lock, so no batch sees a half-copied adapter."""
        policy = self.policy
        with policy.lock:
            for rev in revisions:
                if rev.name in self.adapters and _same_weights(policy.adapter_state(rev.name), rev.tensors):
                    continue
                if rev.name not in self.adapters:
                    if rev.config is None:
                        raise ValueError(f"adapter {rev.name!r} is new to this engine but its revision carries no "
                                         "LoRA config: hand over policy.export([...]) revisions")
                    policy.add_adapter(rev.name, rev.config)
                    # peft keeps new LoRA weights in fp32 beside a bf16 base; an engine computes them in its own
                    # dtype (measured: a 144-row sampled batch 8.6 s with fp32 LoRA, 8.0 s cast, 11.7 s all fp32)
                    for name, param in policy.model.named_parameters():
                        if f".{rev.name}." in name and "lora_" in name and param.dtype != policy.dtype:
                            param.data = param.data.to(policy.dtype)
                policy.restore_adapter(rev.name, rev.tensors)

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
        ordered = [requests[i] for i in order]
        ids = [self.encode_prompt(r.messages) for r in ordered]  # tokenized once, for the plan and the layout
        parts = [list(range(len(ordered)))]
        if sampling.choices:  # scored in parts of CHOICE_ROWS requests, which bounds the forward pass's memory
            parts = [parts[0][s:s + CHOICE_ROWS] for s in range(0, len(ordered), CHOICE_ROWS)]
        elif self.share_prefill and len(ordered) > 1:
            kinds = [(r.messages[0].get("content", "") if r.messages else "", r.adapter) for r in ordered]
            parts = plan_subbatches(ids, kinds, decode_cost=sampling.max_tokens * self.decode_step_tokens,
                                    min_shared=self.min_shared_prefix)
        results: list[Generation] = [None] * len(ordered)  # type: ignore[list-item]
        run = self._choose_rows if sampling.choices else self._generate_rows
        for part in parts:
            for row, gen in zip(part, run([ordered[i] for i in part], sampling, [ids[i] for i in part])):
                results[row] = gen
        release_freed_memory()  # the batch's activations and caches are freed: give their pages back (wfc.memory)
        out: list[Generation] = [None] * len(requests)  # type: ignore[list-item]
        for row, i in enumerate(order):
            out[i] = results[row]
        return out

    def _layout(self, rows: list[list[int]], *, share: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Token ids (B, L) and attention mask of a batch, and the length P of the prefix every row shares.

        Rows are ``prefix (P) | padding | own suffix``: the shared prefix sits at the same columns in every row so
        its key/value cache can be computed once (:meth:`_prefill_shared`), and the padding (mask 0) between it and
        each row's suffix right-aligns the suffixes, as generate needs. Positions follow the mask, so a row means
        exactly its own prompt. P is 0 (plain left padding) unless at least two distinct prompts share a prefix
        worth it; P stays below every row's length so each row keeps at least one token of its own for generate.
        ``share=False``: always plain left padding (P = 0)."""
        tok = self.tokenizer
        shared = shared_prefix(rows, min_shared=self.min_shared_prefix) if self.share_prefill and share else 0
        width = max(len(r) for r in rows) - shared
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        ids = torch.full((len(rows), shared + width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            own = len(r) - shared
            ids[i, :shared], mask[i, :shared] = torch.tensor(r[:shared], dtype=torch.long), 1
            ids[i, shared + width - own:], mask[i, shared + width - own:] = torch.tensor(r[shared:]), 1
        return ids, mask, shared

    def _generate_rows(self, requests: list[GenerationRequest], sampling: SamplingParams,
                       prompt_ids: list[list[int]]) -> list[Generation]:
        tok = self.tokenizer
        input_ids, attention_mask, shared = self._layout(prompt_ids)
        stop = tuple(sampling.stop) + self.default_stop
        # the recorder draws sampled rows' tokens itself (from the full distribution the recorded log-probs
        # describe, top-p aside): generate only ever runs greedy, with no warpers of its own
        grammars = ([r.grammar for r in requests] if any(r.grammar is not None for r in requests) else None)
        recorder = _LogprobRecorder(sampling.temperature, sample=not sampling.greedy, top_p=sampling.top_p,
                                    seeds=[r.seed for r in requests],
                                    grammars=_RowGrammars(self.grammar_masks, grammars) if grammars else None)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            logits_processor=[recorder],
            num_beams=1,
            temperature=None, top_p=None, top_k=None,
        )
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=tok)
        device = self.policy.device
        kwargs["input_ids"], kwargs["attention_mask"] = input_ids.to(device), attention_mask.to(device)
        wanted = [r.adapter for r in requests]
        self._check_adapters(wanted)
        policy = self.policy
        with policy.lock, torch.inference_mode():
            model = policy.model
            model.eval()
            with self._adapters(model, wanted, kwargs):
                if self.share_prefill:
                    self._prefill_shared(model, kwargs, requests, shared)
                out = model.generate(**kwargs)
            logprobs = recorder.finish(out).cpu()  # (B, R)
            out = out.cpu()
        self.stats["generate_calls"] += 1
        self.stats["rows"] += len(requests)
        self.stats["batch_sizes"].append(len(requests))
        if recorder.grammars is not None:
            self.stats["mask_seconds"] = self.stats.get("mask_seconds", 0.0) + recorder.grammars.mask_seconds
        prompt_len = input_ids.shape[1]
        results = []
        for row in range(len(requests)):
            prompt_ids = input_ids[row][attention_mask[row].bool()].tolist()
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
        self._count(results)
        return results

    def _count(self, results: list[Generation]) -> None:
        self.stats["prompt_tokens"] += sum(len(g.prompt_ids) for g in results)
        self.stats["completion_tokens"] += sum(len(g.completion_ids) for g in results)

    def _choose_rows(self, requests: list[GenerationRequest], sampling: SamplingParams,
                     prompt_ids: list[list[int]]) -> list[Generation]:
        """Choice requests (``SamplingParams.choices``): every choice, as its tokens then EOS, is scored after each
        prompt in one forward pass (rows ``prompt | choice``, left-padded so the choices end every row alike, logits
        kept for the last positions only); greedy takes the choice of highest log-probability (T=1), sampling draws
        one by inverse CDF over the choices' probabilities at the temperature, with the request's own generator when
        it has a seed. The Generation reports the chosen tokens' log-probs among the choices (the log of the choices'
        total probability off the first token), as the trainer computes them, and every choice's token ids."""
        tok = self.tokenizer
        options = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in sampling.choices]
        longest = max(len(o) for o in options)
        if longest > sampling.max_tokens:
            raise ValueError(f"a choice of {sampling.choices!r} takes {longest} tokens with EOS, more than "
                             f"max_tokens={sampling.max_tokens}: raise max_tokens or shorten the choices")
        wanted = [r.adapter for r in requests for _ in options]
        self._check_adapters(wanted)
        # plain left padding, so every row's choice ends in the last columns and its first token is predicted from
        # the prompt's last token. Not the shared-prefix layout: where every row is one prompt plus a choice, its
        # prefix is the whole prompt and a shorter choice's padding would sit between the prompt and the choice, so
        # that choice's first token was scored from a padding column (a batch of one prompt's repeats, a group)
        ids, mask, _ = self._layout([p + o for p in prompt_ids for o in options], share=False)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        temperature = sampling.temperature if not sampling.greedy else 1.0
        kwargs: dict[str, Any] = {}
        policy = self.policy
        device = policy.device
        with policy.lock, torch.inference_mode():
            model = policy.model
            model.eval()
            with self._adapters(model, wanted, kwargs):
                # the logit at column c predicts column c + 1: the last `longest` tokens need the `longest + 1` last
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                               position_ids=positions.to(device), logits_to_keep=longest + 1, **kwargs).logits
            lps = torch.log_softmax(logits[:, :-1].float().cpu() / temperature, dim=-1)  # (rows, longest, V)
        self.stats["generate_calls"] += 1
        self.stats["rows"] += len(requests)
        self.stats["batch_sizes"].append(len(requests))
        results = []
        for q, request in enumerate(requests):
            token_lps = []
            for k, option in enumerate(options):
                row = lps[q * len(options) + k, longest - len(option):]
                token_lps.append(row.gather(1, torch.tensor(option).unsqueeze(1)).squeeze(1))
            scores = torch.stack([t.sum() for t in token_lps])
            log_total = torch.logsumexp(scores, 0)
            if sampling.greedy:
                pick = int(scores.argmax())
            else:
                g = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
                uniform = torch.rand(1, generator=g) if g is not None else torch.rand(1)
                pick = int(sample_tokens(torch.log_softmax(scores, -1).unsqueeze(0), uniform)[0])
            chosen = token_lps[pick].clone()
            chosen[0] -= log_total  # the choice's log-probability among the choices (wfc.engines.base)
            results.append(Generation(text=sampling.choices[pick], prompt_ids=list(prompt_ids[q]),
                                      completion_ids=list(options[pick]), logprobs=chosen.tolist(),
                                      finish_reason="stop", choice_ids=[list(o) for o in options]))
        self._count(results)
        return results

    def _check_adapters(self, wanted: list[str | None]) -> None:
        """Raise, naming them, when rows ask for adapters this engine does not hold."""
        missing = sorted({a for a in wanted if a is not None} - set(self.adapters))
        if missing:
            raise ValueError(f"unknown adapter(s) {missing}; this engine has {self.adapters or 'none'}")

    def _adapters(self, model, wanted: list[str | None], kwargs: dict[str, Any]):
        """The adapter scope of one batch. One adapter for every row: it is made the active one (peft's plain LoRA
        forward); no adapter: peft's layers are bypassed; a mix: ``adapter_names`` per row (peft's mixed-batch
        forward, which gathers each adapter's rows in every LoRA layer: measured ~1.4x slower on the CPU, so it is
        kept for batches that need it). The active adapter is model state; it changes only under the policy's lock,
        and the trainer sets its own before every update."""
        if not self.policy.is_peft:
            return contextlib.nullcontext()
        names = set(wanted)
        if len(names) > 1:
            kwargs["adapter_names"] = [a if a is not None else BASE_ADAPTER for a in wanted]
            return contextlib.nullcontext()
        (name,) = names
        if name is None:
            return model.disable_adapter()
        model.set_adapter(name)
        return contextlib.nullcontext()

    def _prefill_shared(self, model, kwargs: dict[str, Any], requests: list[GenerationRequest], shared: int) -> None:
        """Prefill what rows share once and hand generate a cache expanded to every row.

        Two kinds of sharing, both exact up to float rounding (positions follow the mask as generate computes
        them): the prefix of ``shared`` tokens every row has (the system prompt and instructions: computed once per
        adapter in the batch), and duplicate (prompt, adapter) rows (in GRPO every rollout of an example sends its
        first role the same prompt, and fan-out roles send it k times more: prefilled once per distinct prompt).
        On the CPU prefill is the bulk of generation cost. No-op when nothing is shared."""
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        names = kwargs.get("adapter_names")
        keys = [(tuple(ids[i].tolist()), r.adapter) for i, r in enumerate(requests)]
        first: dict = {}
        index = [first.setdefault(k, len(first)) for k in keys]
        if (len(first) == len(keys) and not shared) or ids.shape[1] < 2:
            return
        rows = [keys.index(k) for k in first]  # one representative row per distinct prompt
        cache = None
        if shared:
            adapters = list(dict.fromkeys(requests[r].adapter for r in rows))
            extra = ({"adapter_names": [a if a is not None else BASE_ADAPTER for a in adapters]} if names else {})
            out = model(input_ids=ids[rows[:1], :shared].expand(len(adapters), -1), use_cache=True, logits_to_keep=1,
                        **extra)
            cache = out.past_key_values
            cache.batch_select_indices(torch.tensor([adapters.index(requests[r].adapter) for r in rows],
                                                    device=ids.device))
        if ids.shape[1] - 1 > shared:
            u_mask = mask[rows, :-1]
            position_ids = (u_mask.long().cumsum(-1) - 1).clamp(min=0)[:, shared:]
            extra = {"adapter_names": [names[r] for r in rows]} if names else {}
            out = model(input_ids=ids[rows, shared:-1], attention_mask=u_mask, position_ids=position_ids,
                        past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
            cache = out.past_key_values
        if cache is None:
            return
        cache.batch_select_indices(torch.tensor(index, device=ids.device))
        kwargs["past_key_values"] = cache
        self.stats["shared_prefill_rows"] = self.stats.get("shared_prefill_rows", 0) + len(keys) - len(first)
        self.stats["shared_prefix_tokens"] = self.stats.get("shared_prefix_tokens", 0) + shared * (len(first) - 1)

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
