"""Hand-worked tables for compilers.advantages. Every expected value has its arithmetic in a comment."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from compilers.advantages import (
    ADVANTAGES,
    DEFAULT_EPS,
    GroupAdvantage,
    dr_grpo,
    get_estimator,
    group_advantages,
    grpo,
    mc_grpo,
    no_signal_rate,
    rloo,
)

# Table A, odd size: rewards [0, 0, 0, 0, 10]
#   mean = 10 / 5 = 2; deviations [-2, -2, -2, -2, 8]
#   population var = (4 * 4 + 64) / 5 = 80 / 5 = 16 -> std = 4
#   grpo (eps=0):  [-2/4]*4 + [8/4]                 = [-0.5, -0.5, -0.5, -0.5, 2.0]
#   dr_grpo:       deviations                        = [-2, -2, -2, -2, 8]
#   rloo:          0 - (10 / 4) = -2.5 ; 10 - (0 / 4) = 10   (check: 5/4 * -2 = -2.5, 5/4 * 8 = 10)
#   mc_grpo:       median of sorted [0,0,0,0,10] is 0 -> r - 0 = [0, 0, 0, 0, 10]
#   mc_grpo scale: [0, 0, 0, 0, 10 / 4 = 2.5]
ODD = [0.0, 0.0, 0.0, 0.0, 10.0]

# Table B, even size: rewards [1, 2, 4, 9]
#   mean = 16 / 4 = 4; deviations [-3, -2, 0, 5]
#   population var = (9 + 4 + 0 + 25) / 4 = 38 / 4 = 9.5 -> std = sqrt(9.5)
#   grpo (eps=0):  [-3, -2, 0, 5] / sqrt(9.5)
#   rloo:          1 - (2+4+9)/3 = 1 - 5 = -4
#                  2 - (1+4+9)/3 = 2 - 14/3 = -8/3
#                  4 - (1+2+9)/3 = 4 - 4 = 0
#                  9 - (1+2+4)/3 = 9 - 7/3 = 20/3
#   mc_grpo:       even size -> median = mean of middle two = (2 + 4) / 2 = 3 -> [-2, -1, 1, 6]
EVEN = [1.0, 2.0, 4.0, 9.0]

TABLE = [
    # (estimator, rewards, expected)
    (partial(grpo, eps=0.0), ODD, [-0.5, -0.5, -0.5, -0.5, 2.0]),
    (dr_grpo, ODD, [-2.0, -2.0, -2.0, -2.0, 8.0]),
    (rloo, ODD, [-2.5, -2.5, -2.5, -2.5, 10.0]),
    (mc_grpo, ODD, [0.0, 0.0, 0.0, 0.0, 10.0]),
    (partial(mc_grpo, scale=True, eps=0.0), ODD, [0.0, 0.0, 0.0, 0.0, 2.5]),
    (partial(grpo, eps=0.0), EVEN, [d / math.sqrt(9.5) for d in (-3.0, -2.0, 0.0, 5.0)]),
    (dr_grpo, EVEN, [-3.0, -2.0, 0.0, 5.0]),
    (rloo, EVEN, [-4.0, -8.0 / 3.0, 0.0, 20.0 / 3.0]),
    (mc_grpo, EVEN, [-2.0, -1.0, 1.0, 6.0]),
    # Pair [1, 3]: mean 2, pstd 1; grpo [-1, 1]; rloo [1-3, 3-1] = [-2, 2]; median 2 -> [-1, 1]
    (partial(grpo, eps=0.0), [1.0, 3.0], [-1.0, 1.0]),
    (rloo, [1.0, 3.0], [-2.0, 2.0]),
    (mc_grpo, [1.0, 3.0], [-1.0, 1.0]),
]


@pytest.mark.parametrize("estimator, rewards, expected", TABLE)
def test_hand_table(estimator, rewards, expected):
    assert estimator(rewards) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("estimator, rewards, expected", TABLE)
def test_tensor_input_matches_list(estimator, rewards, expected):
    assert estimator(torch.tensor(rewards, dtype=torch.float32)) == pytest.approx(expected, abs=1e-6)


def test_grpo_default_eps():
    # [1, 3]: (r - 2) / (1 + 1e-6) = +-1 / 1.000001
    assert DEFAULT_EPS == 1e-6
    assert grpo([1.0, 3.0]) == pytest.approx([-1 / 1.000001, 1 / 1.000001], abs=1e-15)


def test_grpo_uses_population_std_not_sample_std():
    # [0, 2]: pstd = 1 (divide by n=2); sample std would be sqrt(2). Advantages are +-1, not +-1/sqrt(2).
    assert grpo([0.0, 2.0], eps=0.0) == pytest.approx([-1.0, 1.0])


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
@pytest.mark.parametrize("rewards", [[0.1, 0.1, 0.1], [1.0], [0.0] * 8, [-3.0, -3.0]])
def test_zero_variance_gives_exact_zeros(name, rewards):
    # mean([0.1]*3) is 0.10000000000000002, so without the up-front check grpo would give ~1e-11, not 0.
    out = ADVANTAGES[name](rewards)
    assert out == [0.0] * len(rewards)
    assert all(type(a) is float for a in out)
    result = group_advantages(rewards, name)
    assert result == GroupAdvantage(advantages=[0.0] * len(rewards), no_signal=True)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rewards_raise(name, bad):
    with pytest.raises(ValueError, match="failure score"):
        ADVANTAGES[name]([1.0, bad, 0.0])
    with pytest.raises(ValueError, match="failure score"):
        group_advantages(torch.tensor([1.0, bad]), name)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_empty_group_raises(name):
    with pytest.raises(ValueError, match="empty"):
        ADVANTAGES[name]([])
    with pytest.raises(ValueError, match="empty"):
        ADVANTAGES[name](torch.tensor([]))


def test_bad_inputs():
    with pytest.raises(ValueError, match="1-D"):
        grpo(torch.zeros(2, 2))
    with pytest.raises(TypeError):
        grpo(["a", "b"])
    with pytest.raises(TypeError):
        grpo("12")
    with pytest.raises(ValueError, match="eps"):
        grpo([0.0, 1.0], eps=-1.0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_mean_baselines_sum_to_zero(name):
    assert sum(ADVANTAGES[name](EVEN)) == pytest.approx(0.0, abs=1e-12)


def test_order_and_ints_preserved():
    # ints are accepted; output follows input order: [9, 1] -> mean 5 -> [4, -4]
    assert dr_grpo([9, 1]) == [4.0, -4.0]


def test_registry_and_lookup():
    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "mc_grpo"}
    assert get_estimator("rloo") is rloo
    with pytest.raises(ValueError) as err:
        get_estimator("ppo")
    for name in ADVANTAGES:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="dr_grpo"):
        group_advantages([0.0, 1.0], "GRPO")


def test_group_advantages_with_signal():
    result = group_advantages([1.0, 3.0], "rloo")
    assert result == GroupAdvantage(advantages=[-2.0, 2.0], no_signal=False)
    # partial() binds options such as eps
    assert group_advantages([1.0, 3.0], partial(grpo, eps=0.0)).advantages == [-1.0, 1.0]
    with pytest.raises(Exception):
        result.no_signal = True  # frozen


def test_group_advantages_custom_callable_keeps_contracts():
    calls = []

    def always_one(rewards):
        calls.append(rewards)
        return [1.0] * len(rewards)

    # zero variance: zeros without calling the estimator
    assert group_advantages([2.0, 2.0], always_one) == GroupAdvantage([0.0, 0.0], True)
    assert calls == []
    assert group_advantages([1.0, 2.0], always_one).advantages == [1.0, 1.0]
    with pytest.raises(ValueError, match="2 advantages"):
        group_advantages([1.0, 2.0, 3.0], lambda r: [0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([1.0, 2.0], lambda r: [float("nan"), 0.0])


def test_no_signal_rate():
    groups = [
        group_advantages([1.0, 1.0], "grpo"),  # no signal
        group_advantages([5.0], "grpo"),  # group of one: no signal
        group_advantages([0.0, 1.0], "grpo"),  # signal
        group_advantages([0.0, 1.0, 1.0], "rloo"),  # signal
    ]
    assert no_signal_rate(groups) == 0.5  # 2 of 4
    assert no_signal_rate(iter(groups[2:])) == 0.0
    with pytest.raises(ValueError, match="at least one group"):
        no_signal_rate([])


def test_role_scales_hand_worked():
    from compilers.advantages import role_scales

    # voter: groups [0.5,-0.5] and [0,0] (flat, ignored): RMS 0.5 -> x2; judge: [0.1,-0.1,0.1,-0.1]: RMS 0.1 -> x10;
    # planner: only flat groups -> 1.0 (zeros stay zeros)
    scales = role_scales([("voter", [0.5, -0.5]), ("voter", [0.0, 0.0]), ("judge", [0.1, -0.1, 0.1, -0.1]),
                          ("planner", [0.0, 0.0])], eps=0.0)
    assert scales["voter"] == pytest.approx(2.0) and scales["judge"] == pytest.approx(10.0)
    assert scales["planner"] == 1.0
