"""What the two vLLM test files share: the prompts, greedy settings and the engine-equivalence check."""

from __future__ import annotations

from wfc.engines.base import GenerationRequest, SamplingParams

LOGPROB_ATOL = 1e-4  # fp32 on both sides: different kernels, same math (measured ~1e-6 to 2e-6)
PROMPTS = [({"role": "user", "content": f"What is {a} plus {b}?"},) for a, b in [(1, 2), (7, 5), (12, 30), (4, 4)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


def requests(adapter=None, sampling=GREEDY):
    return [GenerationRequest(messages=m, adapter=adapter, sampling=sampling) for m in PROMPTS]


def assert_same(a, b):
    """Same prompt ids, completion ids and text, one log-prob per token, log-probs within LOGPROB_ATOL."""
    for x, y in zip(a, b, strict=True):
        assert x.prompt_ids == y.prompt_ids
        assert x.completion_ids == y.completion_ids and x.text == y.text
        assert len(x.logprobs) == len(x.completion_ids)
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) < LOGPROB_ATOL
