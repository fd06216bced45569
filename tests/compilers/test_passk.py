"""compilers.passk: the mean pass@k on a table worked by hand, and sampled pass counts on a scripted engine (every
rollout sampled at the given temperature and limit, seeded per example and rollout)."""

from __future__ import annotations

import dspy
import pytest

from compilers.passk import mean_pass_at_k, sampled_passes
from wfc.tasks.math import math_metric

# (passing counts per example, n, k, mean pass@k): per example 1 - C(n-c, k) / C(n, k)
TABLE = [
    ([0], 16, 16, 0.0),
    ([1], 16, 16, 1.0),  # one pass in 16 samples: pass@16 is certain
    ([1], 16, 1, 1 / 16),
    ([1], 4, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    ([2], 5, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    ([2], 5, 1, 0.4),  # pass@1 is c/n
    ([0, 1, 2], 4, 2, (0 + 0.5 + 5 / 6) / 3),  # c=2: 1 - C(2,2)/C(4,2) = 5/6
    ([3, 4], 4, 4, 1.0),
]


@pytest.mark.parametrize("passes,n,k,expected", TABLE)
def test_mean_pass_at_k_on_a_hand_worked_table(passes, n, k, expected):
    assert mean_pass_at_k(passes, n, k) == pytest.approx(expected)


@pytest.mark.parametrize("passes,n,k", [([], 4, 1), ([5], 4, 1), ([1], 4, 5), ([1], 4, 0)])
def test_impossible_counts_are_refused(passes, n, k):
    with pytest.raises(ValueError):
        mean_pass_at_k(passes, n, k)


def test_sampled_passes_counts_passing_rollouts_per_example(fake_engine):
    requests = []

    def answer(request):
        requests.append(request)
        return "[[ ## answer ## ]]\n7" if request.seed % 2 else "[[ ## answer ## ]]\n0"

    program = dspy.Predict(dspy.Signature("question -> answer", "Answer with a number."))
    examples = [dspy.Example(question=f"q{i}", answer=gold).with_inputs("question") for i, gold in
                enumerate(("7", "0", "5"))]
    counts = sampled_passes(program, examples, fake_engine(answer), metric=math_metric, n=6, temperature=0.9,
                            max_tokens=11, seed=3)
    odd = [sum(r.seed % 2 for r in requests if f"q{i}" in r.messages[-1]["content"]) for i in range(3)]
    assert counts == [odd[0], 6 - odd[1], 0] and len(requests) == 18
    assert {(r.sampling.temperature, r.sampling.max_tokens, r.adapter) for r in requests} == {(0.9, 11, None)}
    again = []
    sampled_passes(program, examples, fake_engine(lambda r: again.append(r.seed) or "0"), metric=math_metric, n=6,
                   temperature=0.9, max_tokens=11, seed=3)
    assert sorted(again) == sorted(r.seed for r in requests)  # the same seeds for the same seed
    with pytest.raises(ValueError):
        sampled_passes(program, examples, fake_engine(answer), metric=math_metric, n=0, temperature=1.0,
                       max_tokens=4, seed=0)
