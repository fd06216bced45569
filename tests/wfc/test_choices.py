"""Choice requests (``SamplingParams.choices``): a role whose one output is a ``Literal`` is decoded as one of its
values, whole. Checked on the tiny real model against an independent forward pass, and through a scripted fake for
the wiring (adapter -> rollout engine -> request)."""

from __future__ import annotations

from typing import Literal

import dspy
import pytest
import torch
from pydantic import ValidationError

from programs import EvalOpt
from wfc.adapter import CompactChatAdapter
from wfc.engines.base import GenerationRequest, SamplingParams, refuse_choices
from wfc.lower import trace
from wfc.verdict import read_verdict

CHOICES = ("correct", "incorrect")
MESSAGES = ({"role": "system", "content": "Check the sum."}, {"role": "user", "content": "2 + 3 = 5"})


def test_choices_must_be_two_or_more_distinct_nonempty_strings():
    assert SamplingParams(choices=CHOICES).choices == CHOICES
    for bad in (("yes",), ("yes", "yes"), ("yes", " ")):
        with pytest.raises(ValidationError, match="choice"):
            SamplingParams(choices=bad)


def test_engines_that_cannot_score_choices_say_what_to_do():
    refuse_choices(SamplingParams(), "VLLMEngine")  # no choices: nothing to refuse
    with pytest.raises(ValueError, match="HF engine"):
        refuse_choices(SamplingParams(choices=CHOICES), "VLLMEngine")


def _reference(engine, messages, temperature: float) -> dict[str, list[float]]:
    """Each choice's per-token log-probs (its tokens, then EOS) after the prompt, from one plain forward pass per
    choice under ``log_softmax(logits / T)``: what the trainer computes for a completion."""
    tok = engine.tokenizer
    prompt = engine.encode_prompt(messages)
    out = {}
    model = engine.policy.model
    for choice in CHOICES:
        option = tok(choice, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + option])).logits[0].float()
        lps = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, -1)
        out[choice] = lps.gather(1, torch.tensor(option).unsqueeze(1)).squeeze(1).tolist()
    return out


def _restricted(ref: dict[str, list[float]], choice: str) -> float:
    """log q(choice) = log p(choice) - log sum_c p(c), from per-token reference log-probs."""
    return sum(ref[choice]) - float(torch.logsumexp(torch.tensor([sum(v) for v in ref.values()]), 0))


def test_greedy_choice_is_the_most_probable_whole_choice_with_the_trainers_logprobs(tiny_engine):
    tok = tiny_engine.tokenizer
    gen = tiny_engine.generate([GenerationRequest(messages=MESSAGES,
                                                  sampling=SamplingParams(choices=CHOICES, max_tokens=8))])[0]
    ref = _reference(tiny_engine, MESSAGES, 1.0)
    best = max(CHOICES, key=lambda c: sum(ref[c]))
    assert gen.text == best
    options = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in CHOICES]
    assert gen.completion_ids == options[CHOICES.index(best)] and gen.choice_ids == options
    assert gen.prompt_ids == tiny_engine.encode_prompt(MESSAGES)
    # the choice's log-probs among the choices: the log of the choices' total probability off the first token
    assert gen.logprobs[1:] == pytest.approx(ref[best][1:], abs=1e-4)
    assert sum(gen.logprobs) == pytest.approx(_restricted(ref, best), abs=1e-4)
    assert gen.finish_reason == "stop" and gen.logprobs_known


def test_sampled_choices_follow_the_choice_probabilities_at_the_temperature_and_repeat_by_seed(tiny_engine):
    temperature = 2.0
    ref = _reference(tiny_engine, MESSAGES, temperature)
    p = torch.softmax(torch.tensor([sum(ref[c]) for c in CHOICES]), 0)
    sampling = SamplingParams(choices=CHOICES, temperature=temperature, max_tokens=8)
    requests = [GenerationRequest(messages=MESSAGES, sampling=sampling, seed=s) for s in range(60)]
    gens = tiny_engine.generate(requests)
    for s, gen in enumerate(gens):
        # the draw is the inverse CDF of the seed's first uniform number over the choices' probabilities
        u = torch.rand(1, generator=torch.Generator().manual_seed(s)).item()
        assert gen.text == (CHOICES[0] if u * float(p.sum()) < float(p[0]) else CHOICES[1])
        assert sum(gen.logprobs) == pytest.approx(float(p[CHOICES.index(gen.text)].log()), abs=1e-4)
    assert [g.text for g in tiny_engine.generate(requests[:5])] == [g.text for g in gens[:5]]
    assert 0 < sum(g.text == CHOICES[0] for g in gens) < len(gens) or min(p) < 0.02


def test_a_choice_longer_than_the_token_budget_is_refused(tiny_engine):
    with pytest.raises(ValueError, match="max_tokens"):
        tiny_engine.generate([GenerationRequest(messages=MESSAGES,
                                                sampling=SamplingParams(choices=CHOICES, max_tokens=1))])


class Judge(dspy.Signature):
    """Check the proposed sum."""

    claim: str = dspy.InputField()
    verdict: Literal["correct", "incorrect"] = dspy.OutputField(desc="verdict")


def test_the_compact_adapter_names_a_literal_outputs_values_and_reads_one():
    adapter = CompactChatAdapter()
    assert adapter.choices(Judge) == CHOICES
    assert adapter.choices(dspy.Signature("claim -> verdict")) == ()  # str: free text
    assert adapter.choices(dspy.Signature("claim -> verdict, reason")) == ()  # sections, not one value
    messages = adapter.format(Judge, [], {"claim": "2 + 3 = 5"})
    assert messages[-1]["content"].endswith("Reply with only the verdict: correct or incorrect.")
    assert adapter.parse(Judge, "incorrect") == {"verdict": "incorrect"}


def test_a_literal_role_sends_choice_requests_and_a_str_role_does_not(fake_engine):
    engine = fake_engine(by_system={"Check the proposed solution": "incorrect", "": "def f():\n    return 1\n"})
    program = EvalOpt(dspy.Signature("task -> code"), rounds=1, choose_verdict=True)
    graph = trace(program, {"task": "return one"}, engine)
    assert graph.status == "ok"
    by_role = {c.role: c for c in graph.calls}
    judged = ["is it right?" in r.messages[0]["content"] for r in engine.calls]
    assert [r.sampling.choices for r in engine.calls] == [CHOICES if j else () for j in judged]
    assert sum(judged) == 1 and len(engine.calls) == 3  # the writer and the fixer write free text
    assert by_role["evaluator"].outputs == {"verdict": "incorrect"} and "optimizer" in by_role
    # the fake keeps the contract too: an answer outside the choices is a crash, not a silent pass
    bad = fake_engine(by_system={"Check the proposed solution": "maybe", "": "def f():\n    return 1\n"})
    assert trace(program, {"task": "return one"}, bad).status == "crash"


def test_evalopt_with_chosen_verdicts_on_the_tiny_model_always_decides(tiny_engine):
    program = EvalOpt(dspy.Signature("question -> answer"), rounds=2, choose_verdict=True)
    sampling = SamplingParams(temperature=1.0, max_tokens=6)
    for seed in range(3):
        graph = trace(program, {"question": "What is 2 + 3?"}, tiny_engine, sampling=sampling, seed=seed)
        verdicts = [c for c in graph.calls if c.role == "evaluator"]
        assert graph.status == "ok" and verdicts
        for call in verdicts:
            assert call.text in CHOICES and read_verdict(call.outputs["verdict"]) is not None
        # EvalOpt acted on each verdict: revised after a reject, stopped at an accept
        fixes = sum(c.role == "optimizer" for c in graph.calls)
        rejects = sum(c.outputs["verdict"] == "incorrect" for c in verdicts)
        assert fixes == rejects and (verdicts[-1].outputs["verdict"] == "correct" or len(verdicts) == 2)


def test_the_trainer_scores_a_choice_row_among_its_choices_with_the_gradient_through_every_choice(tiny_engine):
    """compilers.update: a choice row's log-probs sum to log q(c) (its alternatives scored in the same pack), equal
    to the engine's; a free-text row beside it is untouched; the normaliser carries gradient."""
    from compilers.packing import packed_logprobs
    from compilers.update import Row, _completion_logprobs, _part
    from compilers.distributed import SingleProcess

    tok = tiny_engine.tokenizer
    other = ({"role": "system", "content": "Check the sum."}, {"role": "user", "content": "2 + 3 = 6"})
    choose = SamplingParams(choices=CHOICES, temperature=1.0, max_tokens=8)
    gens = tiny_engine.generate([GenerationRequest(messages=m, sampling=choose, seed=s)
                                 for s, m in enumerate((MESSAGES, other, MESSAGES))])
    free = tok("maybe", add_special_tokens=False)["input_ids"]
    rows = [Row("a", "judge", tuple(g.prompt_ids), list(g.completion_ids), 1.0, choices=g.choice_ids) for g in gens]
    rows.append(Row("a", "judge", tuple(gens[0].prompt_ids), free, 1.0))
    part = _part(rows, 1 << 20, SingleProcess())
    assert sum(len(c) for _, c in part.groups) == 3 + 3 + 1  # each choice row brings its one alternative
    model = tiny_engine.policy.model
    got: dict[int, torch.Tensor] = {}
    for g, lps in enumerate(packed_logprobs(model, part.groups, temperature=1.0)):
        for i, t in zip(part.packs[g][1], _completion_logprobs(part, g, lps)):
            got[i] = t
    for i, g in enumerate(gens):
        ref = _reference(tiny_engine, (MESSAGES, other, MESSAGES)[i], 1.0)
        assert float(got[i].detach().sum()) == pytest.approx(_restricted(ref, g.text), abs=1e-4)
        assert got[i].detach().tolist() == pytest.approx(g.logprobs, abs=1e-4)  # engine == trainer: no mismatch
    prompt = list(gens[0].prompt_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + free])).logits[0].float()
    plain = torch.log_softmax(logits[len(prompt) - 1:-1], -1).gather(1, torch.tensor(free).unsqueeze(1)).squeeze(1)
    assert got[3].detach().tolist() == pytest.approx(plain.tolist(), abs=1e-4)
    # the gradient is log q's: the same as through an independent forward pass of every (prompt, choice)
    emb = model.get_input_embeddings().weight
    emb.requires_grad_(True)
    try:
        total = sum(t.sum() for g, lps in enumerate(packed_logprobs(model, part.groups, temperature=1.0))
                    for t in _completion_logprobs(part, g, lps))
        (grad,) = torch.autograd.grad(total, emb)
        want = 0.0
        for r in rows:
            def logp(completion):
                logits = model(input_ids=torch.tensor([list(r.prompt_ids) + completion])).logits[0].float()
                steps = torch.log_softmax(logits[len(r.prompt_ids) - 1:-1], -1)
                return steps.gather(1, torch.tensor(completion).unsqueeze(1)).sum()
            own = logp(r.completion_ids)
            want = want + (own - torch.logsumexp(torch.stack([logp(c) for c in r.choices]), 0) if r.choices else own)
        (ref_grad,) = torch.autograd.grad(want, emb)
        assert grad.abs().sum() > 0 and torch.allclose(grad, ref_grad, atol=1e-4, rtol=1e-3)
    finally:
        emb.requires_grad_(False)


def test_choices_for_rows_of_different_adapters_in_one_batch_equal_each_run_alone():
    """A batch mixing the base and an adapter (peft's per-row adapter path) scores each row as alone."""
    from peft import LoraConfig

    from wfc.engines.hf import HFEngine
    from wfc.models import load_model

    engine = HFEngine(load_model("tiny"), batch_wait_s=0.0)  # its own model: the adapter must not leak to others
    try:
        engine.policy.add_adapter("judge", LoraConfig(r=8, target_modules="all-linear"))
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in engine.policy.model.named_parameters():
                if "lora_A.judge." in name or "lora_B.judge." in name:  # seeded: the same adapter every run
                    p.copy_(torch.randn(p.shape, generator=gen) * 3.0)
        choose = SamplingParams(choices=CHOICES, max_tokens=8)
        mixed = [GenerationRequest(messages=MESSAGES, adapter=a, sampling=choose) for a in (None, "judge")]
        alone = [engine.generate([r])[0] for r in mixed]
        # the adapter is really applied (the tiny random model's distributions are near uniform: differences are
        # small, but ten times the tolerance the mixed batch is held to)
        assert alone[0].logprobs != pytest.approx(alone[1].logprobs, abs=2e-4)
        for got, want in zip(engine.generate(mixed), alone):
            assert got.text == want.text and got.logprobs == pytest.approx(want.logprobs, abs=2e-5)
    finally:
        engine.close()


def test_choices_of_different_lengths_for_one_repeated_prompt_score_as_each_row_alone(tiny_engine):
    # Regression: a batch of one prompt's repeats (a group, or pass@k's samples of one example) with choices of
    # unequal token lengths once put the shorter choices' padding between the prompt and the choice (the shared-
    # prefix layout), so their first token was scored from a padding column and one choice took all the mass.
    tok = tiny_engine.tokenizer
    choices = ("sports", "food", "weather", "music")
    lengths = [len(tok(c, add_special_tokens=False)["input_ids"]) for c in choices]
    assert len(set(lengths)) > 1  # the case under test: unequal lengths
    prompt = tiny_engine.encode_prompt(MESSAGES)
    assert len(prompt) > tiny_engine.min_shared_prefix and tiny_engine.share_prefill
    ref = []
    for choice in choices:
        option = tok(choice, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits = tiny_engine.policy.model(input_ids=torch.tensor([prompt + option])).logits[0].float()
        lps = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
        ref.append(float(lps.gather(1, torch.tensor(option).unsqueeze(1)).sum()))
    log_q = torch.log_softmax(torch.tensor(ref), 0)
    sampling = SamplingParams(choices=choices, temperature=1.0, max_tokens=8)
    gens = tiny_engine._generate_batch([GenerationRequest(messages=MESSAGES, sampling=sampling, seed=s)
                                        for s in range(4)], sampling)
    for gen in gens:
        assert sum(gen.logprobs) == pytest.approx(float(log_q[choices.index(gen.text)]), abs=1e-4)
