"""Structured decoding (``wfc.constrain``): grammars from signatures, every call parses on a random model, and the
trainer takes log-probs under exactly the engine's masks (forced tokens: log-prob 0, no weight)."""

from __future__ import annotations

import copy
from typing import Literal

import dspy
import pytest
import torch
from peft import LoraConfig, get_peft_model
from pydantic import BaseModel

from compilers.config import UpdateConfig
from compilers.update import Row, attach_masks, update_adapter
from compilers.packing import packed_logprobs
from wfc.adapter import CompactChatAdapter
from wfc.constrain import GrammarMasks, forced, signature_grammar, unpack
from wfc.engines.base import GenerationRequest, SamplingParams
from wfc.engines.hf import HFEngine
from wfc.lower import Decoding, run_rollouts, trace


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Person(BaseModel):
    name: str
    age: int


QUESTIONS = [{"question": f"What is {a} + {b}?"} for a, b in [(4, 9), (12, 30), (7, 8)]]


# ----- grammars from signatures (pure) -------------------------------------------------------------------------


def test_chain_of_thought_grammar_forces_the_markers_and_types_the_answer():
    sig = dspy.ChainOfThought("question -> answer: int").predict.signature
    g = signature_grammar(sig, dspy.ChatAdapter(), field_tokens=32)
    assert '"[[ ## reasoning ## ]]\\n"' in g and "## answer ## ]]" in g and "## completed ## ]]" in g
    assert "max_tokens=32" in g and "[0-9]" in g


def test_budgets_shrink_to_fit_the_calls_token_limit():
    sig = dspy.ChainOfThought("question -> answer: int").predict.signature
    g = signature_grammar(sig, dspy.ChatAdapter(), field_tokens=500, max_tokens=96)
    budget = int(g.split("max_tokens=")[1].split("]")[0])
    assert budget < 96 - 30


def test_compact_single_outputs_are_constrained_only_where_the_type_says_something():
    adapter = CompactChatAdapter()
    assert signature_grammar(dspy.Predict("q -> a").signature, adapter) is None
    assert signature_grammar(dspy.Predict("q -> a: Literal['x', 'y']").signature, adapter) is None  # choices
    assert signature_grammar(dspy.Predict("q -> a: int").signature, adapter).startswith("start: value")
    assert "%json" in signature_grammar(dspy.Predict("q -> a: list[int]").signature, adapter)


def test_react_grammar_has_one_branch_per_tool_with_that_tools_argument_schema():
    agent = dspy.ReAct("question -> answer: int", tools=[add, multiply])
    from wfc.constrain import react_tools

    g = signature_grammar(agent.react.signature, dspy.ChatAdapter(), tools=react_tools(agent))
    assert g.count("%json") == 3  # add, multiply, finish
    assert '"add"' in g and '"multiply"' in g and '"finish"' in g


def test_unknown_adapter_formats_are_left_unconstrained():
    assert signature_grammar(dspy.Predict("q -> a, b").signature, dspy.XMLAdapter()) is None


# ----- every call parses on the tiny (random) model -----------------------------------------------------------


PROGRAMS = {
    "chain_of_thought": lambda: dspy.ChainOfThought("question -> answer: int"),
    "typed_fields": lambda: dspy.Predict("question -> answer: float, sure: bool, label: Literal['easy', 'hard'], "
                                         "steps: list[str]"),
    "pydantic_model": lambda: dspy.Predict(dspy.Signature({"question": (str, dspy.InputField()),
                                                           "person": (Person, dspy.OutputField())})),
    "react": lambda: dspy.ReAct("question -> answer: int", tools=[add, multiply], max_iters=2),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("adapter", ["chat", "json"])
def test_every_call_of_a_dspy_program_parses_on_a_random_model(tiny_engine, name, adapter):
    program = PROGRAMS[name]()
    dspy_adapter = dspy.JSONAdapter() if adapter == "json" else None
    graphs = run_rollouts(program, QUESTIONS, tiny_engine, repeats=2, adapter=dspy_adapter,
                          sampling=SamplingParams(temperature=1.0, max_tokens=400))
    calls = [c for gs in graphs for g in gs for c in g.calls]
    assert calls and all(c.grammar is not None for c in calls)
    assert [c.status for c in calls] == ["ok"] * len(calls), [c.error for c in calls if c.status != "ok"]
    assert all(g.status == "ok" for gs in graphs for g in gs)


def test_without_structured_decoding_a_random_model_does_not_parse(tiny_engine):
    g = trace(PROGRAMS["chain_of_thought"](), QUESTIONS[0], tiny_engine, decoding=Decoding(structured=False),
              sampling=SamplingParams(temperature=1.0, max_tokens=24, ))
    assert g.calls[0].grammar is None and g.calls[0].status == "format_error"


def test_react_tool_calls_name_a_real_tool_with_arguments_that_validate(tiny_engine):
    graphs = run_rollouts(PROGRAMS["react"](), QUESTIONS, tiny_engine, repeats=3,
                          sampling=SamplingParams(temperature=1.0, max_tokens=160))
    steps = [c.outputs for gs in graphs for g in gs for c in g.calls if c.role == "react"]
    assert steps
    for out in steps:
        assert out["next_tool_name"] in {"add", "multiply", "finish"}
        args = out["next_tool_args"]
        if out["next_tool_name"] == "finish":
            assert args == {}
        else:
            assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())


# ----- engine and trainer agree -------------------------------------------------------------------------------


def _constrained_generation(engine, temperature=1.0, seed=3):
    sig = dspy.ChainOfThought("question -> answer: int").predict.signature
    grammar = signature_grammar(sig, dspy.ChatAdapter(), field_tokens=12, max_tokens=64)
    messages = ({"role": "user", "content": "What is 4 + 9?"},)
    gen = engine.generate([GenerationRequest(messages=messages, grammar=grammar, seed=seed,
                                             sampling=SamplingParams(temperature=temperature, max_tokens=64))])[0]
    return grammar, gen


def test_engine_masks_are_the_trainers_replayed_masks(tiny_handle, monkeypatch):
    engine = HFEngine(tiny_handle)
    seen = []
    real_fill = GrammarMasks.fill

    def spy(self, matcher, bitmask, row):
        real_fill(self, matcher, bitmask, row)
        seen.append(bitmask[row].clone())

    monkeypatch.setattr(GrammarMasks, "fill", spy)
    grammar, gen = _constrained_generation(engine)
    monkeypatch.setattr(GrammarMasks, "fill", real_fill)
    replayed = engine.grammar_masks.replay(grammar, gen.completion_ids)
    assert gen.completion_ids[-1] == engine.tokenizer.eos_token_id
    assert torch.equal(torch.stack(seen[:len(gen.completion_ids)]), replayed)
    engine.close()


def test_engine_and_trainer_logprobs_agree_under_the_grammar_and_forced_tokens_are_certain(tiny_handle):
    engine = HFEngine(tiny_handle)
    grammar, gen = _constrained_generation(engine, temperature=0.8)
    bits = engine.grammar_masks.replay(grammar, gen.completion_ids)
    trainer = packed_logprobs(tiny_handle.model, [(gen.prompt_ids, [gen.completion_ids])], temperature=0.8,
                              masks=[[(0, bits)]])[0][0]
    assert torch.allclose(trainer, torch.tensor(gen.logprobs), atol=1e-4), (trainer - torch.tensor(gen.logprobs))
    is_forced = forced(bits)
    assert is_forced.any() and (~is_forced).any()
    assert torch.all(trainer[is_forced] == 0.0)  # log q = 0 where the grammar leaves one token
    allowed = unpack(bits, tiny_handle.model.config.vocab_size)
    assert torch.all(allowed[torch.arange(len(gen.completion_ids)), torch.tensor(gen.completion_ids)])
    engine.close()


def test_forced_tokens_carry_no_weight_in_the_update(tiny_handle):
    engine = HFEngine(tiny_handle)
    grammar, gen = _constrained_generation(engine, temperature=1.0)
    masks = engine.grammar_masks
    engine.close()
    model = get_peft_model(copy.deepcopy(tiny_handle.model),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    start = [p.detach().clone() for p in params]
    config = UpdateConfig(max_grad_norm=1e9)

    def step(free_override=None):
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        row = Row("a", "r", tuple(gen.prompt_ids), list(gen.completion_ids), 1.0, grammar=grammar,
                  engine_logprobs=list(gen.logprobs))
        attach_masks([row], masks)
        if free_override is not None:
            row.free = free_override
        stats = update_adapter(model, torch.optim.SGD(params, lr=1.0), [row], config=config, temperature=1.0)
        return torch.cat([(s - p.detach()).flatten() for s, p in zip(start, params)]), row, stats

    delta, row, stats = step()
    assert 0 < row.free_tokens < len(row.completion_ids)
    assert delta.abs().sum() > 0
    assert stats["trained_rows"] == 1
    # counting forced tokens in the denominator would only rescale the step: the loss is over free tokens
    delta_all, _, _ = step(free_override=[True] * len(row.completion_ids))
    ratio = row.free_tokens / len(row.completion_ids)
    assert torch.allclose(delta_all, delta * ratio, rtol=1e-3, atol=1e-7)


def test_engines_without_grammar_support_refuse_grammar_requests_saying_what_to_do():
    from wfc.engines.base import refuse_grammars

    refuse_grammars([GenerationRequest(messages=({"role": "user", "content": "hi"},))], "VLLMEngine")
    with pytest.raises(ValueError, match="HF engine"):
        refuse_grammars([GenerationRequest(messages=({"role": "user", "content": "hi"},), grammar="start: \"a\"")],
                        "VLLMEngine")
