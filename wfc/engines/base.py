"""The engine protocol: batched chat generation where every request names its adapter and sampling settings.

Data model:
- ``SamplingParams``: temperature (0: greedy), top-p, the token budget, stop strings, and ``choices``: when set, the
  completion is one of these strings, whole, followed by EOS (a role whose one output is a ``Literal``, e.g. a
  verdict; ``wfc.adapter.CompactChatAdapter.choices``). A choice request is scored, not decoded: the engine computes
  each choice's log-probability under the temperature-scaled distribution, greedy takes the most probable, sampling
  draws one in proportion to those probabilities (top-p and stop strings do not apply). Why whole choices rather
  than a token-level mask: the distribution sampled is then the model's own over whole choices, log q(c) =
  log p(c) - log sum_c' p(c'), and the trainer computes exactly that (``compilers.update``: every choice is scored
  beside the drawn one in the same pack). Training on the full-vocabulary log p(c) instead would also push each
  prompt's total mass on the choices up or down with the advantage, a gradient that cancels only when every member
  of a group has the same prompt (EvalOpt's verdicts judge different proposals, so it does not).
- ``GenerationRequest``: chat ``messages``, the ``adapter`` to route through (``None`` = the base model),
  ``SamplingParams`` and an optional sampling ``seed``: a sampled request with a seed draws its random numbers from a
  generator of its own seeded with it, so the same request with the same seed yields the same tokens whichever
  batch it lands in (float rounding of the batch layout aside); without one, from the engine's shared generator.
  Greedy requests ignore it. An optional ``grammar`` (``wfc.constrain``): the completion follows it, by
  construction; its log-probs are then under the masked distribution, log q(t) = log p(t) - log sum_allowed p,
  the convention the trainer replays (a forced token has log q = 0). An engine decodes it under exactly the masks
  ``wfc.constrain.GrammarMasks.replay`` gives the trainer (the HF engine with those masks, the vLLM engines with
  vLLM's structured outputs on llguidance, its ``guidance`` backend) and samples every token, forced ones included;
  a model engine that cannot must refuse the request (:func:`refuse_grammars`), never decode it unconstrained
  (the scripted fake samples nothing: it answers from its script, its log-probs unknown).
- ``Generation``: the completion ``text``; ``prompt_ids`` (exactly the tokens the model was conditioned on, no
  padding); ``completion_ids`` (exactly the tokens it produced, ending at EOS or a stop string, no padding);
  ``logprobs`` (one per completion token, under the temperature-scaled distribution it was sampled from; for a
  choice request, the chosen tokens' log-probs with the log of all choices' total probability taken off the first,
  so they sum to the log-probability of the choice among the choices); ``choice_ids`` (a choice request's every
  choice as it was scored, tokens then EOS; None otherwise);
  ``logprobs_known`` (False: the engine has no log-probs, e.g. a scripted fake; ``logprobs`` are then placeholders
  and the trainer treats them as unknown).
- ``AdapterRevision``: one adapter's weights as the trainer (``wfc.policy.Policy``) exports them: ``name``,
  ``revision`` (the policy's counter, bumped by every change), the peft ``LoraConfig`` and the tensors (peft
  state-dict keys, as ``get_peft_model_state_dict`` gives them, on the CPU).

Invariant: ``len(logprobs) == len(completion_ids)``; ``prompt_ids + completion_ids`` is the sequence the engine saw.

Engines only generate: the trainer owns the weights (``wfc.policy``) and hands changed adapters over with
``load_adapters``, the one weight-related method of the protocol.

Engines accept requests one at a time from many threads (``submit`` returns a future) and are free to batch them:
that is how the concurrent calls of many rollouts become few ``generate`` calls.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from wfc.models import ModelHandle

BASE = None  # the adapter name of "no adapter" in requests


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.0, ge=0.0, description="0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(128, ge=1, le=32768)
    stop: tuple[str, ...] = ()
    choices: tuple[str, ...] = Field((), description="the completion is one of these, whole (module doc)")

    @field_validator("choices")
    @classmethod
    def _distinct_nonempty(cls, choices: tuple[str, ...]) -> tuple[str, ...]:
        if any(not c.strip() for c in choices):
            raise ValueError(f"choices must be non-empty strings, got {list(choices)!r}")
        if len(set(choices)) != len(choices):
            raise ValueError(f"choices must be distinct, got {list(choices)!r}")
        if len(choices) == 1:
            raise ValueError(f"one choice is no choice: give two or more, got {list(choices)!r}")
        return choices

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def refuse_choices(sampling: SamplingParams, engine: str) -> None:
    """Raise, saying what to do, when an engine that cannot score whole choices is asked to."""
    if sampling.choices:
        raise ValueError(f"{engine} cannot decode choice requests (choices {list(sampling.choices)!r}, from a role "
                         "whose output is a Literal): run that role on the HF engine (wfc.engines.hf.HFEngine), or "
                         "declare its output as str")


def refuse_grammars(requests: Sequence["GenerationRequest"], engine: str) -> None:
    """Raise, saying what to do, when an engine that cannot decode under a grammar is asked to (never silently
    unconstrained: the trainer would replay masks the engine did not apply)."""
    if any(r.grammar is not None for r in requests):
        raise ValueError(f"{engine} cannot yet decode under a grammar (structured decoding, wfc.constrain): run these "
                         "roles on the HF engine (wfc.engines.hf.HFEngine), or turn it off with "
                         "wfc.lower.Decoding(structured=False)")


class GenerationRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    messages: tuple[dict[str, str], ...]
    adapter: str | None = BASE
    sampling: SamplingParams = SamplingParams()
    seed: int | None = Field(None, ge=0, lt=2**63, description="this request's own sampling seed (module doc)")
    grammar: str | None = Field(None, description="llguidance Lark grammar the completion must follow (wfc.constrain)")


class Generation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"  # "stop" (EOS or a stop string) or "length"
    logprobs_known: bool = True  # False: ``logprobs`` are placeholders (the engine cannot report them)
    choice_ids: list[list[int]] | None = None  # a choice request's every choice as token ids (the trainer's normaliser)


@dataclass(frozen=True)
class AdapterRevision:
    """One exported revision of an adapter (see module doc). ``config`` is a peft ``LoraConfig``; ``tensors`` map
    peft state-dict keys (``base_model.model....lora_A.weight``) to CPU tensors that nothing else writes to."""

    name: str
    revision: int
    config: Any
    tensors: dict[str, Any] = field(repr=False)


@runtime_checkable
class Engine(Protocol):
    """What rollouts, the trainer and the server need from an inference engine.

    Four methods (generation and the adapter hand-off) and four read-only attributes that other code reads; an
    attribute an engine has no value for is ``None`` (a scripted fake has no model, only the colocated HF engine shares
    the trainer's policy)."""

    @property
    def handle(self) -> ModelHandle | None:
        """The base model the engine runs (name, local path, checksum, tokenizer; ``wfc.models.ModelHandle``): what a
        policy is built on beside it and what an artifact's base checksum is checked against. None: no model."""

    @property
    def policy(self) -> Any:
        """The trainer's ``wfc.policy.Policy`` whose model this engine generates with (a colocated ``HFEngine``):
        compile trains it and an artifact saves its adapters from it. None: the engine holds its own weights."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer prompts are rendered and counted with (its chat template). None: the engine has none."""

    @property
    def context_length(self) -> int | None:
        """The longest sequence (prompt + completion) the engine runs. None: it does not say."""

    def submit(self, request: GenerationRequest) -> Future: ...

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]: ...

    def load_adapters(self, revisions: Sequence[AdapterRevision]) -> None:
        """The trainer changed these adapters (created, updated, rolled back, restored, loaded): requests submitted
        after this returns must use these weights. An engine sharing the trainer's model (a colocated ``HFEngine``)
        does nothing; engines with their own copy of the base (vLLM) take the adapter tensors here, never the base."""

    def close(self) -> None: ...
