"""What the two vLLM test files share: the prompts, greedy settings, the engine-equivalence check, and the grammar
requests of structured decoding (``wfc.constrain``) with the checks that every constrained call parses and that
its log-probs are the trainer's."""

from __future__ import annotations

import dspy
import torch

from wfc.constrain import forced, signature_grammar
from wfc.engines.base import GenerationRequest, SamplingParams

LOGPROB_ATOL = 1e-4  # fp32 on both sides: different kernels, same math (measured ~1e-6 to 2e-6)
PROMPTS = [({"role": "user", "content": f"What is {a} plus {b}?"},) for a, b in [(1, 2), (7, 5), (12, 30), (4, 4)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)

# A ChainOfThought call with a typed answer: ChatAdapter sections (forced markers, free reasoning under a budget, an
# int) and JSONAdapter's one object (llguidance's %json), each with the adapter that parses it.
COT = dspy.ChainOfThought("question -> answer: int").predict.signature
CONSTRAINED_TOKENS = 64
CONSTRAINED = SamplingParams(temperature=0.0, max_tokens=CONSTRAINED_TOKENS)  # greedy, room for a whole call
GRAMMARS = {name: (adapter, signature_grammar(COT, adapter, field_tokens=12, max_tokens=CONSTRAINED_TOKENS))
            for name, adapter in (("chat", dspy.ChatAdapter()), ("json", dspy.JSONAdapter()))}


def lora_config(r=8):
    """The peft config of the test adapters (rank ``r``, attention and MLP projections)."""
    from compilers.config import LoraSettings

    return LoraSettings(r=r, alpha=2 * r, target_modules=["q_proj", "v_proj", "up_proj"]).peft_config()


def perturb(model, adapter: str, seed: int) -> None:
    """Give an adapter non-zero B matrices (a fresh LoRA is the identity), deterministically."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f"lora_B.{adapter}." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def sample_constrained_through_adapter(engine, trainer, adapter: str = "gr", seed: int = 11,
                                       temperature: float = 0.8):
    """A new perturbed ``adapter`` on ``trainer``, handed to ``engine``; ChatAdapter-grammar rows sampled through it
    (twice each prompt, unseeded: independent) must parse, differ, and carry the trainer's log-probs (the trainer is
    left on ``adapter``). Returns (the generations, the grammar)."""
    trainer.add_adapter(adapter, lora_config())
    perturb(trainer.model, adapter, seed)
    engine.load_adapters(trainer.export([adapter]))
    parser, grammar = GRAMMARS["chat"]
    sampled = engine.generate(constrained_requests(grammar, adapter, temperature=temperature) * 2)
    assert_parses(sampled, parser, engine.tokenizer)
    assert len({tuple(g.completion_ids) for g in sampled}) > 1
    trainer.model.set_adapter(adapter)
    assert_trainer_logprobs(sampled, grammar, trainer.model, trainer.grammar_masks, temperature)
    return sampled, grammar


def requests(adapter=None, sampling=GREEDY):
    return [GenerationRequest(messages=m, adapter=adapter, sampling=sampling) for m in PROMPTS]


def constrained_requests(grammar: str, adapter=None, temperature=0.0, seed=None):
    sampling = SamplingParams(temperature=temperature, max_tokens=CONSTRAINED_TOKENS)
    return [GenerationRequest(messages=m, adapter=adapter, sampling=sampling, grammar=grammar, seed=seed)
            for m in PROMPTS]


def assert_same(a, b):
    """Same prompt ids, completion ids and text, one log-prob per token, log-probs within LOGPROB_ATOL."""
    for x, y in zip(a, b, strict=True):
        assert x.prompt_ids == y.prompt_ids
        assert x.completion_ids == y.completion_ids and x.text == y.text
        assert len(x.logprobs) == len(x.completion_ids)
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) < LOGPROB_ATOL


def assert_parses(gens, adapter, tokenizer):
    """Every generation is a whole constrained call: it ended by EOS (the grammar's end, not the token limit) and
    ``adapter`` parses it into the signature's fields, the answer an int."""
    for g in gens:
        assert g.finish_reason == "stop" and g.completion_ids[-1] == tokenizer.eos_token_id, g.text
        parsed = adapter.parse(COT, g.text)
        assert set(parsed) == {"reasoning", "answer"} and isinstance(parsed["answer"], int), g.text


def assert_trainer_logprobs(gens, grammar, model, grammar_masks, temperature) -> float:
    """The engine's log-probs of constrained calls are what the trainer computes for them with ``model`` (its adapter
    scope set by the caller): under the grammar's masks replayed by ``grammar_masks`` (which also fails for a
    completion outside the grammar), normalised over the allowed tokens at the temperature (1 for greedy), 0 on
    forced tokens. Returns the max |difference|."""
    from compilers.packing import packed_logprobs

    worst = 0.0
    for g in gens:
        bits = grammar_masks.replay(grammar, g.completion_ids)
        with torch.no_grad():
            trainer = packed_logprobs(model, [(g.prompt_ids, [g.completion_ids])], temperature=temperature or 1.0,
                                      masks=[[(0, bits)]])[0][0]
        engine = torch.tensor(g.logprobs)
        worst = max(worst, float((trainer - engine).abs().max()))
        is_forced = forced(bits)
        assert is_forced.any() and (~is_forced).any()
        assert torch.all(engine[is_forced].abs() < LOGPROB_ATOL)  # a forced token is certain under the mask
    assert worst < LOGPROB_ATOL, worst
    return worst
